"""Where a step's runs sit in Prefect: train_step's ``run_step.fn`` runs the stage tasks in the
training flow run itself (task runs ``<stage>-step<k>``, no flow run per step); ``run_step``
called as a flow inside a flow run is a subflow run ``step-<k>`` (what bench/prefect_subflow.py
measures against it)."""

from __future__ import annotations

from dataclasses import replace
from uuid import UUID

import pytest
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterParentFlowRunId
from prefect.runtime import flow_run, task_run

from flows.runs.store import RunStore
from flows.step_flow import StepFlow, run_step

pytestmark = pytest.mark.usefixtures("prefect_harness")

WEIGHTS = {"score": "weights-v0"}
ENABLED = ("produce", "double", "score", "total")


def recording(stages, seen: list[tuple[str, str, str]]):
    """The stages, each recording (stage, flow run name, task run name) when it runs."""

    def wrap(stage):
        def fn(batch, ctx):
            seen.append((stage.name, flow_run.name, task_run.name))
            return stage.fn(batch, ctx)

        return replace(stage, fn=fn)

    return [wrap(stage) for stage in stages]


def _two_steps(stages, batch, ctx, store, as_subflow: bool) -> tuple[str, str]:
    """Two steps, every stage computed, called as train_step calls them (``run_step.fn``) or
    as subflows; the parent run's id and name."""
    call = run_step if as_subflow else run_step.fn
    for step in (1, 2):
        refresh = [stage.name for stage in stages]
        call(stages, batch, ctx, store, step, weights_fingerprints=WEIGHTS, refresh=refresh)
    return str(flow_run.id), flow_run.name


parent_flow = StepFlow(fn=_two_steps, name="test-step-runs", persist_result=False)


def child_runs(parent_id: str) -> list:
    parent = FlowRunFilterParentFlowRunId(any_=[UUID(parent_id)])
    with get_client(sync_client=True) as client:
        return client.read_flow_runs(flow_run_filter=FlowRunFilter(parent_flow_run_id=parent))


def test_train_steps_run_their_stage_tasks_in_the_training_flow_run(
    tmp_path, toy_stages, toy_batch, toy_ctx
):
    seen: list[tuple[str, str, str]] = []
    store = RunStore(tmp_path / "run", cache_dir=tmp_path / "cache")
    parent_id, parent_name = parent_flow(
        recording(toy_stages, seen), toy_batch, toy_ctx, store, False
    )
    assert seen == [(name, parent_name, f"{name}-step{k}") for k in (1, 2) for name in ENABLED]
    assert child_runs(parent_id) == []


def test_as_a_flow_inside_a_flow_run_each_step_is_a_subflow_run_step_k(
    tmp_path, toy_stages, toy_batch, toy_ctx
):
    seen: list[tuple[str, str, str]] = []
    store = RunStore(tmp_path / "run", cache_dir=tmp_path / "cache")
    parent_id, _ = parent_flow(recording(toy_stages, seen), toy_batch, toy_ctx, store, True)
    assert seen == [(name, f"step-{k}", f"{name}-step{k}") for k in (1, 2) for name in ENABLED]
    children = sorted(child_runs(parent_id), key=lambda child: child.name)
    assert [child.name for child in children] == ["step-1", "step-2"]
    with get_client(sync_client=True) as client:
        for k, child in enumerate(children, 1):
            assert child.state.is_completed() and child.parameters["step"] == k
            tracker = client.read_task_run(child.parent_task_run_id)
            assert str(tracker.flow_run_id) == parent_id  # the step's node in the parent
            assert child.parameters["batch"].startswith("DataProto(rows=4")


def _name_only(config, overrides=(), run_dir=None) -> str:
    return flow_run.name


def test_the_training_flow_run_is_named_after_its_run_directory(monkeypatch):
    import flows.train as train_module

    named = StepFlow(
        fn=_name_only,
        name="test-run-names",
        flow_run_name=train_module.training_run_name,
        validate_parameters=False,
        persist_result=False,
    )
    assert named("configs/demo-cpu.yaml", run_dir="/runs/grpo-tiny-20261205-1/") == (
        "grpo-tiny-20261205-1"
    )
    assert named("configs/demo-agent-cpu.yaml") == "train-demo-agent-cpu"
    assert named(object()) == "ppo-train"
    opened = ("ignored", type("Run", (), {"store": type("S", (), {"root": "/x/opened-7"})}))
    monkeypatch.setattr(
        train_module, "current_startup", lambda: type("Startup", (), {"opened": opened})
    )
    assert named("configs/demo-cpu.yaml") == "opened-7", "the run the command line opened"


def _step_twice(stages, batch, ctx, store) -> None:
    """Step 1 computed, then step 1 again from the cache."""
    refresh = [stage.name for stage in stages]
    run_step.fn(stages, batch, ctx, store, 1, weights_fingerprints=WEIGHTS, refresh=refresh)
    run_step.fn(stages, batch, ctx, store, 1, weights_fingerprints=WEIGHTS)


twice_flow = StepFlow(fn=_step_twice, name="test-cached-names", persist_result=False)


def test_a_cached_stage_task_run_says_so_in_its_name(
    tmp_path, toy_stages, toy_batch, toy_ctx, monkeypatch
):
    """The task a stage is called through is named for what the cache holds (Prefect's own
    harness records no task runs, so the names are read from the tasks called)."""
    import flows.stage_task as stage_task_module

    called: list[tuple[str, str]] = []
    real = stage_task_module.stage_task

    def recording_task(stage, cache_dir, retries=0, refresh=False, cached=False):
        made = real(stage, cache_dir, retries, refresh, cached)
        called.append((made.task_run_name.format(step=1), "refresh" if refresh else "cache"))
        return made

    monkeypatch.setattr(stage_task_module, "stage_task", recording_task)
    store = RunStore(tmp_path / "run", cache_dir=tmp_path / "cache")
    twice_flow(toy_stages, toy_batch, toy_ctx, store)
    computed = [(f"{name}-step1", "refresh") for name in ENABLED]
    cached = [(f"{name}-step1 (cached)", "cache") for name in ENABLED]
    assert called == computed + cached
