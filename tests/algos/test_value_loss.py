"""compute_value_loss: hand case, clipping both ways, global denominators, mask invariance."""

from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

from stages.algos.aggregation import GlobalBatchInfo
from stages.algos.value_loss import compute_value_loss

F64 = torch.float64


def test_hand_case_takes_the_larger_error() -> None:
    # token 1: v 2, v_old 0 → v_clip 0.5; R 0 → max(4, 0.25) = 4 (unclipped larger)
    # token 2: v 1, v_old 0 → v_clip 0.5; R 1 → max(0, 0.25) = 0.25 (clipped larger → clipfrac)
    vpreds, returns, values = (
        torch.tensor([[2.0, 1.0]], dtype=F64),
        torch.tensor([[0.0, 1.0]], dtype=F64),
        torch.zeros(1, 2, dtype=F64),
    )
    vf_loss, vf_clipfrac = compute_value_loss(
        vpreds, returns, values, torch.ones(1, 2), cliprange_value=0.5
    )
    assert vf_loss.item() == pytest.approx(0.5 * (4 + 0.25) / 2)
    assert vf_clipfrac.item() == 0.5
    vf_sum, _ = compute_value_loss(
        vpreds, returns, values, torch.ones(1, 2), 0.5, loss_agg_mode="token-sum"
    )
    assert vf_sum.item() == pytest.approx(0.5 * 4.25)


def test_gradient_flows_only_through_the_active_branch() -> None:
    vpreds = torch.tensor([[2.0, 1.0]], dtype=F64, requires_grad=True)
    vf_loss, _ = compute_value_loss(
        vpreds,
        torch.tensor([[0.0, 1.0]], dtype=F64),
        torch.zeros(1, 2, dtype=F64),
        torch.ones(1, 2),
        0.5,
        loss_agg_mode="token-sum",
    )
    vf_loss.backward()
    # token 1: ½·d/dv (v − 0)² = v = 2; token 2: the clipped branch is flat in v → 0
    assert_close(vpreds.grad, torch.tensor([[2.0, 0.0]], dtype=F64))


def test_global_denominators_are_forwarded() -> None:
    vpreds, returns, values = (
        torch.ones(1, 2, dtype=F64),
        torch.zeros(1, 2, dtype=F64),
        torch.ones(1, 2, dtype=F64),
    )
    info = GlobalBatchInfo(dp_size=2, batch_num_tokens=8, global_batch_size=4)
    vf_loss, _ = compute_value_loss(
        vpreds, returns, values, torch.ones(1, 2), 0.5, "token-mean", **info.as_kwargs()
    )
    assert vf_loss.item() == pytest.approx(0.5 * 2 / 8 * 2)
    vf_loss, _ = compute_value_loss(
        vpreds, returns, values, torch.ones(1, 2), 0.5, "seq-mean-token-sum", **info.as_kwargs()
    )
    assert vf_loss.item() == pytest.approx(0.5 * 2 / 4 * 2)
    with pytest.raises(ValueError, match="batch_num_tokens"):
        compute_value_loss(vpreds, returns, values, torch.ones(1, 2), 0.5, "token-mean", dp_size=2)


def test_values_under_mask_change_nothing() -> None:
    generator = torch.Generator().manual_seed(0)
    vpreds, returns, values = (torch.randn(3, 4, generator=generator, dtype=F64) for _ in range(3))
    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1], [0, 0, 0, 0]])

    def run(
        v: torch.Tensor, r: torch.Tensor, o: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        v = v.clone().requires_grad_(True)
        loss, clipfrac = compute_value_loss(v, r, o, mask, 0.2, "seq-mean-token-mean")
        loss.backward()
        return loss, clipfrac, v.grad

    dirty = [x.clone() for x in (vpreds, returns, values)]
    for tensor in dirty:
        tensor[mask == 0] = float("nan")
    clean, noisy = run(vpreds, returns, values), run(*dirty)
    for a, b in zip(clean, noisy, strict=True):
        assert_close(b, a)
    assert torch.equal(noisy[2][mask == 0], torch.zeros(int((mask == 0).sum()), dtype=F64))
