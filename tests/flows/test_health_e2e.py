"""Health checks in a training (stages/health): a planted fault stops the run after the step is
saved and logged, with one line; a healthy decoupled run's first step passes the rollout/trainer
agreement check (HF rollout, fp32: the same log-probs)."""

from __future__ import annotations

from pathlib import Path

import pytest

from flows.cli.error_lines import explain
from flows.runs.store import RunStore
from flows.train import train
from stages.health.monitor import HealthCheckStop

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("prefect_harness")]

REPO = Path(__file__).resolve().parents[2]
CONSTANT_SCORER = (
    "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n    return 0.5\n"
)


def test_a_scorer_that_gives_one_score_stops_the_run_after_the_step(
    tmp_path, make_demo_inputs, tiny_run_overrides
):
    demo = make_demo_inputs(tmp_path / "demo")
    scorer = tmp_path / "constant.py"
    scorer.write_text(CONSTANT_SCORER, encoding="utf-8")
    overrides = tiny_run_overrides(
        demo,
        tmp_path,
        3,
        f"reward.custom_reward_function.path={scorer}",
        "ppoflow.health.reward_all_equal.action=stop",
        "trainer.val_before_train=false",
    )
    with pytest.raises(HealthCheckStop) as stopped:
        train(REPO / "configs" / "demo-cpu.yaml", overrides, str(tmp_path / "run"))
    line = explain(stopped.value)
    assert line == (
        "health check reward_all_equal: step 1: every sample scored 0.5 — the scorer does not "
        "tell this step's responses apart — the run stopped after step 1; fix the cause and "
        "resume from the last checkpoint, or set ppoflow.health.reward_all_equal.action=warn to "
        "train on"
    )
    store = RunStore(str(tmp_path / "run"))
    journal = store.read_journal(1)  # the step is kept, its metrics with it
    assert journal.status == "done"
    assert journal.metrics["health/reward_all_equal"] == 1.0
    assert journal.metrics["health/no_learning_signal"] == 1.0  # warned, not stopped
    assert not (Path(store.root) / store.step_dir(2)).exists()


def test_the_first_step_of_a_decoupled_hf_run_passes_the_agreement_check(
    tmp_path, make_demo_inputs, tiny_run_overrides
):
    demo = make_demo_inputs(tmp_path / "demo")
    overrides = tiny_run_overrides(
        demo,
        tmp_path,
        2,
        "algorithm.rollout_correction.bypass_mode=false",  # the trainer recomputes old log-probs
        "trainer.val_before_train=false",
    )
    result = train(REPO / "configs" / "demo-cpu.yaml", overrides, str(tmp_path / "run"))
    first, second = result.history
    assert first["health/first_step_agreement"] == 0.0
    assert "health/first_step_agreement" not in second
    for name in ("non_finite", "reward_all_equal", "entropy_collapse"):
        assert first[f"health/{name}"] == second[f"health/{name}"] == 0.0, name
    assert "health/kl_blowup" not in first  # no reference in the demo: nothing to judge
