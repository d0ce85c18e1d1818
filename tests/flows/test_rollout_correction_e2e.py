"""End to end: a tiny decoupled-mode training with token IS weights runs and logs the
``rollout_corr/*`` metrics (the demo task and the tiny model, 2 steps)."""

from __future__ import annotations

from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from dataproto.artifact import load_artifact
from flows.runs.store import RunStore
from flows.train import train
from stages.metrics.catalog import step_metric_names
from stages.metrics.naming import sanitize_metric_name

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("prefect_harness")]

REPO = Path(__file__).resolve().parents[2]


def test_token_is_weights_two_steps(tmp_path, make_demo_inputs, tiny_run_overrides):
    demo = make_demo_inputs(tmp_path / "demo")
    result = train(
        REPO / "configs" / "demo-cpu.yaml",
        tiny_run_overrides(
            demo,
            tmp_path,
            2,
            "algorithm.rollout_correction.bypass_mode=false",  # the hf rollout's default is bypass
            "algorithm.rollout_correction.rollout_is=token",
            "trainer.val_before_train=false",
        ),
        str(tmp_path / "run"),
    )
    assert result.steps == 2 and len(result.history) == 2
    store = RunStore(result.run_dir)
    for step in (1, 2):
        journal = store.read_journal(step)
        assert [journal.record(s).status for s in ("rollout_correction", "rollout_is")] == [
            "ran",
            "ran",
        ]
        assert journal.record("rollout_rs").status == "skipped"
        weights = load_artifact(store.artifact_path(step, "rollout_is")).batch["rollout_is_weights"]
        assert weights.shape[0] == 8 and (weights >= 0).all() and (weights <= 2.0).all()
    expected = [
        name
        for name in step_metric_names(
            use_critic=False,
            use_reference_policy=False,
            balance_batch=True,
            use_kl_in_reward=False,
            use_kl_loss=False,
            rollout_correction=True,
            rollout_is=True,
        )
        if name.startswith("rollout_corr/")
    ]
    assert "rollout_corr/rollout_is_mean" in expected and "rollout_corr/kl" in expected
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path}/mlflow.db")
    for name in expected:
        for row in result.history:
            assert name in row, name
        logged = client.get_metric_history(result.mlflow_run_id, sanitize_metric_name(name))
        assert [m.step for m in logged] == [1, 2], name
    # the hf rollout's log-probs are the actor's own before the update: weights ≈ 1
    for row in result.history:
        assert row["rollout_corr/rollout_is_mean"] == pytest.approx(1.0, abs=1e-2)
        assert abs(row["rollout_corr/kl"]) < 1e-2
