"""The health checks (stages/health): each trips on the fault it is for, planted in a step, and
stays quiet on the same step without it; the monitor's actions, thresholds and reporting."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from dataproto import DataProto
from stages.health.checks import HEALTH_CHECKS, StepView, first_non_finite, rollout_agreement
from stages.health.monitor import HealthMonitor, explain_health_stop, stop_error
from stages.metrics.signal import batch_signal_metrics

B, R = 4, 3

#: a healthy step's metrics, as the train flow logs them
HEALTHY = {
    "signal/zero_adv_sample_frac": 0.5,
    "signal/response_samples": 4.0,
    "signal/multi_sample_groups": 2.0,
    "signal/zero_reward_spread_group_frac": 0.5,
    "critic/score/max": 1.0,
    "critic/score/min": 0.0,
    "actor/entropy": 1.4,
    "response_length/clip_ratio": 0.25,
    "actor/kl_loss": 0.02,
    "rollout/weight_sync/probed": 5.0,
    "rollout/weight_sync/mismatched": 0.0,
}


def step_batch(**tensors: torch.Tensor) -> DataProto:
    """A finished step's batch: two groups of two, 3 response tokens, the last one padding in
    row 0."""
    mask = torch.ones(B, R, dtype=torch.int64)
    mask[0, 2] = 0
    log_probs = -torch.arange(B * R, dtype=torch.float32).reshape(B, R) / 10
    batch = {
        "responses": torch.arange(B * R).reshape(B, R),
        "response_mask": mask,
        "advantages": torch.tensor([[0.5] * R, [-0.5] * R, [0.0] * R, [0.0] * R]),
        "old_log_probs": log_probs,
        "rollout_log_probs": log_probs.clone(),
        "seq_scores": torch.tensor([1.0, 0.0, 0.5, 0.5]),
        **tensors,
    }
    return DataProto.from_dict(batch, non_tensors={"uid": np.array(["a", "a", "b", "b"])})


def view(metrics=None, batch=None, step=3, first=False) -> StepView:
    producers = {"advantages": "advantage", "old_log_probs": "old_log_prob"}
    return StepView(step, {**HEALTHY, **(metrics or {})}, batch or step_batch(), producers, first)


def trip(name: str, step_view: StepView, threshold: float | None = None) -> str | None:
    check = HEALTH_CHECKS.get(name)
    assert check.missing(step_view) is None
    return check.trip(step_view, check.threshold if threshold is None else threshold)


def test_a_healthy_step_trips_no_check():
    healthy = view(first=True)
    for name in HEALTH_CHECKS.names():
        assert trip(name, healthy) is None, name


def test_the_healthy_steps_signal_metrics_are_the_flows():
    """HEALTHY's signal metrics are what the step batch gives (the fixture is consistent)."""
    got = batch_signal_metrics(step_batch(), 1)
    for name in ("signal/zero_adv_sample_frac", "signal/zero_reward_spread_group_frac"):
        assert got[name] == HEALTHY[name]


def test_a_nan_planted_in_a_response_token_names_the_stage_key_and_row():
    advantages = step_batch().batch["advantages"].clone()
    advantages[2, 1] = float("nan")
    line = trip("non_finite", view(batch=step_batch(advantages=advantages)))
    assert line == (
        "step 3: 1 NaN/Inf value(s) in 'advantages' written by the advantage stage, first at row 2"
    )


def test_a_nan_under_the_padding_is_not_a_fault_and_an_inf_anywhere_else_is():
    advantages = step_batch().batch["advantages"].clone()
    advantages[0, 2] = float("nan")  # row 0's padding token
    assert trip("non_finite", view(batch=step_batch(advantages=advantages))) is None
    scores = torch.tensor([1.0, float("inf"), 0.5, 0.5])  # (B,): every row counts
    line = trip("non_finite", view(batch=step_batch(seq_scores=scores)))
    assert "'seq_scores' written by the step input, first at row 1" in line
    assert first_non_finite(view(batch=step_batch(seq_scores=scores))) == ("seq_scores", 1, 1)


def test_a_threshold_tolerates_that_many_non_finite_values():
    old = step_batch().batch["old_log_probs"].clone()
    old[1, 0] = old[3, 1] = float("-inf")
    assert "2 NaN/Inf" in trip("non_finite", view(batch=step_batch(old_log_probs=old)))
    assert trip("non_finite", view(batch=step_batch(old_log_probs=old)), threshold=2) is None


def test_no_learning_signal_trips_when_every_advantage_is_zero():
    metrics = {"signal/zero_adv_sample_frac": 1.0, "signal/zero_reward_spread_group_frac": 1.0}
    line = trip("no_learning_signal", view(metrics))
    assert line.startswith("step 3 has no learning signal: all 4 samples have advantage 0")
    assert trip("no_learning_signal", view(metrics), threshold=1.01) is None


