"""Step reports: keys Prefect accepts and two runs do not share, the validation score and the
run directory in the markdown, and the keyed artifact as the server stores it."""

from __future__ import annotations

import pytest
from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import ArtifactCreate
from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey
from prefect.runtime import flow_run

from flows.runs.store import StageRecord
from flows.sinks.step_report import flow_run_tag, publish_step_report, report_key, step_markdown
from flows.step_flow import StepFlow

RECORDS = [
    StageRecord("rollout", "ran", "cache miss", timing_s=1.25),
    StageRecord("reward", "cached", "cache hit | same inputs", timing_s=0.01),
]
METRICS = {
    "critic/score/mean": 0.375,
    "timing_s/step": 2.0,
    "val-core/demo/reward/mean@1": 0.4142,
    "val-aux/demo/acc/std@1": 0.5,
}


@pytest.mark.parametrize(
    ("experiment", "expected"),
    [
        ("grpo-tiny", "grpo-tiny-0a1b2c3d-step-000003"),
        ("GRPO_Tiny.v2", "grpo-tiny-v2-0a1b2c3d-step-000003"),
        ("  qwen2.5 / gsm8k  ", "qwen2-5-gsm8k-0a1b2c3d-step-000003"),
        ("Ünïcode—run", "n-code-run-0a1b2c3d-step-000003"),
        ("___", "0a1b2c3d-step-000003"),
        ("x" * 60 + "-y", "x" * 40 + "-0a1b2c3d-step-000003"),
        ("a" * 39 + "-b", "a" * 39 + "-0a1b2c3d-step-000003"),  # no dash left dangling at the cut
    ],
)
def test_report_keys_are_valid_prefect_artifact_keys(experiment, expected):
    key = report_key(experiment, "0a1b2c3d", 3)
    assert key == expected
    assert ArtifactCreate(key=key).key == key  # Prefect's own validator accepts it


def test_keys_differ_between_runs_and_between_steps():
    keys = {
        report_key("grpo-tiny", tag, step) for tag in ("0a1b2c3d", "9f8e7d6c") for step in (1, 2)
    }
    assert len(keys) == 4


def test_a_runs_keys_sort_by_name_in_step_order():
    steps = [1, 2, 9, 10, 25, 100, 200, 1000]
    keys = [report_key("grpo-tiny", "0a1b2c3d", step) for step in steps]
    assert sorted(keys) == keys


def test_the_mlflow_run_is_a_link_on_a_server_and_for_a_local_store():
    server = step_markdown(1, RECORDS, METRICS, "abc", tracking_uri="http://mlflow:5000")
    assert "- MLflow run: [abc](http://mlflow:5000/#/runs/abc)" in server.splitlines()
    local = step_markdown(1, RECORDS, METRICS, "abc", tracking_uri="sqlite:////r/mlflow.db")
    assert "[abc](http://127.0.0.1:5000/#/runs/abc) (served by `mlflow server" in local
    assert "MLflow run:" not in step_markdown(1, RECORDS, METRICS, None, tracking_uri="http://m")


def test_markdown_holds_run_dir_validation_score_and_val_core_metrics():
    text = step_markdown(4, RECORDS, METRICS, "run-abc", run_dir="/runs/grpo-1", val_score=0.4142)
    lines = text.splitlines()
    assert lines[0] == "### Step 4 (MLflow run `run-abc`)"
    assert "- run directory: `/runs/grpo-1`" in lines
    assert "- validation score: **0.4142**" in lines
    assert "| reward | cached | cache hit / same inputs | 0.01 |" in lines  # no stray column
    assert "| val-core/demo/reward/mean@1 | 0.4142 |" in lines
    assert not any("val-aux" in line for line in lines)


def test_markdown_of_a_step_without_validation_has_no_score_line():
    text = step_markdown(3, RECORDS, {"timing_s/step": 2.0}, run_dir="/runs/grpo-1")
    assert "validation score" not in text and "- run directory: `/runs/grpo-1`" in text


def test_flow_run_tag_is_empty_outside_a_flow_run():
    assert flow_run_tag() == ""


def _publish_two_steps(experiment: str) -> tuple[str, str]:
    tag = flow_run_tag()
    for step, score in ((1, None), (2, 0.5)):
        key = report_key(experiment, tag, step)
        publish_step_report(
            step, RECORDS, METRICS, None, key=key, run_dir="/runs/r", val_score=score
        )
    return str(flow_run.id), tag


publishing_flow = StepFlow(fn=_publish_two_steps, name="test-reports", persist_result=False)


@pytest.mark.usefixtures("prefect_harness")
def test_two_runs_publish_keyed_reports_that_do_not_overwrite_each_other():
    first_id, first_tag = publishing_flow("Report Test")
    second_id, second_tag = publishing_flow("Report Test")
    assert first_tag == first_id.replace("-", "")[:8] and first_tag != second_tag
    keys = [
        report_key("Report Test", tag, step) for tag in (first_tag, second_tag) for step in (1, 2)
    ]
    with get_client(sync_client=True) as client:
        stored = client.read_artifacts(
            artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=keys))
        )
    by_key = {artifact.key: artifact for artifact in stored}
    assert sorted(by_key) == sorted(keys) and len(stored) == 4  # one version per key
    assert {str(by_key[key].flow_run_id) for key in keys[:2]} == {first_id}
    assert {str(by_key[key].flow_run_id) for key in keys[2:]} == {second_id}
    step_2 = by_key[report_key("Report Test", second_tag, 2)]
    assert step_2.type == "markdown" and "- validation score: **0.5**" in step_2.data
    assert "- run directory: `/runs/r`" in step_2.data
    assert "validation score" not in by_key[report_key("Report Test", second_tag, 1)].data
