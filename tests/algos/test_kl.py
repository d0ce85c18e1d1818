"""kl_penalty: fact-sheet numbers, the ±20/±10 clamps of k3, straight-through gradients, errors."""

from __future__ import annotations

import math

import pytest
import torch
from torch.testing import assert_close

from stages.algos.kl import kl_penalty, kl_penalty_names


def _d(values: list[float]) -> tuple[torch.Tensor, torch.Tensor]:
    """(logp, ref) with logp − ref = values."""
    logp = torch.tensor([values], dtype=torch.float64)
    return logp, torch.zeros_like(logp)


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("kl", 0.5),
        ("k1", 0.5),
        ("abs", 0.5),
        ("mse", 0.125),
        ("k2", 0.125),
        ("low_var_kl", 0.1065),
        ("k3", 0.1065),
    ],
)
def test_fact_sheet_d_half(name: str, expected: float) -> None:
    logp, ref = _d([0.5])
    assert kl_penalty(logp, ref, name).item() == pytest.approx(expected, abs=5e-5)


def test_k3_formula_and_sign_handling() -> None:
    logp, ref = _d([-1.0, 0.0, 2.0])
    expected = torch.tensor([[math.exp(1.0) - 2.0, 0.0, math.exp(-2.0) + 1.0]], dtype=torch.float64)
    assert_close(kl_penalty(logp, ref, "k3"), expected)
    assert_close(kl_penalty(logp, ref, "abs"), torch.tensor([[1.0, 0.0, 2.0]], dtype=torch.float64))


def test_k3_clamps_exponent_and_value() -> None:
    # d = −30: exponent clamped to 20 → e^20 − 21 ≫ 10 → value clamped to 10; d = +30 → 30 − 1 → 10.
    logp, ref = _d([-30.0, 30.0, -2.0])
    out = kl_penalty(logp, ref, "k3")
    assert out[0, 0].item() == 10.0
    assert out[0, 1].item() == 10.0
    assert out[0, 2].item() == pytest.approx(math.exp(2.0) - 3.0)
    assert torch.isfinite(kl_penalty(*_d([-1e4]), "k3")).all()


@pytest.mark.parametrize("base", ["kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3"])
def test_straight_through_value_of_base_gradient_of_k2(base: str) -> None:
    torch.manual_seed(0)
    logp = torch.randn(3, 5, dtype=torch.float64, requires_grad=True)
    ref = torch.randn(3, 5, dtype=torch.float64)
    weights = torch.rand(3, 5, dtype=torch.float64)

    value = kl_penalty(logp, ref, base + "+")
    assert_close(value.detach(), kl_penalty(logp.detach(), ref, base))
    (grad_st,) = torch.autograd.grad((value * weights).sum(), logp)

    logp_k2 = logp.detach().clone().requires_grad_(True)
    (grad_k2,) = torch.autograd.grad((kl_penalty(logp_k2, ref, "k2") * weights).sum(), logp_k2)
    assert_close(grad_st, grad_k2)
    assert_close(grad_st, (logp - ref).detach() * weights)


def test_plain_estimators_have_their_own_gradient() -> None:
    logp = torch.tensor([[0.3]], dtype=torch.float64, requires_grad=True)
    kl_penalty(logp, torch.zeros_like(logp), "k3").sum().backward()
    # ∂/∂d (e^{−d} + d − 1) = 1 − e^{−d}
    assert logp.grad.item() == pytest.approx(1 - math.exp(-0.3))


def test_full_is_not_supported_with_choices_listed() -> None:
    logp, ref = _d([0.1])
    with pytest.raises(NotImplementedError, match=r"'full'.*not supported.*k3"):
        kl_penalty(logp, ref, "full")


@pytest.mark.parametrize("name", ["k4", "K1", "low-var-kl", "k9+"])
def test_unknown_name_lists_known(name: str) -> None:
    logp, ref = _d([0.1])
    with pytest.raises(KeyError, match=r"unknown kl_penalty.*low_var_kl.*k3\+"):
        kl_penalty(logp, ref, name)


def test_names_include_straight_through_variants() -> None:
    names = kl_penalty_names()
    assert {"kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3"} <= set(names)
    assert {"k1+", "k2+", "k3+", "low_var_kl+"} <= set(names)