def test_reward_all_equal_trips_on_a_scorer_that_gives_one_score():
    line = trip("reward_all_equal", view({"critic/score/max": 0.3, "critic/score/min": 0.3}))
    assert (
        line
        == "step 3: every sample scored 0.3 — the scorer does not tell this step's responses apart"
    )
    near = {"critic/score/max": 0.31, "critic/score/min": 0.3}
    assert trip("reward_all_equal", view(near)) is None
    assert "scored 0.3–0.31" in trip("reward_all_equal", view(near), threshold=0.05)


def test_entropy_collapse_trips_below_its_threshold():
    assert "entropy fell to 0.004" in trip("entropy_collapse", view({"actor/entropy": 0.004}))
    assert trip("entropy_collapse", view({"actor/entropy": 0.02})) is None


def test_response_clipping_trips_on_the_length_exploit():
    """The demo's copy-scorer exploit: 99 % of the responses at the 16-token budget."""
    line = trip("response_clipping", view({"response_length/clip_ratio": 0.99}))
    assert line.startswith("step 3: 99% of the responses end at the response budget (≥ 90%)")
    assert trip("response_clipping", view({"response_length/clip_ratio": 0.5})) is None


def test_kl_blowup_reads_whichever_kl_the_run_has():
    assert "(actor/kl_loss) is 3.5" in trip("kl_blowup", view({"actor/kl_loss": 3.5}))
    in_reward = {"actor/reward_kl_penalty": 1.5}
    only_reward = view(in_reward)
    only_reward = StepView(
        3, {k: v for k, v in only_reward.metrics.items() if k != "actor/kl_loss"}, only_reward.batch
    )
    assert "(actor/reward_kl_penalty) is 1.5" in trip("kl_blowup", only_reward)
    neither = StepView(3, {k: v for k, v in HEALTHY.items() if k != "actor/kl_loss"}, step_batch())
    assert HEALTH_CHECKS.get("kl_blowup").missing(neither) == (
        "the run logs no actor/kl_loss or actor/reward_kl_penalty"
    )


def test_weight_sync_trips_when_a_probed_tensor_did_not_take():
    stale = {"rollout/weight_sync/mismatched": 2.0}
    assert trip("weight_sync", view(stale)) == (
        "step 3: the rollout engine does not hold the weights it was just sent: 2 of 5 probed "
        "tensors (the normalisation weights) differ after the sync, so its rollouts come from "
        "older weights"
    )
    assert HEALTH_CHECKS.get("weight_sync").action == "stop"


def test_first_step_agreement_trips_on_a_rollout_at_another_temperature():
    """The rollout sampled at temperature 2 but reported its log-probs as if at 1 — the kind of
    mismatch a wrong sampling setting gives — against the trainer's log-probs at 1."""
    torch.manual_seed(0)
    logits = torch.randn(B, R, 16)
    tokens = logits.argmax(-1, keepdim=True)
    trainer = torch.log_softmax(logits, -1).gather(-1, tokens).squeeze(-1)
    rollout = torch.log_softmax(logits / 2, -1).gather(-1, tokens).squeeze(-1)
    batch = step_batch(old_log_probs=trainer, rollout_log_probs=rollout)
    kl, largest = rollout_agreement(batch)
    mask = batch.batch["response_mask"].bool()
    delta = (trainer - rollout)[mask].double()
    assert kl == pytest.approx(float((delta.exp() - 1 - delta).mean()))
    assert largest == pytest.approx(float(delta.abs().max()))
    line = trip("first_step_agreement", view(batch=batch, step=1, first=True))
    assert f"k3 KL {kl:.4g} (> 0.01), max |Δ| {largest:.4g}" in line
    matched = step_batch(old_log_probs=trainer, rollout_log_probs=trainer + 1e-5)
    assert trip("first_step_agreement", view(batch=matched, step=1, first=True)) is None


def config(health=None, bypass_mode=False):
    return SimpleNamespace(
        ppoflow=SimpleNamespace(health=health or {}),
        algorithm=SimpleNamespace(rollout_correction=SimpleNamespace(bypass_mode=bypass_mode)),
    )


def setting(action=None, threshold=None):
    return SimpleNamespace(action=action, threshold=threshold)


