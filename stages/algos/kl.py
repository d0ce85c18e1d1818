"""Per-token KL estimators between the policy and the reference policy.

With d = logp − ref_logp (token log-probabilities of the sampled tokens, shape (B, R)):

==================  =====================================================================
name                value per token
==================  =====================================================================
``kl`` / ``k1``     d
``abs``             \\|d\\|
``mse`` / ``k2``    ½·d²
``low_var_kl`` /    e^{−d} + d − 1, with d clamped to [−20, 20] before the exponential and
``k3``              the result clamped to [−10, 10] (Schulman, "Approximating KL divergence")
==================  =====================================================================

A trailing ``+`` (``k1+``, ``k3+``, …) is a straight-through variant: the forward value is the
base estimator's, the gradient is k2's (∂/∂logp = d), which is an unbiased gradient of KL.
``full`` (the exact KL over the vocabulary) needs the whole distributions, not two token
log-probabilities, and is not supported.

Example (d = 0.5):
    >>> logp, ref = torch.tensor([[0.0]]), torch.tensor([[-0.5]])
    >>> [round(kl_penalty(logp, ref, name).item(), 4) for name in ("k1", "k2", "k3")]
    [0.5, 0.125, 0.1065]
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from stages.registry import Registry

#: estimator(d) -> per-token value, d = logp − ref_logp, all (B, R)
KLEstimator = Callable[[Tensor], Tensor]

KL_ESTIMATORS: Registry[KLEstimator] = Registry("KL estimator")

#: d is clamped to ±this before exp() in k3
K3_LOG_RATIO_CLAMP = 20.0
#: the k3 value is clamped to ±this
K3_VALUE_CLAMP = 10.0
#: suffix selecting the straight-through (k2-gradient) variant
STRAIGHT_THROUGH_SUFFIX = "+"


def _k1(d: Tensor) -> Tensor:
    return d


def _abs(d: Tensor) -> Tensor:
    return d.abs()


def _k2(d: Tensor) -> Tensor:
    return 0.5 * d.square()


def _k3(d: Tensor) -> Tensor:
    d = d.clamp(-K3_LOG_RATIO_CLAMP, K3_LOG_RATIO_CLAMP)
    return (torch.exp(-d) + d - 1.0).clamp(-K3_VALUE_CLAMP, K3_VALUE_CLAMP)


for _names, _fn in (
    (("kl", "k1"), _k1),
    (("abs",), _abs),
    (("mse", "k2"), _k2),
    (("low_var_kl", "k3"), _k3),
):
    for _name in _names:
        KL_ESTIMATORS.add(_name, _fn)


def kl_penalty_names() -> list[str]:
    """Every accepted ``kl_penalty`` name, including the ``+`` straight-through variants."""
    base = KL_ESTIMATORS.names()
    return base + [name + STRAIGHT_THROUGH_SUFFIX for name in base]


def _lookup(name: str) -> KLEstimator:
    if name == "full":
        raise NotImplementedError(
            "kl_penalty 'full' (exact KL over the vocabulary) is not supported by ppoflow: it needs the "
            f"full logits, not token log-probs; use one of {kl_penalty_names()}"
        )
    if name not in KL_ESTIMATORS:
        raise KeyError(f"unknown kl_penalty {name!r}; known: {kl_penalty_names()}")
    return KL_ESTIMATORS.get(name)


def kl_penalty(logprob: Tensor, ref_logprob: Tensor, kl_penalty: str) -> Tensor:
    """Per-token KL estimate between the policy and the reference (see the module table).

    Args:
        logprob: (B, R) log π(a_t) of the sampled tokens under the policy.
        ref_logprob: (B, R) log π_ref(a_t) under the reference policy.
        kl_penalty: estimator name: kl/k1, abs, mse/k2, low_var_kl/k3, optionally with a
            trailing ``+`` (forward value of the estimator, gradient of k2).

    Returns:
        (B, R) unmasked per-token values; the caller applies response_mask.

    Raises:
        NotImplementedError: for ``full``.
        KeyError: for an unknown name (the message lists the known ones).

    Example (straight-through: value of k1, gradient of k2 = d):
        >>> logp = torch.tensor([[0.0]], requires_grad=True)
        >>> value = kl_penalty(logp, torch.tensor([[-0.5]]), "k1+")
        >>> value.sum().backward()
        >>> value.item(), logp.grad.item()
        (0.5, 0.5)
    """
    is_straight_through = kl_penalty.endswith(STRAIGHT_THROUGH_SUFFIX)
    base_name = (
        kl_penalty.removesuffix(STRAIGHT_THROUGH_SUFFIX) if is_straight_through else kl_penalty
    )
    estimator = _lookup(base_name)
    d = logprob - ref_logprob  # (B, R)
    if not is_straight_through:
        return estimator(d)
    gradient_carrier = _k2(d)
    return gradient_carrier - gradient_carrier.detach() + estimator(d.detach())
