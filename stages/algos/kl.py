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

``KL_ESTIMATORS`` maps each name to a :class:`KLEstimatorSpec`, which declares what the estimator
needs: ``full`` (verl's exact KL over the vocabulary) is registered with
``needs_full_distribution=True``; ppoflow's stages hold two token log-probabilities, not the
distributions, so such an estimator is refused (:func:`kl_penalty_names` leaves it out, and the
config rejects it). Register more with :func:`register_kl_estimator`.

Example (d = 0.5):
    >>> logp, ref = torch.tensor([[0.0]]), torch.tensor([[-0.5]])
    >>> [round(kl_penalty(logp, ref, name).item(), 4) for name in ("k1", "k2", "k3")]
    [0.5, 0.125, 0.1065]
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from stages.registry import Registry

#: estimator(d) -> per-token value, d = logp − ref_logp, all (B, R)
KLEstimator = Callable[[Tensor], Tensor]


@dataclass(frozen=True)
class KLEstimatorSpec:
    """One ``KL_ESTIMATORS`` entry.

    Attributes:
        fn: d (B, R) → per-token value (B, R); None for an estimator ppoflow cannot evaluate.
        needs_full_distribution: needs both policies' whole distributions over the vocabulary
            (verl's ``full``), not the token log-probabilities ppoflow's stages hold.
    """

    fn: KLEstimator | None
    needs_full_distribution: bool = False

    def __post_init__(self) -> None:
        if (self.fn is None) != self.needs_full_distribution:
            raise ValueError(
                "a KLEstimatorSpec has fn=None exactly when needs_full_distribution is True"
            )


KL_ESTIMATORS: Registry[KLEstimatorSpec] = Registry("KL estimator")


def register_kl_estimator(*names: str) -> Callable[[KLEstimator], KLEstimator]:
    """Decorator adding ``fn(d) -> value`` (all (B, R)) under each of ``names`` (one spec)."""

    def add(fn: KLEstimator) -> KLEstimator:
        spec = KLEstimatorSpec(fn=fn)
        for name in names:
            KL_ESTIMATORS.add(name, spec)
        return fn

    return add


#: d is clamped to ±this before exp() in k3
K3_LOG_RATIO_CLAMP = 20.0
#: the k3 value is clamped to ±this
K3_VALUE_CLAMP = 10.0
#: suffix selecting the straight-through (k2-gradient) variant
STRAIGHT_THROUGH_SUFFIX = "+"


@register_kl_estimator("kl", "k1")
def _k1(d: Tensor) -> Tensor:
    """d."""
    return d


@register_kl_estimator("abs")
def _abs(d: Tensor) -> Tensor:
    """|d|."""
    return d.abs()


@register_kl_estimator("mse", "k2")
def _k2(d: Tensor) -> Tensor:
    """½·d²."""
    return 0.5 * d.square()


@register_kl_estimator("low_var_kl", "k3")
def _k3(d: Tensor) -> Tensor:
    """e^{−d} + d − 1 with d clamped to ±20 first and the value clamped to ±10 after."""
    d = d.clamp(-K3_LOG_RATIO_CLAMP, K3_LOG_RATIO_CLAMP)
    return (torch.exp(-d) + d - 1.0).clamp(-K3_VALUE_CLAMP, K3_VALUE_CLAMP)


# verl's exact KL over the vocabulary: registered so the config names it, refused by ppoflow
KL_ESTIMATORS.add("full", KLEstimatorSpec(fn=None, needs_full_distribution=True))


def kl_penalty_names() -> list[str]:
    """Every accepted ``kl_penalty`` name (estimators on token log-probs), including the ``+``
    straight-through variants.

    >>> kl_penalty_names()[:4]
    ['abs', 'k1', 'k2', 'k3']
    """
    base = [n for n in KL_ESTIMATORS if not KL_ESTIMATORS.get(n).needs_full_distribution]
    return base + [name + STRAIGHT_THROUGH_SUFFIX for name in base]


def unavailable_kl_penalties() -> dict[str, str]:
    """Registered names ppoflow refuses, each with the reason (for config errors)."""
    return {
        name: "it needs the full distributions over the vocabulary, and ppoflow's stages hold "
        "token log-probs only"
        for name in KL_ESTIMATORS
        if KL_ESTIMATORS.get(name).needs_full_distribution
    }


def _lookup(name: str) -> KLEstimator:
    if name not in KL_ESTIMATORS:
        raise KeyError(f"unknown kl_penalty {name!r}; known: {kl_penalty_names()}")
    spec = KL_ESTIMATORS.get(name)
    if spec.needs_full_distribution:
        raise NotImplementedError(
            f"kl_penalty {name!r} is not supported by ppoflow: it needs the full distributions "
            f"(logits), not token log-probs; use one of {kl_penalty_names()}"
        )
    return spec.fn


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
        NotImplementedError: for an estimator that needs the full distributions (``full``).
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
