"""Covariance-based entropy-preserving PPO losses: clip_cov and kl_cov (arXiv:2505.22617).

Both score each valid token by the centred covariance
cov_t = (A_t − mean A)·(logp_t − mean logp) (means over the valid tokens of the micro-batch,
logp detached) and treat the high-covariance tokens specially, since those drive entropy collapse.
Registered in ``POLICY_LOSSES`` with the common signature; see ``policy_losses.py`` for the
conventions (shapes (B, R), masking, metrics as detached tensors).

Selection needs the number of valid tokens on the host, so each call synchronises once with the
device (as verl does).

Example (kl_cov with kl_cov_ratio 0.5: the 2 highest-covariance of 4 tokens get +coef·|log r|):
    >>> old = torch.zeros(1, 4)
    >>> logp = torch.tensor([[-0.1, -2.0, -0.5, -3.0]])
    >>> adv, mask = torch.tensor([[1., -1., 1., -1.]]), torch.ones(1, 4)
    >>> cfg = {"policy_loss": {"kl_cov_ratio": 0.5, "ppo_kl_coef": 1.0}}
    >>> loss, _ = compute_policy_loss_kl_cov(old, logp, adv, mask, "token-sum", cfg)
    >>> round(loss.item(), 4)  # cov = (1.3, 0.6, 0.9, 1.6): Σ −A·r = −1.3262, + |−0.1| + |−3.0|
    1.7738
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

from stages.algos.aggregation import GlobalBatchInfo, aggregate_loss
from stages.algos.masked import masked_mean
from stages.algos.policy_loss_config import (
    register_policy_loss,
    resolve_global_info,
    resolve_policy_loss_config,
    zero_masked,
)

GlobalInfoArg = GlobalBatchInfo | Mapping[str, Any] | None


def token_covariance(advantages: Tensor, log_prob: Tensor, response_mask: Tensor) -> Tensor:
    """(B, R) centred covariance (A − mean A)·(logp − mean logp), means over valid tokens, detached.

    Example:
        >>> token_covariance(torch.tensor([[1., -1.]]), torch.tensor([[-1., -3.]]), torch.ones(1, 2))
        tensor([[1., 1.]])
    """
    log_prob = log_prob.detach()
    centred_adv = advantages.detach() - masked_mean(advantages.detach(), response_mask)
    return centred_adv * (log_prob - masked_mean(log_prob, response_mask))


def _num_selected(ratio: float, num_valid: int) -> int:
    """max(1, ⌊ratio·N_valid⌋), capped at N_valid."""
    return min(max(int(ratio * num_valid), 1), num_valid)


@register_policy_loss(
    "clip_cov",
    reads=(
        "clip_ratio",
        "clip_ratio_low",
        "clip_ratio_high",
        "clip_cov_ratio",
        "clip_cov_lb",
        "clip_cov_ub",
    ),
)
def compute_policy_loss_clip_cov(
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
    """Clip-Cov: drop the gradient of a random few high-covariance tokens.

    r = exp(log r) (no ±20 clamp, as verl); L = max(−A·r, −A·clamp(r, 1−ε_low, 1+ε_high)) (no dual
    clip). Candidates: valid tokens not clipped by PPO with clip_cov_lb < cov_t < clip_cov_ub; a
    uniformly random subset of max(1, ⌊clip_cov_ratio·N_valid⌋) of them (fewer if there are fewer
    candidates) gets L × 0. ``generator`` makes the draw reproducible.

    Metrics: pg_clipfrac = fraction of valid tokens zeroed; ppo_kl = mean(−log r).

    Raises:
        ValueError: clip_cov_ratio ≤ 0.
    """
    cfg = resolve_policy_loss_config(config)
    if not cfg.clip_cov_ratio > 0:
        raise ValueError(
            f"policy_loss.clip_cov_ratio must be > 0 for clip_cov, got {cfg.clip_cov_ratio}"
        )
    log_prob = zero_masked(log_prob, response_mask)
    log_ratio = log_prob - old_log_prob  # (B, R)
    ratio = torch.exp(log_ratio)
    loss_unclipped = -advantages * ratio
    loss_clipped = -advantages * torch.clamp(ratio, 1 - cfg.clip_low, 1 + cfg.clip_high)
    is_valid = response_mask.bool()
    cov = token_covariance(advantages, log_prob, response_mask)
    is_candidate = (
        is_valid
        & ~(loss_clipped > loss_unclipped)
        & (cov > cfg.clip_cov_lb)
        & (cov < cfg.clip_cov_ub)
    )
    candidates = torch.nonzero(is_candidate.reshape(-1), as_tuple=True)[0]  # (n_candidates,)
    keep = torch.ones_like(advantages)
    num_valid = int(is_valid.sum())
    if len(candidates) > 0:
        device = generator.device if generator is not None else candidates.device
        order = torch.randperm(len(candidates), generator=generator, device=device).to(
            candidates.device
        )
        chosen = candidates[order[: _num_selected(cfg.clip_cov_ratio, num_valid)]]
        keep.view(-1)[chosen] = 0.0
    pg_losses = torch.maximum(loss_unclipped, loss_clipped) * keep
    if rollout_is_weights is not None:
        pg_losses = pg_losses * rollout_is_weights
    pg_loss = aggregate_loss(
        pg_losses, response_mask, loss_agg_mode, resolve_global_info(cfg, global_batch_info)
    )
    return pg_loss, {
        "actor/pg_clipfrac": masked_mean((keep == 0).float(), response_mask).detach(),
        "actor/ppo_kl": masked_mean(-log_ratio, response_mask).detach(),
    }


@register_policy_loss("kl_cov", reads=("kl_cov_ratio", "ppo_kl_coef"))
def compute_policy_loss_kl_cov(
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
    """KL-Cov: add a |log r| penalty on the top-k covariance tokens.

    r = exp(log r) (no clamp); loss = −A·r, plus ppo_kl_coef·|log r| on the k = max(1,
    ⌊kl_cov_ratio·N_valid⌋) valid tokens with the largest cov_t (deterministic: no sampling).
    Note ppo_kl_coef defaults to 0.1 (verl's yaml; verl's code falls back to 1.0 only on None).

    Metrics: ppo_kl = mean |log r| over valid tokens.

    Raises:
        ValueError: kl_cov_ratio ≤ 0.
    """
    cfg = resolve_policy_loss_config(config)
    if not cfg.kl_cov_ratio > 0:
        raise ValueError(f"policy_loss.kl_cov_ratio must be > 0 for kl_cov, got {cfg.kl_cov_ratio}")
    log_prob = zero_masked(log_prob, response_mask)
    abs_log_ratio = (log_prob - old_log_prob).abs()  # (B, R)
    pg_losses = -advantages * torch.exp(log_prob - old_log_prob)
    valid = torch.nonzero(response_mask.bool().reshape(-1), as_tuple=True)[0]  # (N_valid,)
    if len(valid) > 0:
        cov = token_covariance(advantages, log_prob, response_mask).reshape(-1)[valid]
        top = valid[torch.topk(cov, _num_selected(cfg.kl_cov_ratio, len(valid))).indices]
        is_selected = torch.zeros(pg_losses.numel(), dtype=torch.bool, device=pg_losses.device)
        is_selected[top] = True
        penalty = cfg.ppo_kl_coef * abs_log_ratio
        pg_losses = torch.where(is_selected.view_as(pg_losses), pg_losses + penalty, pg_losses)
    if rollout_is_weights is not None:
        pg_losses = pg_losses * rollout_is_weights
    pg_loss = aggregate_loss(
        pg_losses, response_mask, loss_agg_mode, resolve_global_info(cfg, global_batch_info)
    )
    return pg_loss, {"actor/ppo_kl": masked_mean(abs_log_ratio, response_mask).detach()}
