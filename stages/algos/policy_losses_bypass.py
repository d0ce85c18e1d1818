"""Bypass mode's policy losses (verl's ``bypass_mode`` loss): two policies, π_rollout and π_θ.

In bypass mode ``old_log_probs`` are the rollout's own log-probs, so ``old_log_prob`` here *is*
log π_rollout. For each micro-batch the loss first computes, under no_grad and on the
micro-batch's response_mask, the rollout correction of the current log π_θ against it
(:func:`stages.algos.rollout_correction.compute_rollout_correction`: IS weights, rejection mask,
``rollout_corr/*`` metrics; batch normalization is therefore per micro-batch), then, by
``algorithm.rollout_correction.loss_type`` (the entries of :data:`BYPASS_LOSSES`):

- ``ppo_clip``: the ``vanilla`` clipped loss with ratio π_θ / π_rollout on the rejection mask,
  *without* the IS weights (the ratio already is the importance ratio; verl computes the weights
  for the metrics only);
- ``reinforce``: loss = agg(−A · log π_θ · w) on the rejection mask, w the detached IS weights (1
  without ``rollout_is``), no clip; ``actor/ppo_kl`` = mean(log π_rollout − log π_θ),
  ``actor/pg_clipfrac`` = ``actor/pg_clipfrac_lower`` = 0.

The entries have the policy losses' signature (:class:`~stages.algos.policy_loss_config.PolicyLossFn`)
and spec (:class:`~stages.algos.policy_loss_config.PolicyLossSpec`), in a registry of their own:
``policy_loss.loss_mode`` cannot name them. ``compute_actor_loss(..., rollout_correction=…)`` runs
the entry of the settings' ``loss_type`` with :class:`BypassLossSettings` (the actor's settings
plus the correction's). A verl-style config may instead hold the correction at
``policy_loss.rollout_correction`` (where verl's trainer puts it); with neither, the correction is
the defaults (no weights, no rejection). A ``rollout_is_weights`` argument is ignored, as in verl:
the weights come from the current π_θ. The denominators in ``global_batch_info`` are the caller's
(the mini-batch's mask before rejection, as in verl).

Example (REINFORCE with token IS weights clamped at 2: ratios e^0.5 → 1.6487 and e^1 → 2):
    >>> rollout = torch.zeros(1, 2)
    >>> logp = torch.tensor([[0.5, 1.0]], requires_grad=True)
    >>> correction = {"rollout_is": "token", "rollout_is_threshold": 2.0}
    >>> loss, metrics = BYPASS_LOSSES.get("reinforce").fn(rollout, logp, torch.ones(1, 2),
    ...     torch.ones(1, 2), "token-sum", {"policy_loss": {"rollout_correction": correction}})
    >>> round(loss.item(), 4)  # −(0.5 · 1.6487 + 1.0 · 2)
    -2.8244
    >>> round(metrics["rollout_corr/rollout_is_mean"].item(), 4)
    1.8244
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from stages.algos.aggregation import GlobalBatchInfo
from stages.algos.masked import masked_mean
from stages.algos.policy_loss_config import (
    POLICY_LOSSES,
    PolicyLossFn,
    PolicyLossSettings,
    PolicyLossSpec,
    zero_masked,
)
from stages.algos.rollout_correction import (
    RolloutCorrection,
    RolloutCorrectionSettings,
    compute_rollout_correction,
)
from stages.registry import Registry

GlobalInfoArg = GlobalBatchInfo | Mapping[str, Any] | None

#: ``algorithm.rollout_correction.loss_type`` → bypass mode's policy loss
BYPASS_LOSSES: Registry[PolicyLossSpec] = Registry("bypass loss")

_SETTINGS_FIELDS = frozenset(f.name for f in dataclasses.fields(PolicyLossSettings))


def register_bypass_loss(
    loss_type: str, *, reads: tuple[str, ...] = ()
) -> Callable[[PolicyLossFn], PolicyLossFn]:
    """Decorator adding a loss with the :class:`PolicyLossFn` signature as bypass mode's
    ``loss_type``; ``reads`` as :func:`~stages.algos.policy_loss_config.register_policy_loss`."""
    unknown = sorted(set(reads) - _SETTINGS_FIELDS)
    if unknown:
        raise ValueError(
            f"bypass loss {loss_type!r} reads {unknown}, not PolicyLossSettings fields"
        )

    def add(fn: PolicyLossFn) -> PolicyLossFn:
        BYPASS_LOSSES.add(loss_type, PolicyLossSpec(fn=fn, reads=frozenset(reads)))
        return fn

    return add


@dataclass(frozen=True)
class BypassLossSettings(PolicyLossSettings):
    """The policy-loss settings of bypass mode: the actor's, plus the rollout correction's."""

    rollout_correction: RolloutCorrectionSettings

    @classmethod
    def of(
        cls, settings: PolicyLossSettings, correction: RolloutCorrectionSettings
    ) -> BypassLossSettings:
        """``settings`` with ``correction``."""
        values = {f.name: getattr(settings, f.name) for f in dataclasses.fields(PolicyLossSettings)}
        return cls(**values, rollout_correction=correction)


def _get(source: Any, name: str) -> Any:
    if source is None:
        return None
    if isinstance(source, Mapping):
        return source.get(name)
    return getattr(source, name, None)


def _correction_settings(config: Any) -> RolloutCorrectionSettings:
    if isinstance(config, BypassLossSettings):
        return config.rollout_correction
    return RolloutCorrectionSettings.resolve(
        _get(_get(config, "policy_loss"), "rollout_correction")
    )


def _correct(
    old_log_prob: Tensor, log_prob: Tensor, response_mask: Tensor, config: Any
) -> RolloutCorrection:
    """The correction of the current π_θ against π_rollout (= ``old_log_prob``)."""
    with torch.no_grad():
        return compute_rollout_correction(
            log_prob.detach(), old_log_prob, response_mask, _correction_settings(config)
        )


@register_bypass_loss(
    "ppo_clip", reads=("clip_ratio", "clip_ratio_low", "clip_ratio_high", "clip_ratio_c")
)
def compute_policy_loss_bypass_ppo_clip(
    old_log_prob: Tensor,
    log_prob: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: Tensor | None = None,
    global_batch_info: GlobalInfoArg = None,
    generator: torch.Generator | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """The ``vanilla`` loss against π_rollout on the rejection mask (no IS weights), plus the
    ``rollout_corr/*`` metrics of the micro-batch."""
    correction = _correct(old_log_prob, log_prob, response_mask, config)
    vanilla = POLICY_LOSSES.get("vanilla").fn
    pg_loss, metrics = vanilla(
        old_log_prob,
        log_prob,
        advantages,
        correction.response_mask,
        loss_agg_mode,
        config,
        None,
        global_batch_info,
        generator,
    )
    return pg_loss, {**metrics, **correction.metrics}


@register_bypass_loss("reinforce")
def compute_policy_loss_bypass_reinforce(
    old_log_prob: Tensor,
    log_prob: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: Tensor | None = None,
    global_batch_info: GlobalInfoArg = None,
    generator: torch.Generator | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """REINFORCE with the IS weights: agg(−A · log π_θ · w) on the rejection mask, no clip —
    the ``gpg`` loss (plain −log π·A) given the rejection mask and the weights."""
    correction = _correct(old_log_prob, log_prob, response_mask, config)
    mask = correction.response_mask
    plain_pg = POLICY_LOSSES.get("gpg").fn
    pg_loss, _ = plain_pg(
        old_log_prob,
        log_prob,
        advantages,
        mask,
        loss_agg_mode,
        config,
        correction.weights,
        global_batch_info,
        generator,
    )
    zero = torch.zeros((), device=pg_loss.device)
    current = zero_masked(log_prob.detach(), response_mask)
    return pg_loss, {
        "actor/pg_clipfrac": zero,
        "actor/ppo_kl": masked_mean(old_log_prob - current, mask),
        "actor/pg_clipfrac_lower": zero,
        **correction.metrics,
    }
