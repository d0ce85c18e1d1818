"""Policy-gradient losses, looked up by name in ``POLICY_LOSSES`` (verl's ``policy_loss.loss_mode``).

Every loss has the :class:`~stages.algos.policy_loss_config.PolicyLossFn` signature and returns
``(pg_loss, metrics)``: a scalar partial loss aggregated with ``agg_loss`` and the global
denominators (see ``aggregation.py``), and detached 0-d metric tensors (no ``.item()``, so no
device sync). Shapes: every token tensor is (B, R); response_mask is 1 on counted tokens.

Notation: log r = logp − old_logp, r = exp(clamp(log r, −20, 20)), A = advantage, ε_low/ε_high
from clip_ratio_low/high (falling back to clip_ratio).

Masking: entries where response_mask == 0 never reach the loss, the metrics or the gradient,
even when they hold NaN: ``log_prob`` is first replaced by 0 there with ``torch.where`` (so its
gradient there is exactly 0) and every reduction is a masked sum.

clip_cov and kl_cov live in ``policy_losses_cov.py`` and register into the same table.

Example (fact sheet: ratios 0.5, 1.5, 5, 1 with A = 1, 1, −1, −1 and ε = 0.2 / 0.28):
    >>> old = torch.zeros(1, 4)
    >>> logp = torch.log(torch.tensor([[0.5, 1.5, 5.0, 1.0]]))
    >>> adv, mask = torch.tensor([[1., 1., -1., -1.]]), torch.ones(1, 4)
    >>> cfg = {"clip_ratio": 0.2, "clip_ratio_high": 0.28}
    >>> loss, metrics = get_policy_loss_fn("vanilla")(old, logp, adv, mask, "token-mean", cfg)
    >>> round(loss.item(), 4), metrics["actor/pg_clipfrac"].item(), metrics["actor/pg_clipfrac_lower"].item()
    (0.555, 0.25, 0.25)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

import stages.algos.policy_losses_cov as _cov  # noqa: F401  (registers clip_cov and kl_cov)
from stages.algos.aggregation import GlobalBatchInfo, aggregate_loss
from stages.algos.masked import MASK_EPS, masked_mean, masked_sum
from stages.algos.policy_loss_config import (
    POLICY_LOSSES,
    PolicyLossFn,
    log_ratio_clamped,
    register_policy_loss,
    resolve_global_info,
    resolve_policy_loss_config,
    zero_masked,
)

GlobalInfoArg = GlobalBatchInfo | Mapping[str, Any] | None


def get_policy_loss_fn(name: str) -> PolicyLossFn:
    """The loss registered as ``name`` (verl's API; ``POLICY_LOSSES.get(name)`` is its whole
    :class:`~stages.algos.policy_loss_config.PolicyLossSpec`); an unknown name raises KeyError
    listing the known ones."""
    return POLICY_LOSSES.get(name).fn


def _metrics(clipfrac: Tensor, ppo_kl: Tensor, clipfrac_lower: Tensor) -> dict[str, Tensor]:
    return {
        "actor/pg_clipfrac": clipfrac.detach(),
        "actor/ppo_kl": ppo_kl.detach(),
        "actor/pg_clipfrac_lower": clipfrac_lower.detach(),
    }


def _weighted(pg_losses: Tensor, rollout_is_weights: Tensor | None) -> Tensor:
    return pg_losses if rollout_is_weights is None else pg_losses * rollout_is_weights


@register_policy_loss(
    "vanilla", reads=("clip_ratio", "clip_ratio_low", "clip_ratio_high", "clip_ratio_c")
)
def compute_policy_loss_vanilla(
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
    """PPO clipped surrogate with dual clip (arXiv:1707.06347, arXiv:1912.09729).

    L1 = −A·r, L2 = −A·clamp(r, 1−ε_low, 1+ε_high), Lc = max(L1, L2);
    loss = min(Lc, −A·c) where A < 0, else Lc; then × rollout_is_weights; then agg_loss.

    Metrics: pg_clipfrac = mean[L2 > L1] (strict); pg_clipfrac_lower = mean[Lc > −A·c ∧ A < 0];
    ppo_kl = mean(−log r) with the ±20 clamp (may be negative). Means are over valid tokens of
    this micro-batch.

    Raises:
        ValueError: clip_ratio_c ≤ 1 (the dual clip needs c > 1).
    """
    cfg = resolve_policy_loss_config(config)
    if not cfg.clip_ratio_c > 1.0:
        raise ValueError(f"clip_ratio_c must be > 1 for dual-clip PPO, got {cfg.clip_ratio_c}")
    log_ratio = log_ratio_clamped(zero_masked(log_prob, response_mask), old_log_prob)  # (B, R)
    ratio = torch.exp(log_ratio)
    loss_unclipped = -advantages * ratio
    loss_clipped = -advantages * torch.clamp(ratio, 1 - cfg.clip_low, 1 + cfg.clip_high)
    loss_ppo = torch.maximum(loss_unclipped, loss_clipped)
    loss_dual_bound = -advantages * cfg.clip_ratio_c
    is_negative = advantages < 0
    pg_losses = torch.where(is_negative, torch.minimum(loss_ppo, loss_dual_bound), loss_ppo)
    pg_loss = aggregate_loss(
        _weighted(pg_losses, rollout_is_weights),
        response_mask,
        loss_agg_mode,
        resolve_global_info(cfg, global_batch_info),
    )
    return pg_loss, _metrics(
        masked_mean((loss_clipped > loss_unclipped).float(), response_mask),
        masked_mean(-log_ratio, response_mask),
        masked_mean(((loss_ppo > loss_dual_bound) & is_negative).float(), response_mask),
    )


@register_policy_loss("gspo", reads=("clip_ratio", "clip_ratio_low", "clip_ratio_high"))
def compute_policy_loss_gspo(
    old_log_prob: Tensor,
    log_prob: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    loss_agg_mode: str = "seq-mean-token-mean",
    config: Any = None,
    rollout_is_weights: Tensor | None = None,
    global_batch_info: GlobalInfoArg = None,
    generator: torch.Generator | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """GSPO: sequence-level ratio, token-level gradient (arXiv:2507.18071).

    s_i = masked mean over row i of log r (no clamp); token log-ratio
    ℓ_t = min(logp_t − sg(logp_t) + sg(s_i), 10) — its value is s_i, its gradient that of logp_t;
    ratio = exp(ℓ_t); loss = max(−A·ratio, −A·clamp(ratio, 1−ε_low, 1+ε_high)) (no dual clip),
    aggregated with the **given** loss_agg_mode (verl 0.9.1; the paper uses seq-mean-token-mean).

    Metrics: pg_clipfrac as vanilla; pg_clipfrac_lower = 0; ppo_kl = mean(−log r).
    """
    cfg = resolve_policy_loss_config(config)
    log_prob = zero_masked(log_prob, response_mask)
    log_ratio = log_prob - old_log_prob  # (B, R)
    seq_lengths = response_mask.sum(dim=-1).clamp(min=1)  # (B,)
    seq_log_ratio = masked_sum(log_ratio, response_mask, dim=-1) / seq_lengths  # (B,)
    token_log_ratio = log_prob - log_prob.detach() + seq_log_ratio.detach().unsqueeze(-1)  # (B, R)
    ratio = torch.exp(torch.clamp(token_log_ratio, max=10.0))
    loss_unclipped = -advantages * ratio
    loss_clipped = -advantages * torch.clamp(ratio, 1 - cfg.clip_low, 1 + cfg.clip_high)
    pg_losses = torch.maximum(loss_unclipped, loss_clipped)
    pg_loss = aggregate_loss(
        _weighted(pg_losses, rollout_is_weights),
        response_mask,
        loss_agg_mode,
        resolve_global_info(cfg, global_batch_info),
    )
    return pg_loss, _metrics(
        masked_mean((loss_clipped > loss_unclipped).float(), response_mask),
        masked_mean(-log_ratio, response_mask),
        torch.zeros((), device=pg_loss.device),
    )


@register_policy_loss("sapo", reads=("tau_pos", "tau_neg"))
def compute_policy_loss_sapo(
    old_log_prob: Tensor,
    log_prob: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    loss_agg_mode: str = "seq-mean-token-mean",
    config: Any = None,
    rollout_is_weights: Tensor | None = None,
    global_batch_info: GlobalInfoArg = None,
    generator: torch.Generator | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """SAPO: a smooth sigmoid gate instead of a hard clip (arXiv:2511.20347).

    f(r) = sigmoid(τ·(r − 1))·4/τ with τ = tau_pos where A > 0, tau_neg otherwise; loss = −f(r)·A.
    Always aggregated seq-mean-token-mean (``loss_agg_mode`` is ignored, as in verl).

    Metrics: pg_clipfrac = pg_clipfrac_lower = 0; ppo_kl = mean(−log r) (±20 clamp).
    """
    cfg = resolve_policy_loss_config(config)
    log_ratio = log_ratio_clamped(zero_masked(log_prob, response_mask), old_log_prob)  # (B, R)
    ratio = torch.exp(log_ratio)
    tau = torch.where(
        advantages > 0,
        torch.tensor(cfg.tau_pos, dtype=advantages.dtype, device=advantages.device),
        torch.tensor(cfg.tau_neg, dtype=advantages.dtype, device=advantages.device),
    )
    gates = torch.sigmoid(tau * (ratio - 1.0)) * (4.0 / tau)
    pg_losses = -gates * advantages
    pg_loss = aggregate_loss(
        _weighted(pg_losses, rollout_is_weights),
        response_mask,
        "seq-mean-token-mean",
        resolve_global_info(cfg, global_batch_info),
    )
    zero = torch.zeros((), device=pg_loss.device)
    return pg_loss, _metrics(zero, masked_mean(-log_ratio, response_mask), zero)


@register_policy_loss("gpg")
def compute_policy_loss_gpg(
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
    """GPG: plain policy gradient −logp·A (arXiv:2504.02546); no ratio, no metrics ({})."""
    cfg = resolve_policy_loss_config(config)
    pg_losses = -zero_masked(log_prob, response_mask) * advantages
    pg_loss = aggregate_loss(
        _weighted(pg_losses, rollout_is_weights),
        response_mask,
        loss_agg_mode,
        resolve_global_info(cfg, global_batch_info),
    )
    return pg_loss, {}


@register_policy_loss("cispo", reads=("clip_ratio", "clip_ratio_low", "clip_ratio_high"))
def compute_policy_loss_cispo(
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
    """CISPO: clipped, stop-gradient IS weight on a REINFORCE term (arXiv:2506.13585).

    loss = −sg(clamp(r, 1−ε_low, 1+ε_high))·A·logp; the gradient flows only through logp.

    Metrics: pg_clipfrac = mean[r ≠ clamp(r)]; pg_clipfrac_lower = 0; ppo_kl = mean(−log r).
    """
    cfg = resolve_policy_loss_config(config)
    log_prob = zero_masked(log_prob, response_mask)
    log_ratio = log_ratio_clamped(log_prob, old_log_prob)  # (B, R)
    ratio = torch.exp(log_ratio)
    clipped_ratio = torch.clamp(ratio, 1 - cfg.clip_low, 1 + cfg.clip_high)
    pg_losses = -clipped_ratio.detach() * advantages * log_prob
    pg_loss = aggregate_loss(
        _weighted(pg_losses, rollout_is_weights),
        response_mask,
        loss_agg_mode,
        resolve_global_info(cfg, global_batch_info),
    )
    return pg_loss, _metrics(
        masked_mean((ratio != clipped_ratio).float(), response_mask),
        masked_mean(-log_ratio, response_mask),
        torch.zeros((), device=pg_loss.device),
    )


@register_policy_loss("geo_mean", reads=("clip_ratio", "clip_ratio_low", "clip_ratio_high"))
def compute_policy_loss_geo_mean(
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
    """GMPO: geometric mean of sign-aware clipped token ratios (arXiv:2507.20673).

    ℓ_t = sign(A)·min(sign(A)·log r, sign(A)·clamp(log r, −ε_low, ε_high)) (no ±20 clamp);
    ratio_i = exp(mean_t ℓ_t), Â_i = mean_t A (masked means, + 1e-8 in the count);
    loss = plain mean over the B rows of −Â_i·ratio_i (× the rows' geometric-mean IS weight).
    ``loss_agg_mode`` and the global denominators are **ignored**, as in verl, so this loss is
    not invariant to micro-batch / DP splits.

    Metrics: pg_clipfrac = mean[ℓ clipped ∧ A > 0], pg_clipfrac_lower = mean[clipped ∧ A < 0].
    """
    cfg = resolve_policy_loss_config(config)
    log_ratio = zero_masked(log_prob, response_mask) - old_log_prob  # (B, R)
    sign = torch.sign(advantages)
    log_ratio_clip = torch.clamp(log_ratio, -cfg.clip_low, cfg.clip_high)
    log_ratio_min = sign * torch.minimum(sign * log_ratio, sign * log_ratio_clip)
    seq_counts = response_mask.sum(dim=-1) + MASK_EPS  # (B,)
    seq_ratio = torch.exp(masked_sum(log_ratio_min, response_mask, dim=-1) / seq_counts)  # (B,)
    seq_advantage = masked_sum(advantages, response_mask, dim=-1) / seq_counts  # (B,)
    seq_losses = -seq_advantage * seq_ratio
    if rollout_is_weights is not None:
        log_weights = torch.log(rollout_is_weights + 1e-10)
        seq_losses = seq_losses * torch.exp(
            masked_sum(log_weights, response_mask, dim=-1) / seq_counts
        )
    is_clipped = log_ratio != log_ratio_clip
    return seq_losses.mean(), _metrics(
        masked_mean((is_clipped & (advantages > 0)).float(), response_mask),
        masked_mean(-log_ratio, response_mask),
        masked_mean((is_clipped & (advantages < 0)).float(), response_mask),
    )
