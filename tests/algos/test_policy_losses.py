"""Policy losses: fact-sheet numbers, hand cases per loss, config reading, errors, mask invariance."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from types import SimpleNamespace

import pytest
import torch
from pydantic import BaseModel
from torch.testing import assert_close

from stages.algos.aggregation import GlobalBatchInfo
from stages.algos.policy_loss_config import (
    POLICY_LOSSES,
    PolicyLossSettings,
    resolve_policy_loss_config,
)
from stages.algos.policy_losses import (
    compute_policy_loss_cispo,
    compute_policy_loss_geo_mean,
    compute_policy_loss_gpg,
    compute_policy_loss_gspo,
    compute_policy_loss_sapo,
    compute_policy_loss_vanilla,
    get_policy_loss_fn,
)
from stages.config.schema_actor import ActorConfig

F64 = torch.float64
ASYM = {"clip_ratio": 0.2, "clip_ratio_high": 0.28}


def t(rows: list[list[float]]) -> torch.Tensor:
    return torch.tensor(rows, dtype=F64)


def _fact_sheet_inputs() -> tuple[torch.Tensor, ...]:
    old = torch.zeros(1, 4, dtype=F64)
    log_prob = torch.log(t([[0.5, 1.5, 5.0, 1.0]]))
    return old, log_prob, t([[1.0, 1.0, -1.0, -1.0]]), torch.ones(1, 4)


# --- vanilla ---------------------------------------------------------------------------------


def test_vanilla_fact_sheet_example() -> None:
    old, log_prob, adv, mask = _fact_sheet_inputs()
    loss, metrics = compute_policy_loss_vanilla(old, log_prob, adv, mask, "token-mean", ASYM)
    assert loss.item() == pytest.approx(0.555)
    assert metrics["actor/pg_clipfrac"].item() == pytest.approx(0.25)
    assert metrics["actor/pg_clipfrac_lower"].item() == pytest.approx(0.25)
    assert metrics["actor/ppo_kl"].item() == pytest.approx(-float(log_prob.mean()))
    # per-token losses (−0.5, −1.28, 3, 1): token-sum shows them through their sum, and token 3 alone
    token_sum, _ = compute_policy_loss_vanilla(old, log_prob, adv, mask, "token-sum", ASYM)
    assert token_sum.item() == pytest.approx(-0.5 - 1.28 + 3 + 1)
    only_third = torch.tensor([[0, 0, 1, 0]])
    assert compute_policy_loss_vanilla(old, log_prob, adv, only_third, "token-sum", ASYM)[
        0
    ].item() == pytest.approx(3)


def test_vanilla_metrics_are_detached_tensors() -> None:
    old, log_prob, adv, mask = _fact_sheet_inputs()
    _, metrics = compute_policy_loss_vanilla(
        old, log_prob.requires_grad_(True), adv, mask, "token-mean", ASYM
    )
    assert set(metrics) == {"actor/pg_clipfrac", "actor/pg_clipfrac_lower", "actor/ppo_kl"}
    assert all(
        isinstance(v, torch.Tensor) and v.dim() == 0 and not v.requires_grad
        for v in metrics.values()
    )


def test_vanilla_clip_ratio_fallback_and_symmetric_clip() -> None:
    old, log_prob, adv, mask = _fact_sheet_inputs()
    loss, _ = compute_policy_loss_vanilla(
        old, log_prob, adv, mask, "token-sum", {"clip_ratio": 0.2}
    )
    assert loss.item() == pytest.approx(-0.5 - 1.2 + 3 + 1)
    loss, _ = compute_policy_loss_vanilla(
        old, log_prob, adv, mask, "token-sum", {"clip_ratio_c": 10.0}
    )
    assert loss.item() == pytest.approx(-0.5 - 1.2 + 5 + 1)


def test_vanilla_clipfrac_is_strict() -> None:
    # r exactly at 1 + ε: L2 == L1, not counted as clipped
    old, mask = torch.zeros(1, 1, dtype=F64), torch.ones(1, 1)
    _, metrics = compute_policy_loss_vanilla(
        old, torch.log(t([[1.25]])), t([[1.0]]), mask, "token-mean", {"clip_ratio": 0.25}
    )
    assert metrics["actor/pg_clipfrac"].item() == 0.0


def test_vanilla_clamps_log_ratio_at_20() -> None:
    old, mask = torch.zeros(1, 1, dtype=F64), torch.ones(1, 1)
    loss, metrics = compute_policy_loss_vanilla(
        old, t([[50.0]]), t([[1.0]]), mask, "token-mean", {"clip_ratio": 0.2}
    )
    assert loss.item() == pytest.approx(-1.2)
    assert metrics["actor/ppo_kl"].item() == pytest.approx(-20.0)


@pytest.mark.parametrize("c", [1.0, 0.5, -3.0])
def test_dual_clip_bound_must_exceed_one(c: float) -> None:
    old, log_prob, adv, mask = _fact_sheet_inputs()
    with pytest.raises(ValueError, match=rf"clip_ratio_c must be > 1.*got {c}"):
        compute_policy_loss_vanilla(old, log_prob, adv, mask, "token-mean", {"clip_ratio_c": c})


def test_rollout_is_weights_multiply_token_losses() -> None:
    old, log_prob, adv, mask = _fact_sheet_inputs()
    weights = t([[2.0, 0.0, 1.0, 0.5]])
    loss, _ = compute_policy_loss_vanilla(
        old, log_prob, adv, mask, "token-sum", ASYM, rollout_is_weights=weights
    )
    assert loss.item() == pytest.approx(-1.0 + 0 + 3 + 0.5)


def test_global_info_argument_overrides_config() -> None:
    old, log_prob, adv, mask = _fact_sheet_inputs()
    cfg = {**ASYM, "global_batch_info": {"dp_size": 1, "batch_num_tokens": 8}}
    from_config, _ = compute_policy_loss_vanilla(old, log_prob, adv, mask, "token-mean", cfg)
    assert from_config.item() == pytest.approx(2.22 / 8)
    explicit, _ = compute_policy_loss_vanilla(
        old, log_prob, adv, mask, "token-mean", cfg, global_batch_info=GlobalBatchInfo(2, 16)
    )
    assert explicit.item() == pytest.approx(2.22 / 16 * 2)


# --- other losses ------------------------------------------------------------------------------


def test_gspo_uses_sequence_ratio_and_given_mode() -> None:
    # row log-ratios (0.1, 0.3) → s = 0.2, ratio e^0.2 = 1.2214 on both tokens; ε = 0.2 → clipped 1.2
    old = torch.zeros(1, 2, dtype=F64)
    log_prob = t([[0.1, 0.3]]).requires_grad_(True)
    adv, mask = t([[1.0, 1.0]]), torch.ones(1, 2)
    loss, metrics = compute_policy_loss_gspo(
        old, log_prob, adv, mask, "token-sum", {"clip_ratio": 0.2}
    )
    assert loss.item() == pytest.approx(-2.4)
    assert metrics["actor/pg_clipfrac"].item() == 1.0
    assert metrics["actor/pg_clipfrac_lower"].item() == 0.0
    # unclipped (ε large): value −2·e^0.2 and gradient −e^0.2 per token (ratio value s, gradient of logp)
    loss, _ = compute_policy_loss_gspo(old, log_prob, adv, mask, "token-sum", {"clip_ratio": 5.0})
    loss.backward()
    assert loss.item() == pytest.approx(-2 * math.exp(0.2))
    assert_close(log_prob.grad, torch.full((1, 2), -math.exp(0.2), dtype=F64))
    mean_loss, _ = compute_policy_loss_gspo(
        old, log_prob, adv, mask, "token-mean", {"clip_ratio": 5.0}
    )
    assert mean_loss.item() == pytest.approx(-math.exp(0.2))


def test_gspo_exponent_clamped_at_10() -> None:
    old, mask = torch.zeros(1, 1, dtype=F64), torch.ones(1, 1)
    loss, _ = compute_policy_loss_gspo(
        old, t([[30.0]]), t([[-1.0]]), mask, "token-mean", {"clip_ratio": 0.2}
    )
    assert loss.item() == pytest.approx(math.exp(10.0))


def test_sapo_gate_values_and_fixed_mode() -> None:
    # r = 1: gate = sigmoid(0)·4/τ = 2/τ; A=+1 → −2/1.0, A=−1 → +2/1.05
    old, log_prob = torch.zeros(2, 1, dtype=F64), torch.zeros(2, 1, dtype=F64)
    adv, mask = t([[1.0], [-1.0]]), torch.ones(2, 1)
    loss, metrics = compute_policy_loss_sapo(old, log_prob, adv, mask, "token-sum", None)
    assert loss.item() == pytest.approx(
        (-2.0 + 2.0 / 1.05) / 2
    )  # seq-mean-token-mean whatever is asked
    assert metrics["actor/pg_clipfrac"].item() == 0.0
    loss, _ = compute_policy_loss_sapo(
        old, log_prob, adv, mask, "token-mean", {"tau_pos": 2.0, "tau_neg": 4.0}
    )
    assert loss.item() == pytest.approx((-1.0 + 0.5) / 2)


def test_sapo_gate_gradient_matches_sigmoid_derivative() -> None:
    old = torch.zeros(1, 1, dtype=F64)
    log_prob = torch.tensor([[math.log(1.5)]], dtype=F64, requires_grad=True)
    loss, _ = compute_policy_loss_sapo(
        old, log_prob, t([[1.0]]), torch.ones(1, 1), "token-mean", None
    )
    loss.backward()
    s = 1 / (1 + math.exp(-0.5))
    # d/dlogp of −sigmoid(r−1)·4 = −4·s(1−s)·r
    assert log_prob.grad.item() == pytest.approx(-4 * s * (1 - s) * 1.5)


def test_gpg_is_plain_policy_gradient() -> None:
    log_prob = t([[-1.0, -2.0]]).requires_grad_(True)
    loss, metrics = compute_policy_loss_gpg(
        torch.zeros(1, 2), log_prob, t([[2.0, -1.0]]), torch.ones(1, 2)
    )
    loss.backward()
    assert loss.item() == pytest.approx((2.0 - 2.0) / 2)
    assert_close(log_prob.grad, t([[-1.0, 0.5]]))
    assert metrics == {}


def test_cispo_stop_gradient_weight() -> None:
    old = torch.zeros(1, 2, dtype=F64)
    log_prob = torch.log(t([[2.0, 1.1]])).requires_grad_(True)
    adv, mask = t([[1.0, 1.0]]), torch.ones(1, 2)
    loss, metrics = compute_policy_loss_cispo(
        old, log_prob, adv, mask, "token-sum", {"clip_ratio": 0.2}
    )
    loss.backward()
    assert loss.item() == pytest.approx(-1.2 * math.log(2.0) - 1.1 * math.log(1.1))
    assert_close(log_prob.grad, t([[-1.2, -1.1]]))
    assert metrics["actor/pg_clipfrac"].item() == 0.5


def test_geo_mean_sequence_ratio_and_plain_mean() -> None:
    # row 0: A=+1, log r (0.5, 0.1) → clipped to (0.28, 0.1), ratio e^0.19; row 1: A=−1, log r (−0.5, 0)
    # → sign-aware clip (−0.2, 0), ratio e^−0.1. loss = mean(−1·e^0.19, +1·e^−0.1)
    old = torch.zeros(2, 2, dtype=F64)
    log_prob = t([[0.5, 0.1], [-0.5, 0.0]])
    adv, mask = t([[1.0, 1.0], [-1.0, -1.0]]), torch.ones(2, 2)
    loss, metrics = compute_policy_loss_geo_mean(old, log_prob, adv, mask, "token-sum", ASYM)
    assert loss.item() == pytest.approx((-math.exp(0.19) + math.exp(-0.1)) / 2)
    assert metrics["actor/pg_clipfrac"].item() == pytest.approx(0.25)
    assert metrics["actor/pg_clipfrac_lower"].item() == pytest.approx(0.25)


# --- registry and config -----------------------------------------------------------------------


def test_registry_names() -> None:
    expected = {"vanilla", "gspo", "sapo", "gpg", "clip_cov", "kl_cov", "cispo", "geo_mean"}
    assert set(POLICY_LOSSES.names()) == expected
    assert get_policy_loss_fn("vanilla") is compute_policy_loss_vanilla


def test_unknown_loss_lists_names() -> None:
    with pytest.raises(KeyError, match=r"unknown policy loss 'ppo'.*vanilla"):
        get_policy_loss_fn("ppo")


class _PydanticPolicyLoss(BaseModel):
    loss_mode: str = "vanilla"
    kl_cov_ratio: float = 0.001


class _PydanticActor(BaseModel):
    clip_ratio: float = 0.2
    clip_ratio_low: float | None = None
    clip_ratio_high: float | None = 0.28
    clip_ratio_c: float = 3.0
    policy_loss: _PydanticPolicyLoss = _PydanticPolicyLoss()


@dataclass
class _DataclassActor:
    clip_ratio: float = 0.2
    clip_ratio_high: float = 0.28
    policy_loss: dict = field(default_factory=lambda: {"kl_cov_ratio": 0.001})


@pytest.mark.parametrize(
    "config",
    [
        {"clip_ratio": 0.2, "clip_ratio_high": 0.28, "policy_loss": {"kl_cov_ratio": 0.001}},
        _PydanticActor(),
        _DataclassActor(),
        SimpleNamespace(
            clip_ratio=0.2, clip_ratio_high=0.28, policy_loss=SimpleNamespace(kl_cov_ratio=0.001)
        ),
    ],
)
def test_config_read_from_any_verl_shaped_object(config: object) -> None:
    cfg = resolve_policy_loss_config(config)
    assert (cfg.clip_low, cfg.clip_high, cfg.kl_cov_ratio, cfg.clip_ratio_c) == (
        0.2,
        0.28,
        0.001,
        3.0,
    )
    old, log_prob, adv, mask = _fact_sheet_inputs()
    assert compute_policy_loss_vanilla(old, log_prob, adv, mask, "token-mean", config)[
        0
    ].item() == pytest.approx(0.555)


def test_config_defaults_are_verl_yaml() -> None:
    cfg = resolve_policy_loss_config(None)
    assert cfg == PolicyLossSettings.from_actor(ActorConfig())
    assert (cfg.clip_low, cfg.clip_high, cfg.clip_ratio_c, cfg.tau_pos, cfg.tau_neg) == (
        0.2,
        0.2,
        3.0,
        1.0,
        1.05,
    )
    assert (
        cfg.clip_cov_ratio,
        cfg.clip_cov_lb,
        cfg.clip_cov_ub,
        cfg.kl_cov_ratio,
        cfg.ppo_kl_coef,
    ) == (
        0.0002,
        1.0,
        5.0,
        0.0002,
        0.1,
    )


# --- masking -----------------------------------------------------------------------------------

MASKED_LOSSES = ["vanilla", "gspo", "sapo", "gpg", "cispo", "geo_mean", "clip_cov", "kl_cov"]


@pytest.mark.parametrize("name", MASKED_LOSSES)
@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_values_under_mask_change_nothing(name: str, mode: str) -> None:
    generator = torch.Generator().manual_seed(3)
    old = -torch.rand(3, 5, generator=generator, dtype=F64)
    log_prob = -torch.rand(3, 5, generator=generator, dtype=F64)
    adv = torch.randn(3, 5, generator=generator, dtype=F64)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [0, 0, 0, 0, 0]])
    dirty = [x.clone() for x in (old, log_prob, adv)]
    for tensor, junk in zip(dirty, (float("nan"), float("inf"), float("nan")), strict=True):
        tensor[mask == 0] = junk
    cfg = {"policy_loss": {"clip_cov_lb": -10.0, "clip_cov_ub": 10.0, "clip_cov_ratio": 0.5}}

    def run(
        o: torch.Tensor, lp: torch.Tensor, a: torch.Tensor
    ) -> tuple[torch.Tensor, dict, torch.Tensor]:
        lp = lp.clone().requires_grad_(True)
        loss, metrics = get_policy_loss_fn(name)(
            o, lp, a, mask, mode, cfg, generator=torch.Generator().manual_seed(0)
        )
        loss.backward()
        return loss, metrics, lp.grad

    clean_loss, clean_metrics, clean_grad = run(old, log_prob, adv)
    dirty_loss, dirty_metrics, dirty_grad = run(*dirty)
    assert torch.isfinite(clean_loss)
    assert_close(dirty_loss, clean_loss)
    assert_close(dirty_grad, clean_grad)
    assert torch.equal(dirty_grad[mask == 0], torch.zeros(int((mask == 0).sum()), dtype=F64))
    assert dirty_metrics.keys() == clean_metrics.keys()
    for key, value in clean_metrics.items():
        assert_close(dirty_metrics[key], value)
