"""End to end on the tiny model and the demo task: the train flow, its artifacts and MLflow.

Tiny sizes (4 prompts × n 2, 8 response tokens) keep each run to a few seconds of model work;
most of the time is engine start-up and Prefect.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from mlflow.tracking import MlflowClient
from prefect.client.orchestration import get_client

from dataproto.artifact import load_artifact
from flows.runs.store import RunStore
from flows.train import train
from stages.metrics.naming import sanitize_metric_name

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("prefect_harness")]

REPO = Path(__file__).resolve().parents[2]
ALWAYS = ["rollout", "balance", "reward", "old_log_prob", "advantage", "update_actor"]


def all_artifacts(page: int = 100) -> list:
    """Every artifact on the Prefect server, page by page: one read returns at most the server's
    default limit, in no particular order, and the session's server holds every slow test's."""
    found: list = []
    with get_client(sync_client=True) as client:
        while batch := client.read_artifacts(limit=page, offset=len(found)):
            found += batch
    return found


@pytest.fixture(scope="module")
def demo_inputs(tmp_path_factory, make_demo_inputs) -> Path:
    return make_demo_inputs(tmp_path_factory.mktemp("demo"))


def logged(tmp_path: Path, run_id: str, name: str) -> list[float]:
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path}/mlflow.db")
    return [m.value for m in client.get_metric_history(run_id, sanitize_metric_name(name))]


def assert_artifacts(run_dir: str, step: int, present: list[str], absent: list[str]) -> None:
    store = RunStore(run_dir)
    journal = store.read_journal(step)
    assert journal.status == "done"
    for stage in present:
        assert (Path(store.artifact_path(step, stage)) / "manifest.json").is_file(), stage
        assert journal.record(stage).status == "ran"
    for stage in absent:
        assert not Path(store.artifact_path(step, stage)).exists(), stage
        assert journal.record(stage).status == "skipped"


def test_grpo_three_steps(demo_inputs, tmp_path, tiny_run_overrides):
    result = train(
        REPO / "configs" / "demo-cpu.yaml",
        tiny_run_overrides(demo_inputs, tmp_path, 3),
        str(tmp_path / "run"),
    )
    assert result.steps == 3 and len(result.history) == 3
    for step in (1, 2, 3):
        assert_artifacts(result.run_dir, step, ALWAYS, ["ref_log_prob", "values", "update_critic"])
    for name in ("critic/score/mean", "actor/pg_loss", "timing_s/step", "response_length/mean"):
        assert len(logged(tmp_path, result.mlflow_run_id, name)) == 3, name
    assert len(logged(tmp_path, result.mlflow_run_id, "timing_s/gen")) == 3
    assert result.val_before is not None and result.val_after is not None
    assert (tmp_path / "checkpoints" / "global_step_3" / "actor").is_dir()
    assert (tmp_path / "checkpoints" / "latest_checkpointed_iteration.txt").read_text() == "3"
    reports = [a.data for a in all_artifacts() if a.data and result.mlflow_run_id in a.data]
    assert len(reports) == 3 and all("| update_actor | ran |" in report for report in reports)


def test_ppo_with_critic_kl_in_reward_and_kl_loss(demo_inputs, tmp_path, tiny_run_overrides):
    result = train(
        REPO / "configs" / "demo-cpu.yaml",
        tiny_run_overrides(
            demo_inputs,
            tmp_path,
            2,
            "algorithm.adv_estimator=gae",
            "algorithm.use_kl_in_reward=true",
            "actor_rollout_ref.actor.use_kl_loss=true",
            "trainer.val_before_train=false",
        ),
        str(tmp_path / "run"),
    )
    everything = [*ALWAYS, "ref_log_prob", "values", "update_critic"]
    for step in (1, 2):
        assert_artifacts(result.run_dir, step, everything, [])
    run_id = result.mlflow_run_id
    assert len(logged(tmp_path, run_id, "critic/vf_loss")) == 2
    assert len(logged(tmp_path, run_id, "critic/vf_explained_var")) == 2
    assert len(logged(tmp_path, run_id, "actor/reward_kl_penalty")) == 2
    assert len(logged(tmp_path, run_id, "actor/kl_loss")) == 2
    coeffs = logged(tmp_path, run_id, "actor/reward_kl_penalty_coeff")
    assert coeffs == [pytest.approx(0.001)] * 2  # the fixed controller's β
    assert (tmp_path / "checkpoints" / "global_step_2" / "critic").is_dir()


def test_resume_continues_like_an_uninterrupted_run(demo_inputs, tmp_path, tiny_run_overrides):
    """Run A: 3 steps, a checkpoint every step (keep the last 2). Run B resumes from A's step-2
    checkpoint (resume_mode auto on a copy) and runs step 3: same batch, same numbers."""
    common = ("trainer.val_before_train=false", "trainer.test_freq=0", "trainer.save_freq=1")
    first = train(
        REPO / "configs" / "demo-cpu.yaml",
        [
            *tiny_run_overrides(demo_inputs, tmp_path / "a", 3, *common),
            "trainer.max_actor_ckpt_to_keep=2",
        ],
        str(tmp_path / "a" / "run"),
    )
    assert sorted(p.name for p in (tmp_path / "a" / "checkpoints").glob("global_step_*")) == [
        "global_step_2",
        "global_step_3",
    ]
    resumed_root = tmp_path / "b" / "checkpoints"
    shutil.copytree(
        tmp_path / "a" / "checkpoints" / "global_step_2", resumed_root / "global_step_2"
    )
    (resumed_root / "latest_checkpointed_iteration.txt").write_text("2")
    second = train(
        REPO / "configs" / "demo-cpu.yaml",
        [*tiny_run_overrides(demo_inputs, tmp_path / "b", 3, *common), "trainer.resume_mode=auto"],
        str(tmp_path / "b" / "run"),
    )
    assert len(second.history) == 1 and second.history[0]["training/global_step"] == 3.0
    expected, got = first.history[2], second.history[0]
    for name in ("critic/score/mean", "actor/pg_loss", "actor/grad_norm", "actor/ppo_kl"):
        assert got[name] == pytest.approx(expected[name], rel=1e-6, abs=1e-7), name
    a, b = RunStore(first.run_dir), RunStore(second.run_dir)
    responses = [load_artifact(s.artifact_path(3, "rollout")).batch["responses"] for s in (a, b)]
    assert torch.equal(*responses)
