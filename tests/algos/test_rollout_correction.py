"""Rollout correction's math on the worked example (every number computed by hand).

Row A: 3 valid tokens, log π_rollout (−1.0, −0.5, −2.0), log π_train (−0.9, −0.7, −1.6), so
log r = (0.1, −0.2, 0.4). Row B: 2 valid tokens and 1 pad, log π_rollout (−0.3, −2.0), log π_train
(−0.3, −0.8), log r = (0.0, 1.2).
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from stages.algos.actor_loss import compute_actor_loss
from stages.algos.policy_loss_config import PolicyLossSettings, resolve_policy_loss_config
from stages.algos.policy_losses import compute_policy_loss_vanilla
from stages.algos.policy_losses_bypass import BYPASS_LOSSES, BypassLossSettings
from stages.algos.rollout_correction import (
    ROLLOUT_IS_MODES,
    ROLLOUT_RS_OPTIONS,
    RolloutCorrectionSettings,
    compute_rollout_correction,
    importance_weights,
    mismatch_metrics,
    parse_is_threshold,
    parse_rs_options,
    parse_rs_thresholds,
    rejection_mask,
    row_max,
)
from stages.config.schema_actor import ActorConfig

TRAIN = torch.tensor([[-0.9, -0.7, -1.6], [-0.3, -0.8, 0.0]])
ROLLOUT = torch.tensor([[-1.0, -0.5, -2.0], [-0.3, -2.0, 0.0]])
MASK = torch.tensor([[1, 1, 1], [1, 1, 0]])
LOG_RATIO = TRAIN - ROLLOUT  # (0.1, −0.2, 0.4 | 0.0, 1.2, pad)
A4 = {"abs": 1e-4}


def values(metrics) -> dict[str, float]:
    return {name: value.item() for name, value in metrics.items()}


# --- importance weights ------------------------------------------------------------------------


def test_token_tis_weights_and_metrics():
    weights, metrics = importance_weights(LOG_RATIO, MASK, "token", 2.0)
    expected = torch.tensor([[1.1052, 0.8187, 1.4918], [1.0, 2.0, 0.0]])  # 3.3201 clamped to 2
    torch.testing.assert_close(weights, expected, atol=1e-4, rtol=0)
    m = values(metrics)
    assert m["rollout_is_mean"] == pytest.approx(6.4157 / 5, **A4)  # 1.2831
    assert m["rollout_is_mean"] == pytest.approx(1.2831, **A4)
    assert m["rollout_is_ratio_fraction_high"] == pytest.approx(0.2)  # 3.3201 > 2
    assert m["rollout_is_ratio_fraction_low"] == pytest.approx(0.0)  # none below 1/2
    assert m["rollout_is_std"] == pytest.approx(0.4207, **A4)
    assert m["rollout_is_eff_sample_size"] == pytest.approx(0.9029, **A4)
    assert m["rollout_is_max"] == pytest.approx(2.0) and m["rollout_is_min"] == pytest.approx(
        0.8187, **A4
    )
    # per-row mean weights: A (1.1052 + 0.8187 + 1.4918) / 3 = 1.1386, B (1 + 2) / 2 = 1.5
    assert m["rollout_is_seq_mean"] == pytest.approx((1.1386 + 1.5) / 2, **A4)
    assert m["rollout_is_seq_max"] == pytest.approx(1.5) and m[
        "rollout_is_seq_min"
    ] == pytest.approx(1.1386, **A4)
    assert m["rollout_is_seq_max_deviation"] == pytest.approx(0.5)
    assert m["rollout_is_seq_std"] == pytest.approx(abs(1.5 - 1.1386) / math.sqrt(2), **A4)
    # raw row means: A 1.1386, B (1 + 3.3201) / 2 = 2.16 > 2
    assert m["rollout_is_seq_fraction_high"] == pytest.approx(0.5)
    assert "rollout_is_batch_norm_factor" not in m and "rollout_is_oob_ratio" not in m
    assert not weights.requires_grad


def test_token_tis_batch_normalized():
    weights, metrics = importance_weights(LOG_RATIO, MASK, "token", 2.0, batch_normalize=True)
    expected = torch.tensor([[0.8613, 0.6381, 1.1626], [0.7793, 1.5587, 0.0]])
    torch.testing.assert_close(weights, expected, atol=1e-4, rtol=0)
    assert metrics["rollout_is_batch_norm_factor"].item() == pytest.approx(1.2831, **A4)
    assert metrics["rollout_is_mean"].item() == pytest.approx(1.2831, **A4)  # taken before
    assert (weights * MASK).sum().item() / 5 == pytest.approx(1.0, **A4)


def test_sequence_tis_weights_normalized_over_rows():
    raw, _ = importance_weights(LOG_RATIO, MASK, "sequence", 2.0)
    # A: exp(0.1 − 0.2 + 0.4) = exp(0.3) = 1.3499; B: exp(1.2) = 3.3201 → clamped to 2.0
    torch.testing.assert_close(
        raw, torch.tensor([[1.3499, 1.3499, 1.3499], [2.0, 2.0, 0.0]]), atol=1e-4, rtol=0
    )
    weights, metrics = importance_weights(LOG_RATIO, MASK, "sequence", 2.0, batch_normalize=True)
    assert metrics["rollout_is_batch_norm_factor"].item() == pytest.approx(1.6749, **A4)
    torch.testing.assert_close(
        weights, torch.tensor([[0.8059, 0.8059, 0.8059], [1.1941, 1.1941, 0.0]]), atol=1e-4, rtol=0
    )
    m = values(metrics)
    assert m["rollout_is_max"] == pytest.approx(3.3201, **A4)  # the raw row weight
    assert m["rollout_is_min"] == pytest.approx(1.3499, **A4)
    assert m["rollout_is_ratio_fraction_high"] == pytest.approx(0.5)  # one row of two


def test_icepop_zeroes_the_weight_and_keeps_the_mask():
    mask = MASK.clone()
    weights, metrics = importance_weights(LOG_RATIO, mask, "token", parse_is_threshold("0.5_2.0"))
    assert weights[1, 1].item() == 0.0  # 3.32 is outside [0.5, 2.0]
    assert weights[0, 0].item() == pytest.approx(1.1052, **A4)
    assert torch.equal(mask, MASK)  # the mask is not touched
    assert metrics["rollout_is_oob_ratio"].item() == pytest.approx(0.2)


def test_weights_ignore_nan_padding_and_an_empty_batch_gives_nothing():
    poisoned = LOG_RATIO.clone()
    poisoned[1, 2] = float("nan")
    weights, metrics = importance_weights(poisoned, MASK, "sequence", 2.0)
    assert torch.isfinite(weights).all() and all(torch.isfinite(v) for v in metrics.values())
    empty = torch.zeros_like(MASK)
    weights, metrics = importance_weights(LOG_RATIO, empty, "token", 2.0)
    assert torch.equal(weights, torch.zeros(2, 3)) and metrics == {}


def test_is_modes_are_registry_entries():
    assert ROLLOUT_IS_MODES.names() == ["sequence", "token"]
    assert ROLLOUT_IS_MODES.get("sequence").sequence_level
    assert not ROLLOUT_IS_MODES.get("token").sequence_level


# --- rejection sampling ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("option", "threshold", "kept", "fraction", "seq_fraction"),
    [
        # k1 = −log r in [log 0.5, log 2] = [−0.6931, 0.6931]: B's second token (k1 −1.2) fails
        ("token_k1", "0.5_2.0", [[1, 1, 1], [1, 0, 0]], 0.2, 0.5),
        # row sums of k1: A −0.3 kept, B −1.2 rejected (both its tokens)
        ("seq_sum_k1", "0.5_2.0", [[1, 1, 1], [0, 0, 0]], 0.4, 0.5),
        # row means of k1: A −0.1, B −0.6, both outside [log 0.999, log 1.001]
        ("seq_mean_k1", "0.999_1.001", [[0, 0, 0], [0, 0, 0]], 1.0, 1.0),
        # row means of k3: A 0.0386 ≤ 0.05 kept, B 0.5601 rejected
        ("seq_mean_k3", "0.05", [[1, 1, 1], [0, 0, 0]], 0.4, 0.5),
    ],
)
def test_rejection_options(option, threshold, kept, fraction, seq_fraction):
    options = parse_rs_options(option)
    mask, metrics = rejection_mask(
        LOG_RATIO, MASK, options, parse_rs_thresholds(options, threshold)
    )
    assert mask.tolist() == kept and mask.dtype == MASK.dtype
    m = values(metrics)
    assert m["rollout_rs_masked_fraction"] == pytest.approx(fraction)
    assert m[f"rollout_rs_{option}_masked_fraction"] == pytest.approx(fraction)
    assert m["rollout_rs_seq_masked_fraction"] == pytest.approx(seq_fraction)
    assert m[f"rollout_rs_{option}_seq_masked_fraction"] == pytest.approx(seq_fraction)


def test_seq_mean_k3_statistics():
    _, metrics = rejection_mask(LOG_RATIO, MASK, ("seq_mean_k3",), (0.05,))
    m = values(metrics)
    # k3 per token: A (0.0051709, 0.0187308, 0.0918247), B (0, 1.1201169)
    assert m["rollout_rs_seq_mean_k3_seq_max"] == pytest.approx(0.5601, **A4)
    assert m["rollout_rs_seq_mean_k3_seq_min"] == pytest.approx(0.0386, **A4)
    assert m["rollout_rs_seq_mean_k3_max"] == pytest.approx(0.5601, **A4)  # a seq option: rows
    assert m["rollout_rs_seq_mean_k3_fraction_high"] == pytest.approx(0.5)
    assert m["rollout_rs_seq_mean_k3_fraction_low"] == 0.0  # no lower bound for k3
    # token-weighted mean of the row values: (3 · 0.038576 + 2 · 0.560058) / 5
    assert m["rollout_rs_seq_mean_k3_mean"] == pytest.approx(
        (3 * 0.038576 + 2 * 0.560058) / 5, **A4
    )
    assert "rollout_rs_seq_mean_k3_seq_fraction_low" not in m  # k1 options only


def test_every_listed_option_must_pass():
    options = parse_rs_options("token_k1,seq_mean_k3,token_k1")
    assert options == ("token_k1", "seq_mean_k3")  # the duplicate dropped
    mask, metrics = rejection_mask(
        LOG_RATIO, MASK, options, parse_rs_thresholds(options, "0.5_2.0,0.05")
    )
    assert mask.tolist() == [
        [1, 1, 1],
        [0, 0, 0],
    ]  # B fails seq_mean_k3 (and token_k1 on one token)
    assert metrics["rollout_rs_masked_fraction"].item() == pytest.approx(0.4)


def test_row_max_of_an_empty_row_is_zero():
    values_ = torch.tensor([[-3.0, -1.0], [5.0, 7.0]])
    mask = torch.tensor([[True, True], [False, False]])
    assert row_max(values_, mask).tolist() == [-1.0, 0.0]


def test_rs_options_are_registry_entries():
    assert ROLLOUT_RS_OPTIONS.names() == sorted(
        [f"{level}_{k}" for level in ("token", "seq_sum", "seq_mean") for k in ("k1", "k2", "k3")]
        + ["seq_max_k2", "seq_max_k3"]
    )
    assert ROLLOUT_RS_OPTIONS.get("seq_sum_k1").two_sided
    assert not ROLLOUT_RS_OPTIONS.get("token_k3").two_sided
    assert not ROLLOUT_RS_OPTIONS.get("token_k2").sequence_level


# --- thresholds --------------------------------------------------------------------------------


def test_threshold_forms():
    assert parse_is_threshold(2) == 2.0 and parse_is_threshold("0.5_2.0") == (0.5, 2.0)
    both = ("token_k1", "seq_max_k2")
    assert parse_rs_thresholds(both, "4") == ((0.25, 4.0), 4.0)  # broadcast; a bare u: (1/u, u)
    assert parse_rs_thresholds(both, "0.2_5,0.1") == ((0.2, 5.0), 0.1)
    with pytest.raises(ValueError, match="'seq_max_k2' takes one upper bound"):
        parse_rs_thresholds(both, "0.2_5")
    with pytest.raises(ValueError, match="3 thresholds for 2 options"):
        parse_rs_thresholds(both, "1,2,3")
    with pytest.raises(ValueError, match="required with rollout_rs"):
        parse_rs_thresholds(both, None)
    with pytest.raises(ValueError, match=r"lower bound 2\.0 is above the upper bound 0\.5"):
        parse_is_threshold("2_0.5")
    with pytest.raises(ValueError, match="got 'token_k4'"):
        parse_rs_options("token_k1,token_k4")


# --- mismatch metrics --------------------------------------------------------------------------


def test_mismatch_metrics():
    m = values(mismatch_metrics(TRAIN, ROLLOUT, MASK))
    assert m["kl"] == pytest.approx(-1.5 / 5, **A4)
    assert m["k3_kl"] == pytest.approx(0.2472, **A4)
    assert m["training_ppl"] == pytest.approx(2.3195, **A4)
    assert m["training_log_ppl"] == pytest.approx(0.8083, **A4)
    assert m["rollout_ppl"] == pytest.approx(3.1847, **A4)
    assert m["rollout_log_ppl"] == pytest.approx(1.1583, **A4)
    # per row: A −0.1, B −0.6
    assert m["log_ppl_diff"] == pytest.approx(-0.35, **A4)
    assert m["log_ppl_abs_diff"] == pytest.approx(0.35, **A4)
    assert m["log_ppl_diff_max"] == pytest.approx(-0.1, **A4)
    assert m["log_ppl_diff_min"] == pytest.approx(-0.6, **A4)
    assert m["ppl_ratio"] == pytest.approx(0.7268, **A4)
    assert m["chi2_token"] == pytest.approx(2.2281, **A4)
    assert m["chi2_seq"] == pytest.approx(5.4226, **A4)


def test_an_empty_row_does_not_enter_the_sequence_statistics():
    train = torch.cat([TRAIN, torch.full((1, 3), -5.0)])
    rollout = torch.cat([ROLLOUT, torch.full((1, 3), -1.0)])
    mask = torch.cat([MASK, torch.zeros(1, 3, dtype=MASK.dtype)])
    assert values(mismatch_metrics(train, rollout, mask)) == pytest.approx(
        values(mismatch_metrics(TRAIN, ROLLOUT, MASK))
    )


def test_compute_rollout_correction_prefixes_and_combines():
    settings = RolloutCorrectionSettings.resolve(
        {"rollout_is": "token", "rollout_rs": "token_k1", "rollout_rs_threshold": "0.5_2.0"}
    )
    out = compute_rollout_correction(TRAIN, ROLLOUT, MASK, settings)
    assert out.response_mask.tolist() == [[1, 1, 1], [1, 0, 0]]
    assert out.weights[1, 1].item() == pytest.approx(2.0)  # weights on the original mask
    assert out.metrics["rollout_corr/kl"].item() == pytest.approx(-0.3, **A4)
    assert all(name.startswith("rollout_corr/") for name in out.metrics)
    nothing = compute_rollout_correction(TRAIN, ROLLOUT, MASK, None)  # the defaults: metrics only
    assert nothing.weights is None and nothing.response_mask is MASK
    assert not any("rollout_is" in n or "rollout_rs" in n for n in nothing.metrics)


# --- the losses ---------------------------------------------------------------------------------


ADV = torch.tensor([[1.0, 1.0, 1.0], [2.0, 2.0, 2.0]])


def test_actor_loss_multiplies_the_per_token_loss_by_the_weights():
    """vanilla at ratio 1: per-token loss −A; × the token TIS weights; token-mean over 5 tokens."""
    weights, _ = importance_weights(LOG_RATIO, MASK, "token", 2.0)
    logp = TRAIN.clone().requires_grad_(True)
    loss, _ = compute_actor_loss(logp, TRAIN, ADV, MASK, {}, rollout_is_weights=weights)
    by_hand = -(1.1052 + 0.8187 + 1.4918 + 2 * 1.0 + 2 * 2.0) / 5  # −1.8831
    assert loss.item() == pytest.approx(by_hand, **A4)
    unweighted, _ = compute_actor_loss(logp, TRAIN, ADV, MASK, {})
    assert unweighted.item() == pytest.approx(-(3 + 4) / 5)


def test_bypass_reinforce_by_hand():
    """−A · log π_θ · w with w the token TIS weights of π_θ (= TRAIN) against the rollout."""
    correction = RolloutCorrectionSettings.resolve(
        {"rollout_is": "token", "loss_type": "reinforce"}
    )
    logp = TRAIN.clone().requires_grad_(True)
    loss, metrics = compute_actor_loss(
        logp, ROLLOUT, ADV, MASK, {"loss_agg_mode": "token-sum"}, rollout_correction=correction
    )
    w = [1.1052, 0.8187, 1.4918, 1.0, 2.0]
    lp = [-0.9, -0.7, -1.6, -0.3, -0.8]
    a = [1, 1, 1, 2, 2]
    assert loss.item() == pytest.approx(-sum(x * y * z for x, y, z in zip(a, lp, w)), **A4)
    loss.backward()
    # the gradient is −A · w (w detached): no gradient through the weights
    expected = torch.tensor([[-1.1052, -0.8187, -1.4918], [-2.0, -4.0, 0.0]])
    torch.testing.assert_close(logp.grad, expected, atol=1e-4, rtol=0)
    assert metrics["actor/ppo_kl"].item() == pytest.approx(-0.3, **A4)  # mean(rollout − π_θ)
    assert metrics["actor/pg_clipfrac"].item() == 0.0
    assert metrics["rollout_corr/rollout_is_mean"].item() == pytest.approx(1.2831, **A4)


def test_bypass_ppo_clip_is_vanilla_on_the_rejection_mask_without_weights():
    correction = RolloutCorrectionSettings.resolve(
        {"rollout_is": "token", "rollout_rs": "token_k1", "rollout_rs_threshold": "0.5_2.0"}
    )
    logp = TRAIN.clone().requires_grad_(True)
    loss, metrics = compute_actor_loss(logp, ROLLOUT, ADV, MASK, {}, rollout_correction=correction)
    kept = torch.tensor([[1, 1, 1], [1, 0, 0]])
    vanilla, _ = compute_policy_loss_vanilla(ROLLOUT, TRAIN, ADV, kept, "token-mean", {})
    assert loss.item() == pytest.approx(vanilla.item())
    assert metrics["rollout_corr/rollout_rs_masked_fraction"].item() == pytest.approx(0.2)
    assert "rollout_corr/rollout_is_mean" in metrics  # the weights feed the metrics only


def test_bypass_losses_read_what_they_declare():
    """As tests/algos/test_registry_specs.py checks POLICY_LOSSES, for BYPASS_LOSSES."""
    fields = {f.name for f in dataclasses.fields(PolicyLossSettings)}

    class Recording(BypassLossSettings):
        def __getattribute__(self, name: str):
            if name in fields:
                object.__getattribute__(self, "__dict__").setdefault("_read", set()).add(name)
            return object.__getattribute__(self, name)

    base = BypassLossSettings.of(
        PolicyLossSettings.from_actor(ActorConfig()), RolloutCorrectionSettings.resolve(None)
    )
    assert BYPASS_LOSSES.names() == ["ppo_clip", "reinforce"]
    for name in BYPASS_LOSSES.names():
        spec = BYPASS_LOSSES.get(name)
        settings = Recording(**{f.name: getattr(base, f.name) for f in dataclasses.fields(base)})
        spec.fn(ROLLOUT, TRAIN, ADV, MASK, "token-mean", settings)
        read = settings.__dict__.get("_read", set()) - {
            "loss_agg_mode",
            "loss_mode",
            "global_batch_info",
        }
        assert read == set(spec.reads), name


def test_a_verl_config_carries_the_correction_under_policy_loss():
    verl_style = {
        "policy_loss": {
            "rollout_correction": {"rollout_rs": "token_k1", "rollout_rs_threshold": 2.0}
        }
    }
    loss, metrics = BYPASS_LOSSES.get("ppo_clip").fn(
        ROLLOUT, TRAIN, ADV, MASK, "token-mean", verl_style
    )
    kept = torch.tensor([[1, 1, 1], [1, 0, 0]])  # token_k1 with (1/2, 2)
    vanilla, _ = compute_policy_loss_vanilla(ROLLOUT, TRAIN, ADV, kept, "token-mean", {})
    assert loss.item() == pytest.approx(vanilla.item())
    assert metrics["rollout_corr/rollout_rs_masked_fraction"].item() == pytest.approx(0.2)
    assert resolve_policy_loss_config(verl_style).loss_mode == "vanilla"
