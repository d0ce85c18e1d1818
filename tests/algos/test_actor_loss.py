"""compute_actor_loss: composition of the three terms, shared denominators, metrics, errors."""

from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

from stages.algos.actor_loss import compute_actor_loss
from stages.algos.aggregation import GlobalBatchInfo, aggregate_loss
from stages.algos.kl import kl_penalty
from stages.algos.policy_losses import compute_policy_loss_vanilla

F64 = torch.float64


def _inputs(seed: int = 0) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    shape = (3, 5)
    return {
        "log_prob": -torch.rand(shape, generator=generator, dtype=F64),
        "old_log_prob": -torch.rand(shape, generator=generator, dtype=F64),
        "advantages": torch.randn(shape, generator=generator, dtype=F64),
        "response_mask": torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]]),
        "entropy": torch.rand(shape, generator=generator, dtype=F64),
        "ref_log_prob": -torch.rand(shape, generator=generator, dtype=F64),
    }


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"])
def test_loss_is_pg_minus_entropy_plus_kl_with_shared_denominators(mode: str) -> None:
    x = _inputs()
    info = GlobalBatchInfo(
        dp_size=2, batch_num_tokens=20, global_batch_size=6, loss_scale_factor=3.0
    )
    cfg = {
        "loss_agg_mode": mode,
        "entropy_coeff": 0.01,
        "use_kl_loss": True,
        "kl_loss_coef": 0.05,
        "kl_loss_type": "low_var_kl",
        "clip_ratio_high": 0.28,
    }
    loss, metrics = compute_actor_loss(**x, config=cfg, global_batch_info=info)
    mask = x["response_mask"]
    pg, _ = compute_policy_loss_vanilla(
        x["old_log_prob"], x["log_prob"], x["advantages"], mask, mode, cfg, global_batch_info=info
    )
    ent = aggregate_loss(x["entropy"], mask, mode, info)
    kl = aggregate_loss(kl_penalty(x["log_prob"], x["ref_log_prob"], "k3"), mask, mode, info)
    assert_close(loss, pg - 0.01 * ent + 0.05 * kl)
    assert_close(metrics["actor/pg_loss"], pg)
    assert_close(metrics["actor/entropy"], ent)
    assert_close(metrics["actor/kl_loss"], kl)
    assert metrics["actor/kl_coef"].item() == pytest.approx(0.05)
    assert all(not v.requires_grad for v in metrics.values())


def test_terms_are_optional() -> None:
    x = _inputs()
    entropy, ref = x.pop("entropy"), x.pop("ref_log_prob")
    loss, metrics = compute_actor_loss(**x, config={})
    pg, _ = compute_policy_loss_vanilla(
        x["old_log_prob"], x["log_prob"], x["advantages"], x["response_mask"]
    )
    assert_close(loss, pg)
    assert set(metrics) == {
        "actor/pg_loss",
        "actor/pg_clipfrac",
        "actor/pg_clipfrac_lower",
        "actor/ppo_kl",
    }
    # entropy given with coeff 0 (calculate_entropy): reported, no effect on the loss
    loss, metrics = compute_actor_loss(**x, config={}, entropy=entropy, ref_log_prob=ref)
    assert_close(loss, pg)
    assert "actor/entropy" in metrics and "actor/kl_loss" not in metrics


def test_policy_loss_is_chosen_by_name() -> None:
    x = _inputs()
    loss, metrics = compute_actor_loss(
        **{k: x[k] for k in ("log_prob", "old_log_prob", "advantages", "response_mask")},
        config={"policy_loss": {"loss_mode": "gpg"}},
    )
    expected = aggregate_loss(-x["log_prob"] * x["advantages"], x["response_mask"], "token-mean")
    assert_close(loss, expected)
    assert set(metrics) == {"actor/pg_loss"}
    with pytest.raises(KeyError, match="unknown policy loss 'ppo2'"):
        compute_actor_loss(**x, config={"policy_loss": {"loss_mode": "ppo2"}})


def test_kl_loss_needs_reference() -> None:
    x = _inputs()
    x.pop("ref_log_prob")
    with pytest.raises(ValueError, match="use_kl_loss=True needs ref_log_prob"):
        compute_actor_loss(**x, config={"use_kl_loss": True})


def test_kl_straight_through_gradient_in_the_loss() -> None:
    x = _inputs()
    mask = x["response_mask"]
    log_prob = x.pop("log_prob").requires_grad_(True)
    cfg = {
        "use_kl_loss": True,
        "kl_loss_coef": 1.0,
        "kl_loss_type": "k1+",
        "policy_loss": {"loss_mode": "gpg"},
    }
    loss, _ = compute_actor_loss(
        log_prob,
        x["old_log_prob"],
        torch.zeros_like(log_prob),
        mask,
        cfg,
        ref_log_prob=x["ref_log_prob"],
    )
    loss.backward()
    expected = (log_prob - x["ref_log_prob"]).detach() * mask / mask.sum()
    assert_close(log_prob.grad, expected)


def test_values_under_mask_change_nothing() -> None:
    x = _inputs(seed=1)
    cfg = {
        "entropy_coeff": 0.1,
        "use_kl_loss": True,
        "kl_loss_type": "k3",
        "loss_agg_mode": "seq-mean-token-mean",
    }
    mask = x["response_mask"]

    def run(inputs: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        log_prob = inputs["log_prob"].clone().requires_grad_(True)
        loss, _ = compute_actor_loss(**{**inputs, "log_prob": log_prob}, config=cfg)
        loss.backward()
        return loss, log_prob.grad

    dirty = {k: v.clone() if k != "response_mask" else v for k, v in x.items()}
    for key in ("log_prob", "old_log_prob", "advantages", "entropy", "ref_log_prob"):
        dirty[key][mask == 0] = float("nan")
    clean_loss, clean_grad = run(x)
    dirty_loss, dirty_grad = run(dirty)
    assert_close(dirty_loss, clean_loss)
    assert_close(dirty_grad, clean_grad)
