"""clip_cov and kl_cov: covariance, selection counts, determinism with a generator, errors."""

from __future__ import annotations

import math

import pytest
import torch
from torch.testing import assert_close

from stages.algos.policy_losses_cov import (
    compute_policy_loss_clip_cov,
    compute_policy_loss_kl_cov,
    token_covariance,
)

F64 = torch.float64


def _inputs(seed: int = 0, rows: int = 4, width: int = 50) -> tuple[torch.Tensor, ...]:
    generator = torch.Generator().manual_seed(seed)
    old = -torch.rand(rows, width, generator=generator, dtype=F64) * 3
    log_prob = old + 0.05 * torch.randn(rows, width, generator=generator, dtype=F64)
    adv = 3 * torch.randn(rows, width, generator=generator, dtype=F64)
    mask = (torch.rand(rows, width, generator=generator) < 0.8).long()
    return old, log_prob, adv, mask


def test_token_covariance_centres_over_valid_tokens_only() -> None:
    adv = torch.tensor([[1.0, 3.0, 100.0]], dtype=F64)
    log_prob = torch.tensor([[-1.0, -3.0, 50.0]], dtype=F64)
    cov = token_covariance(adv, log_prob, torch.tensor([[1, 1, 0]]))
    assert_close(cov[:, :2], torch.tensor([[-1.0, -1.0]], dtype=F64))


def test_clip_cov_zeroes_the_expected_number_of_candidates() -> None:
    old, log_prob, adv, mask = _inputs()
    cfg = {
        "clip_ratio": 0.2,
        "policy_loss": {"clip_cov_ratio": 0.05, "clip_cov_lb": -1e9, "clip_cov_ub": 1e9},
    }
    num_valid = int(mask.sum())
    _, metrics = compute_policy_loss_clip_cov(
        old, log_prob, adv, mask, "token-mean", cfg, generator=torch.Generator().manual_seed(1)
    )
    assert metrics["actor/pg_clipfrac"].item() == pytest.approx(int(0.05 * num_valid) / num_valid)


def test_clip_cov_zeroed_tokens_have_no_gradient_and_draw_is_reproducible() -> None:
    old, log_prob, adv, mask = _inputs(seed=2)
    cfg = {
        "clip_ratio": 10.0,
        "policy_loss": {"clip_cov_ratio": 0.1, "clip_cov_lb": -1e9, "clip_cov_ub": 1e9},
    }

    def grad_with(seed: int) -> torch.Tensor:
        lp = log_prob.clone().requires_grad_(True)
        loss, _ = compute_policy_loss_clip_cov(
            old, lp, adv, mask, "token-sum", cfg, generator=torch.Generator().manual_seed(seed)
        )
        loss.backward()
        return lp.grad

    first, again, other = grad_with(5), grad_with(5), grad_with(6)
    assert torch.equal(first, again)
    assert not torch.equal(first, other)
    # without clipping (ε = 10) every valid token has gradient −A·r ≠ 0, except the dropped ones
    dropped = (first == 0) & (mask == 1)
    assert int(dropped.sum()) == int(0.1 * int(mask.sum()))
    assert_close(
        first[~dropped & (mask == 1)], (-adv * torch.exp(log_prob - old))[~dropped & (mask == 1)]
    )


def test_clip_cov_respects_covariance_window_and_ppo_clipping() -> None:
    # two valid tokens; the window (lb, ub) = (1e9, 2e9) admits none → nothing dropped
    old, log_prob, adv, mask = _inputs(seed=3)
    cfg = {"policy_loss": {"clip_cov_ratio": 0.5, "clip_cov_lb": 1e9, "clip_cov_ub": 2e9}}
    _, metrics = compute_policy_loss_clip_cov(old, log_prob, adv, mask, "token-mean", cfg)
    assert metrics["actor/pg_clipfrac"].item() == 0.0
    # a PPO-clipped token is never a candidate: r = 2 with A > 0 and ε = 0.2
    one = torch.ones(1, 1, dtype=F64)
    cfg = {"policy_loss": {"clip_cov_ratio": 1.0, "clip_cov_lb": -1e9, "clip_cov_ub": 1e9}}
    _, metrics = compute_policy_loss_clip_cov(
        0 * one, math.log(2) * one, one, torch.ones(1, 1), "token-mean", cfg
    )
    assert metrics["actor/pg_clipfrac"].item() == 0.0


def test_kl_cov_penalises_top_k_covariance_tokens() -> None:
    old, log_prob, adv, mask = _inputs(seed=4)
    coef, ratio = 0.7, 0.1
    cfg = {"policy_loss": {"kl_cov_ratio": ratio, "ppo_kl_coef": coef}}
    loss, metrics = compute_policy_loss_kl_cov(old, log_prob, adv, mask, "token-sum", cfg)
    valid = mask.bool()
    cov = token_covariance(adv, log_prob, mask)[valid]
    k = int(ratio * int(valid.sum()))
    top = torch.topk(cov, k).indices
    abs_log_ratio = (log_prob - old).abs()[valid]
    expected = (-adv * torch.exp(log_prob - old))[valid].sum() + coef * abs_log_ratio[top].sum()
    assert loss.item() == pytest.approx(expected.item())
    assert metrics["actor/ppo_kl"].item() == pytest.approx(abs_log_ratio.mean().item())
    assert set(metrics) == {"actor/ppo_kl"}


def test_kl_cov_selects_at_least_one_token_and_handles_empty_mask() -> None:
    one = torch.ones(1, 1, dtype=F64)
    loss, _ = compute_policy_loss_kl_cov(
        0 * one, -0.5 * one, one, torch.ones(1, 1), "token-sum", {}
    )
    assert loss.item() == pytest.approx(-math.exp(-0.5) + 0.1 * 0.5)
    loss, _ = compute_policy_loss_kl_cov(
        0 * one, -0.5 * one, one, torch.zeros(1, 1), "token-mean", {}
    )
    assert loss.item() == 0.0


@pytest.mark.parametrize(
    ("fn", "key"),
    [
        (compute_policy_loss_clip_cov, "clip_cov_ratio"),
        (compute_policy_loss_kl_cov, "kl_cov_ratio"),
    ],
)
def test_non_positive_ratio_raises(fn, key: str) -> None:
    old, log_prob, adv, mask = _inputs()
    with pytest.raises(ValueError, match=rf"{key} must be > 0.*got 0"):
        fn(old, log_prob, adv, mask, "token-mean", {"policy_loss": {key: 0.0}})