def test_the_monitor_warns_when_a_check_starts_tripping_and_logs_its_metric_every_step():
    monitor = HealthMonitor(config())
    clipped = {"response_length/clip_ratio": 0.95}
    outcomes = [
        monitor.check(view(m, step=s, first=s == 1))
        for s, m in enumerate([clipped, clipped, {}, clipped], start=1)
    ]
    assert [o.metrics["health/response_clipping"] for o in outcomes] == [1.0, 1.0, 0.0, 1.0]
    assert [len(o.warnings) for o in outcomes] == [1, 0, 0, 1]  # said again after a quiet step
    assert outcomes[0].warnings[0].startswith("health check response_clipping: step 1: 95%")
    assert "health/first_step_agreement" in outcomes[0].metrics
    assert "health/first_step_agreement" not in outcomes[1].metrics  # the first step only
    assert all(o.stop is None for o in outcomes)


def test_a_stop_check_gives_the_stop_line_and_off_runs_nothing():
    monitor = HealthMonitor(
        config({"entropy_collapse": setting("stop"), "response_clipping": setting("off")})
    )
    outcome = monitor.check(view({"actor/entropy": 0.001, "response_length/clip_ratio": 1.0}))
    assert outcome.stop.startswith("health check entropy_collapse: step 3:")
    assert outcome.warnings == [] and "health/response_clipping" not in outcome.metrics
    error = stop_error(outcome.stop, 3)
    assert explain_health_stop(error) == (
        f"{outcome.stop} — the run stopped after step 3; fix the cause and resume from the last "
        "checkpoint, or set ppoflow.health.entropy_collapse.action=warn to train on"
    )
    assert explain_health_stop(ValueError("x")) is None


def test_the_default_action_of_non_finite_is_stop():
    advantages = step_batch().batch["advantages"].clone()
    advantages[1, 1] = float("nan")
    outcome = HealthMonitor(config()).check(view(batch=step_batch(advantages=advantages)))
    assert outcome.stop.startswith("health check non_finite: step 3: 1 NaN/Inf")


def test_a_configured_threshold_replaces_the_default():
    monitor = HealthMonitor(config({"entropy_collapse": setting(threshold=2.0)}))
    assert monitor.check(view()).metrics["health/entropy_collapse"] == 1.0  # 1.4 < 2.0


def test_a_check_that_cannot_run_is_said_once_and_as_a_warning_only_when_configured():
    metrics = {k: v for k, v in HEALTHY.items() if not k.startswith(("actor/kl", "rollout/"))}
    monitor = HealthMonitor(config({"kl_blowup": setting(threshold=0.5)}, bypass_mode=True))
    first = monitor.check(StepView(1, metrics, step_batch(), first=True))
    assert first.not_run_configured == {
        "kl_blowup": "the run logs no actor/kl_loss or actor/reward_kl_penalty"
    }
    assert first.not_run == {
        "first_step_agreement": "algorithm.rollout_correction.bypass_mode is true: the old "
        "log-probs are the rollout's own, not recomputed by the trainer",
        "weight_sync": "the run logs no rollout/weight_sync/mismatched, rollout/weight_sync/probed",
    }
    assert "health/kl_blowup" not in first.metrics
    later = monitor.check(StepView(2, metrics, step_batch()))
    assert later.not_run == {} and later.not_run_configured == {}


def test_a_nan_metric_is_nothing_to_judge_not_a_trip():
    """signal/zero_adv_sample_frac is NaN when no sample has a response token (0/0)."""
    outcome = HealthMonitor(config()).check(view({"signal/zero_adv_sample_frac": math.nan}))
    assert "health/no_learning_signal" not in outcome.metrics and outcome.warnings == []
    assert outcome.not_run == {}


def test_the_plugin_check_of_the_docs_is_configured_and_trips(tmp_path):
    """docs/health.md's "Writing a check" block, as a ppoflow.plugins module, in a fresh
    interpreter (the registry is process-wide): selectable by name, run with its threshold."""
    import re
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    docs = (repo / "docs" / "health.md").read_text(encoding="utf-8")
    (block,) = re.findall(r"```python\n(.*?)```", docs, flags=re.S)
    (tmp_path / "short_check.py").write_text(block, encoding="utf-8")
    code = f"""
import torch
from dataproto import DataProto
from stages.config import load_config
from stages.health.checks import StepView
from stages.health.monitor import HealthMonitor
config = load_config({str(repo / "configs" / "demo-cpu.yaml")!r},
                     ["ppoflow.plugins=[short_check]", "ppoflow.health.too_short.action=stop"])
view = StepView(4, {{"response_length/mean": 1.5}}, DataProto.from_dict({{"x": torch.zeros(1)}}))
print(HealthMonitor(config).check(view).stop)
"""
    env = {"PYTHONPATH": f"{tmp_path}:{repo}", "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "health check too_short: step 4: responses average 1.5 tokens"
