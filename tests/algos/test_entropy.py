"""entropy_from_logits: oracle, stability, −inf logits, chunking, gradients, dtype; entropy loss."""

from __future__ import annotations

import math

import pytest
import torch
from torch.testing import assert_close

from stages.algos.entropy import compute_entropy_loss, entropy_from_logits

F64 = torch.float64


def _oracle(logits: torch.Tensor) -> torch.Tensor:
    log_p = torch.log_softmax(logits.double(), dim=-1)
    return -(log_p.exp() * log_p).sum(-1)


def test_matches_minus_sum_p_log_p() -> None:
    logits = torch.randn(3, 5, 11, generator=torch.Generator().manual_seed(0), dtype=F64)
    assert_close(entropy_from_logits(logits), _oracle(logits))


def test_stable_for_huge_logits_and_ignores_minus_inf() -> None:
    big = torch.tensor([[1e4, 1e4, -1e4]], dtype=torch.float32)
    assert entropy_from_logits(big).item() == pytest.approx(math.log(2), abs=1e-6)
    masked = torch.tensor([0.0, 0.0, float("-inf")], requires_grad=True)
    value = entropy_from_logits(masked)
    value.backward()
    assert value.item() == pytest.approx(math.log(2))
    assert torch.isfinite(masked.grad).all()


@pytest.mark.parametrize("chunk_size", [1, 3, 7, 1000])
def test_chunking_does_not_change_values_or_gradients(chunk_size: int) -> None:
    base = torch.randn(2, 7, 13, generator=torch.Generator().manual_seed(1), dtype=F64)
    weights = torch.rand(2, 7, dtype=F64)
    whole = base.clone().requires_grad_(True)
    chunked = base.clone().requires_grad_(True)
    (entropy_from_logits(whole, chunk_size=10**6) * weights).sum().backward()
    out = entropy_from_logits(chunked, chunk_size=chunk_size)
    (out * weights).sum().backward()
    assert_close(out.detach(), _oracle(base))
    assert_close(chunked.grad, whole.grad)


def test_gradient_matches_autograd_of_oracle() -> None:
    base = torch.randn(4, 9, generator=torch.Generator().manual_seed(2), dtype=F64)
    ours, ref = base.clone().requires_grad_(True), base.clone().requires_grad_(True)
    entropy_from_logits(ours, chunk_size=3).sum().backward()
    _oracle(ref).sum().backward()
    assert_close(ours.grad, ref.grad)


def test_bf16_input_gives_float32_result() -> None:
    logits = torch.randn(2, 3, 17, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16)
    out = entropy_from_logits(logits)
    assert out.dtype == torch.float32
    assert_close(out.double(), _oracle(logits.float()), atol=1e-5, rtol=1e-5)


def test_empty_and_bad_chunk() -> None:
    assert entropy_from_logits(torch.zeros(0, 4, 5)).shape == (0, 4)
    with pytest.raises(ValueError, match="chunk_size must be ≥ 1, got 0"):
        entropy_from_logits(torch.zeros(2, 5), chunk_size=0)


def test_compute_entropy_loss_aggregates_with_mask_and_global_info() -> None:
    logits = torch.zeros(2, 3, 4)
    logits[1, :, 0] = 1e4  # row 1: certain tokens, entropy 0
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    assert compute_entropy_loss(logits, mask).item() == pytest.approx(2 * math.log(4) / 3, abs=1e-6)
    assert compute_entropy_loss(logits, mask, "seq-mean-token-mean").item() == pytest.approx(
        math.log(4) / 2, abs=1e-6
    )
    loss = compute_entropy_loss(logits, mask, "token-mean", {"dp_size": 2, "batch_num_tokens": 6})
    assert loss.item() == pytest.approx(2 * math.log(4) / 6 * 2, abs=1e-6)
