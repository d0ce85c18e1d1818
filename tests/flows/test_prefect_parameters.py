"""Flow parameters as the Prefect UI shows them: the train flow's config as its source or a
one-line summary, overrides and run_dir as given; the flow run record holds the summaries."""

from __future__ import annotations

from uuid import UUID

import pytest
from prefect.client.orchestration import get_client
from prefect.runtime import flow_run

from flows.step_flow import StepFlow, describe_config, describe_parameter, describe_source
from flows.train import train
from stages.config import load_config

OVERRIDES = ["trainer.total_training_steps=2", "trainer.test_freq=1"]


@pytest.fixture(scope="module")
def demo_config():
    return load_config("configs/demo-cpu.yaml", OVERRIDES)


def test_train_parameters_of_a_cli_run_are_readable(demo_config, tmp_path):
    shown = train.serialize_parameters(
        {"config": demo_config, "overrides": [], "run_dir": str(tmp_path)}
    )
    assert shown == {
        "config": "PPORunConfig(experiment=grpo-tiny, estimator=grpo, steps=2, "
        "model=outputs/demo/model)",
        "overrides": [],
        "run_dir": str(tmp_path),
    }


def test_train_parameters_of_a_deployment_run_are_kept_as_given():
    shown = train.serialize_parameters(
        {"config": "demo-cpu", "overrides": OVERRIDES, "run_dir": None}
    )
    assert shown == {"config": "demo-cpu", "overrides": OVERRIDES, "run_dir": None}


def test_config_summary_follows_the_config(demo_config):
    other = load_config(
        "configs/demo-cpu.yaml",
        ["algorithm.adv_estimator=rloo", "trainer.total_training_steps=7", "trainer.test_freq=1"],
    )
    assert "estimator=rloo" in describe_config(other) and "steps=7" in describe_config(other)
    assert describe_parameter(demo_config) == describe_config(demo_config)


def test_source_line_names_the_config_and_counts_overrides(demo_config):
    assert describe_source("demo-cpu", OVERRIDES) == "demo-cpu + 2 overrides"
    assert describe_source(demo_config, None) == describe_config(demo_config)


def test_lists_mappings_and_callables():
    assert describe_parameter(("a=1", 2, None)) == ["a=1", 2, None]
    assert describe_parameter([]) == []
    assert describe_parameter([object()]) == "<list>"
    assert describe_parameter({"rollout": "fp1"}) == {"rollout": "fp1"}
    assert describe_parameter(test_lists_mappings_and_callables) == (
        "<test_lists_mappings_and_callables>"
    )


def _echo(config, overrides=(), run_dir=None) -> str:
    return str(flow_run.id)


@pytest.mark.usefixtures("prefect_harness")
def test_the_flow_run_record_holds_the_summaries(demo_config):
    flow = StepFlow(fn=_echo, name="test-parameters", persist_result=False)
    flow_run_id = flow(demo_config, OVERRIDES, "/runs/x")
    with get_client(sync_client=True) as client:
        parameters = client.read_flow_run(UUID(flow_run_id)).parameters
    assert parameters == {
        "config": describe_config(demo_config),
        "overrides": OVERRIDES,
        "run_dir": "/runs/x",
    }
