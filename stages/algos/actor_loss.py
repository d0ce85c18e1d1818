"""The PPO actor loss of one micro-batch, as it enters ``backward()``.

    loss = pg_loss − entropy_coeff · agg(H)                (only when ``entropy`` is given)
                   + kl_loss_coef · agg(kl_penalty(logp, ref_logp, kl_loss_type))   (use_kl_loss)

pg_loss comes from ``POLICY_LOSSES[policy_loss.loss_mode]``. All three terms are aggregated with
``loss_agg_mode`` and the **same** global denominators (``GlobalBatchInfo``: dp_size d,
batch_num_tokens N_tok = Σ response_mask over the whole mini-batch on all ranks,
global_batch_size N_seq = sequences in the mini-batch, loss_scale_factor). Each term of each
micro-batch is then a partial sum: summing the micro-batch losses of a rank (gradient
accumulation) and averaging the gradients over the d ranks (DP) gives the mini-batch loss, whatever
the split. (Exceptions inherited from verl: sapo always uses seq-mean-token-mean for its own term,
geo_mean ignores the denominators.)

Metrics (detached 0-d tensors, verl names after the trainer's renaming):
``actor/pg_loss``, ``actor/entropy`` (the aggregated entropy, when given), ``actor/kl_loss`` and
``actor/kl_coef`` (when use_kl_loss), plus the policy loss's own ``actor/pg_clipfrac``,
``actor/pg_clipfrac_lower``, ``actor/ppo_kl``. The loss metrics are partial sums under global
denominators (sum them over micro-batches); the clip fractions and ppo_kl are means over this
micro-batch's valid tokens (average them).

Example (vanilla at ratio 1 with A = 1: pg_loss −1; entropy 0.5 with coeff 0.1; k1 KL 0.5 × 0.2):
    >>> logp, mask = torch.zeros(1, 2), torch.ones(1, 2)
    >>> cfg = {"entropy_coeff": 0.1, "use_kl_loss": True, "kl_loss_coef": 0.2, "kl_loss_type": "k1"}
    >>> loss, metrics = compute_actor_loss(logp, logp, torch.ones(1, 2), mask, cfg,
    ...                                    entropy=torch.full((1, 2), 0.5), ref_log_prob=torch.full((1, 2), -0.5))
    >>> round(loss.item(), 4)  # −1 − 0.1·0.5 + 0.2·0.5
    -0.95
    >>> sorted(metrics)
    ['actor/entropy', 'actor/kl_coef', 'actor/kl_loss', 'actor/pg_clipfrac', 'actor/pg_clipfrac_lower', 'actor/pg_loss', 'actor/ppo_kl']
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from stages.algos.aggregation import GlobalBatchInfo, aggregate_loss
from stages.algos.kl import kl_penalty
from stages.algos.policy_loss_config import (
    default_actor,
    read_settings,
    resolve_global_info,
    resolve_policy_loss_config,
    zero_masked,
)
from stages.algos.policy_losses import get_policy_loss_fn
from stages.algos.policy_losses_bypass import BYPASS_LOSSES, BypassLossSettings
from stages.algos.rollout_correction import RolloutCorrectionSettings


@dataclass(frozen=True)
class ActorLossTerms:
    """The actor settings beyond the policy loss itself (verl's names; no defaults here).

    Each field is the ``actor_rollout_ref.actor`` key of the same name: its description is the
    run config schema's, its default is in :mod:`stages.algos.defaults`.

    Attributes:
        entropy_coeff: weight of the entropy bonus (subtracted).
        use_kl_loss: add the KL-to-reference term to the loss (GRPO-style KL in loss).
        kl_loss_coef: weight of the KL term.
        kl_loss_type: ``kl_penalty`` estimator name for the KL term.
    """

    entropy_coeff: float
    use_kl_loss: bool
    kl_loss_coef: float
    kl_loss_type: str

    @classmethod
    def from_actor(cls, actor: Any) -> ActorLossTerms:
        """The terms of an object shaped like the ``actor_rollout_ref.actor`` slice (each field
        read from it as is)."""
        return cls(**{f.name: getattr(actor, f.name) for f in dataclasses.fields(cls)})

    @classmethod
    def resolve(cls, config: Any) -> ActorLossTerms:
        """The terms of the typed actor slice (which holds every field, none of them None) or of a
        verl-style config (mapping, object, None): the fields it holds and not None, the defaults
        (:mod:`stages.algos.defaults`) the rest."""
        return dataclasses.replace(
            cls.from_actor(default_actor()), **read_settings(config, ActorLossTerms)
        )


def compute_actor_loss(
    log_prob: Tensor,
    old_log_prob: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    config: Any,
    entropy: Tensor | None = None,
    ref_log_prob: Tensor | None = None,
    rollout_is_weights: Tensor | None = None,
    global_batch_info: GlobalBatchInfo | Mapping[str, Any] | None = None,
    generator: torch.Generator | None = None,
    rollout_correction: RolloutCorrectionSettings | Mapping[str, Any] | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """Actor loss of one micro-batch (module formula) and its metrics.

    Args:
        log_prob: (B, R) current log π_θ of the response tokens, differentiable.
        old_log_prob: (B, R) log π_old from the rollout-time policy (``old_log_probs``).
        advantages: (B, R) token advantages.
        response_mask: (B, R) 1 = token counts.
        config: the run config's typed actor slice, or a verl-style config with the same
            names (object or mapping; absent fields take their defaults): clip_ratio*,
            loss_agg_mode, policy_loss.*, entropy_coeff, use_kl_loss, kl_loss_coef, kl_loss_type.
        entropy: (B, R) token entropy, differentiable; None = no entropy term (verl adds it
            whenever it was computed, i.e. calculate_entropy or entropy_coeff ≠ 0).
        ref_log_prob: (B, R) reference log-probs (``ref_log_prob``); required when use_kl_loss.
        rollout_is_weights: optional (B, R) importance weights multiplied into the policy term's
            per-token loss before aggregation (decoupled rollout correction's
            ``rollout_is_weights``).
        global_batch_info: denominators shared by all terms; None = ``config.global_batch_info``.
        generator: RNG for sampling losses (clip_cov).
        rollout_correction: bypass mode's rollout-correction settings
            (``algorithm.rollout_correction``), or None. Given, the policy term is the
            ``BYPASS_LOSSES`` entry of their ``loss_type`` (``policy_losses_bypass.py``;
            ``old_log_prob`` is then the rollout's log-probs) instead of
            ``policy_loss.loss_mode``, as verl's trainer switches the loss; the entropy and KL
            terms keep ``response_mask``.

    Returns:
        (loss scalar, metrics of detached 0-d tensors).

    Raises:
        ValueError: use_kl_loss without ref_log_prob.
    """
    policy_cfg = resolve_policy_loss_config(config)
    if rollout_correction is None:
        policy_loss_fn = get_policy_loss_fn(policy_cfg.loss_mode)
    else:  # bypass mode: its loss_type's entry replaces policy_loss.loss_mode, as in verl
        correction = RolloutCorrectionSettings.resolve(rollout_correction)
        policy_cfg = BypassLossSettings.of(policy_cfg, correction)
        policy_loss_fn = BYPASS_LOSSES.get(correction.loss_type).fn
    terms = ActorLossTerms.resolve(config)
    info = resolve_global_info(policy_cfg, global_batch_info)
    mode = policy_cfg.loss_agg_mode
    pg_loss, metrics = policy_loss_fn(
        old_log_prob,
        log_prob,
        advantages,
        response_mask,
        mode,
        policy_cfg,
        rollout_is_weights,
        info,
        generator,
    )
    metrics = {**metrics, "actor/pg_loss": pg_loss.detach()}
    loss = pg_loss
    if entropy is not None:
        entropy_term = aggregate_loss(entropy, response_mask, mode, info)
        loss = loss - terms.entropy_coeff * entropy_term
        metrics["actor/entropy"] = entropy_term.detach()
    if terms.use_kl_loss:
        if ref_log_prob is None:
            raise ValueError(
                "use_kl_loss=True needs ref_log_prob (B, R) from the reference policy; got None"
            )
        token_kl = kl_penalty(
            zero_masked(log_prob, response_mask), ref_log_prob, terms.kl_loss_type
        )  # (B, R)
        kl_term = aggregate_loss(token_kl, response_mask, mode, info)
        loss = loss + terms.kl_loss_coef * kl_term
        metrics["actor/kl_loss"] = kl_term.detach()
        metrics["actor/kl_coef"] = torch.tensor(terms.kl_loss_coef)
    return loss, metrics
