"""Outcome-reward advantage estimators that compare each sample with its prompt group.

Every function here reduces a row to its score s_i = Σ_t token_level_rewards[i, t] (over all R
columns, as verl does: the reward stage writes the score at the last valid token only), compares it
with the other samples that share its ``index`` (the prompt ``uid``), and broadcasts the resulting
scalar over the row: ``advantages = A_i · response_mask`` and ``returns = advantages``.

Names and parameters are verl 0.9.1's (``verl.trainer.ppo.core_algos``), so ported code only changes
its import. The group statistics are vectorised (``index_add_``/``bincount`` over group ids); the
tests hold the per-row loop versions as oracles.

Each function is registered in ``ADV_ESTIMATORS`` where it is defined, by
:func:`register_group_estimator`: the entry (``group_based``) calls it with ``index`` = the batch's
``uid`` and, for the GRPO family, ``config.norm_adv_by_std_in_grpo``.

Shapes: B samples, R response tokens, G groups.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from torch import Tensor

from dataproto import keys
from stages.algos.advantage_registry import AdvantageEstimatorFn, register_adv_est, require_input
from stages.algos.config_view import read_field
from stages.algos.masked import masked_whiten

#: ε added to the group std in GRPO-style normalisation (verl's default ``epsilon``)
GRPO_EPS = 1e-6


def register_group_estimator(
    name: str, *, reads_norm_flag: bool = False, min_group_size: int = 1
) -> Callable[[Callable], Callable]:
    """Decorator registering a verl group function as the ``group_based`` estimator ``name``.

    The registry entry ``<name>_advantages`` has the registry's signature: it requires ``index``
    (the batch's ``uid``, else ``KeyError``) and calls ``verl_fn(token_level_rewards,
    response_mask, index)``, adding ``norm_adv_by_std_in_grpo = read_field(config, …)`` when
    ``reads_norm_flag``. ``min_group_size`` is the entry's declared need. The decorated function is
    returned unchanged.
    """

    def add(verl_fn: Callable) -> Callable:
        entry = _group_entry(name, verl_fn, reads_norm_flag)
        register_adv_est(name, group_based=True, min_group_size=min_group_size)(entry)
        return verl_fn

    return add


def _group_entry(name: str, verl_fn: Callable, reads_norm_flag: bool) -> AdvantageEstimatorFn:
    """A registry entry for a group estimator: checks ``index`` and passes the config's flag."""

    def estimate(
        token_level_rewards,
        response_mask,
        *,
        index=None,
        values=None,
        reward_baselines=None,
        config=None,
    ):
        index = require_input(index, name, keys.UID, "(B,) prompt group ids, non-tensor layer")
        if reads_norm_flag:
            norm = read_field(config, "norm_adv_by_std_in_grpo")
            return verl_fn(token_level_rewards, response_mask, index, norm_adv_by_std_in_grpo=norm)
        return verl_fn(token_level_rewards, response_mask, index)

    estimate.__name__ = f"{name}_advantages"
    estimate.__qualname__ = estimate.__name__
    estimate.__doc__ = f"``{name}``: :func:`~stages.algos.advantages_group.{verl_fn.__name__}` with ``index = uid``."
    return estimate


def group_ids(
    index: np.ndarray | Tensor | list, device: torch.device | str | None = None
) -> tuple[Tensor, np.ndarray]:
    """Dense group ids for a per-row ``index``: ``(group (B,) int64 in [0, G), uids (G,))``.

    Rows with equal index values share a group; ``uids[group[i]] == index[i]``.

    Example:
        >>> group, uids = group_ids(np.array(["b", "a", "b"], dtype=object))
        >>> group.tolist(), uids.tolist()
        ([1, 0, 1], ['a', 'b'])
    """
    if isinstance(index, Tensor):
        uids, group = torch.unique(index, return_inverse=True)
        return group.to(device=device, dtype=torch.long), uids.cpu().numpy()
    array = np.asarray(index)
    if array.ndim != 1:
        raise ValueError(f"index must be 1-D with one group id per row, got shape {array.shape}")
    try:
        uids, inverse = np.unique(array, return_inverse=True)
    except TypeError:  # object array mixing unorderable types: group by equality instead
        first_seen = {value: i for i, value in reversed(list(enumerate(array.tolist())))}
        uids = np.empty(len(first_seen), dtype=object)
        uids[:] = list(first_seen)
        position = {value: g for g, value in enumerate(first_seen)}
        inverse = np.array([position[value] for value in array.tolist()], dtype=np.int64)
    return torch.as_tensor(inverse.reshape(-1), dtype=torch.long, device=device), uids


def group_mean_std(scores: Tensor, group: Tensor, num_groups: int) -> tuple[Tensor, Tensor, Tensor]:
    """Per-group ``(count, mean, std)``, each (G,); std is unbiased (N − 1).

    A singleton group gets mean 0 and std 1 (verl's convention), so it is neither centred nor scaled.

    Example:
        >>> count, mean, std = group_mean_std(torch.tensor([1., 0., 1., 1., 1.]),
        ...                                   torch.tensor([0, 0, 1, 1, 2]), 3)
        >>> count.tolist(), mean.tolist(), [round(v, 4) for v in std.tolist()]
        ([2, 2, 1], [0.5, 1.0, 0.0], [0.7071, 0.0, 1.0])
    """
    count = torch.bincount(group, minlength=num_groups)  # (G,)
    total = scores.new_zeros(num_groups).index_add_(0, group, scores)
    mean = total / count.clamp_min(1)
    squared_dev = scores.new_zeros(num_groups).index_add_(0, group, (scores - mean[group]) ** 2)
    std = (squared_dev / (count - 1).clamp_min(1)).sqrt()
    is_singleton = count == 1
    mean = torch.where(is_singleton, torch.zeros_like(mean), mean)
    std = torch.where(is_singleton, torch.ones_like(std), std)
    return count, mean, std


def _broadcast(seq_advantages: Tensor, response_mask: Tensor) -> tuple[Tensor, Tensor]:
    """(B,) per-sequence advantage → (B, R) advantages = returns = A_i · mask."""
    advantages = seq_advantages.unsqueeze(-1) * response_mask
    return advantages, advantages


def _scores_and_groups(token_level_rewards: Tensor, index) -> tuple[Tensor, Tensor, np.ndarray]:
    scores = token_level_rewards.sum(dim=-1)  # (B,)
    group, uids = group_ids(index, device=scores.device)
    if group.shape[0] != scores.shape[0]:
        raise ValueError(
            f"index has {group.shape[0]} rows but token_level_rewards has {scores.shape[0]}"
        )
    return scores, group, uids


@register_group_estimator("grpo", reads_norm_flag=True)
@torch.no_grad()
def compute_grpo_outcome_advantage(
    token_level_rewards: Tensor,
    response_mask: Tensor,
    index: np.ndarray,
    epsilon: float = GRPO_EPS,
    norm_adv_by_std_in_grpo: bool = True,
    config=None,
) -> tuple[Tensor, Tensor]:
    """Group-relative advantage (GRPO, arXiv:2402.03300); Dr.GRPO (arXiv:2503.20783) without std.

    A_i = (s_i − mean_g s) / (std_g s + ε) with std unbiased (N − 1), or A_i = s_i − mean_g s when
    ``norm_adv_by_std_in_grpo`` is False. A singleton group uses mean 0 and std 1, so
    A_i = s_i / (1 + ε); a group with equal scores gets 0.

    Args:
        token_level_rewards: (B, R); s_i is the row sum.
        response_mask: (B, R) 1 on response tokens.
        index: (B,) prompt uid; rows that share it form a group.
        epsilon: ε added to the std.
        norm_adv_by_std_in_grpo: divide by the group std (True) or only centre (False, Dr.GRPO).
        config: accepted for verl's signature and not read (verl's trainer passes the flag directly).

    Returns:
        (advantages, returns), both (B, R) and equal: A_i · response_mask.

    Example (groups {1, 0}, {1, 1} and a singleton {1}):
        >>> rewards, mask = torch.tensor([[1.], [0.], [1.], [1.], [1.]]), torch.ones(5, 1)
        >>> uid = np.array(["a", "a", "b", "b", "c"], dtype=object)
        >>> compute_grpo_outcome_advantage(rewards, mask, uid)[0].squeeze(-1)
        tensor([ 0.7071, -0.7071,  0.0000,  0.0000,  1.0000])
        >>> compute_grpo_outcome_advantage(rewards, mask, uid, norm_adv_by_std_in_grpo=False)[0].squeeze(-1)
        tensor([ 0.5000, -0.5000,  0.0000,  0.0000,  1.0000])
    """
    scores, group, uids = _scores_and_groups(token_level_rewards, index)
    _, mean, std = group_mean_std(scores, group, len(uids))
    centred = scores - mean[group]
    seq_advantages = centred / (std[group] + epsilon) if norm_adv_by_std_in_grpo else centred
    return _broadcast(seq_advantages, response_mask)


@register_group_estimator("grpo_vectorized", reads_norm_flag=True)
def compute_grpo_vectorized_outcome_advantage(
    token_level_rewards: Tensor,
    response_mask: Tensor,
    index: np.ndarray,
    epsilon: float = GRPO_EPS,
    norm_adv_by_std_in_grpo: bool = True,
    config=None,
) -> tuple[Tensor, Tensor]:
    """verl's ``grpo_vectorized``: in 0.9.1 (variance floor 0) it equals GRPO; see
    :func:`compute_grpo_outcome_advantage`, which is already vectorised here."""
    return compute_grpo_outcome_advantage(
        token_level_rewards, response_mask, index, epsilon, norm_adv_by_std_in_grpo, config
    )


@register_group_estimator("grpo_passk", reads_norm_flag=True, min_group_size=2)  # best vs runner-up
@torch.no_grad()
def compute_grpo_passk_outcome_advantage(
    token_level_rewards: Tensor,
    response_mask: Tensor,
    index: np.ndarray,
    epsilon: float = GRPO_EPS,
    norm_adv_by_std_in_grpo: bool = True,
    config=None,
) -> tuple[Tensor, Tensor]:
    """Pass@k advantage (arXiv:2503.19595): only each group's best sample is credited.

    For the group's top row (largest s): A = (s_max − s_2nd) / (std_g + ε) (unbiased std; without
    the division when ``norm_adv_by_std_in_grpo`` is False); every other row gets 0. Every group
    needs ≥ 2 samples. ``config.norm_adv_by_std_in_grpo``, when the config has it, overrides the
    argument (verl reads the flag from the config).

    Example:
        >>> compute_grpo_passk_outcome_advantage(torch.tensor([[1.], [0.]]), torch.ones(2, 1),
        ...                                      np.array(["a", "a"], dtype=object))[0].squeeze(-1)
        tensor([1.4142, 0.0000])
    """
    if config is not None:
        norm_adv_by_std_in_grpo = read_field(config, "norm_adv_by_std_in_grpo")
    scores, group, uids = _scores_and_groups(token_level_rewards, index)
    count, _, std = group_mean_std(scores, group, len(uids))
    too_small = torch.nonzero(count < 2).flatten().tolist()
    if too_small:
        raise ValueError(
            f"grpo_passk needs at least 2 samples per group; group uid={uids[too_small[0]]!r} has "
            f"{int(count[too_small[0]])}. Set rollout.n >= 2"
        )
    by_score = torch.argsort(scores, descending=True, stable=True)
    order = by_score[torch.argsort(group[by_score], stable=True)]  # rows by (group, score desc)
    starts = torch.cumsum(count, 0) - count  # (G,) first position of each group in `order`
    best, runner_up = order[starts], order[starts + 1]
    gap = scores[best] - scores[runner_up]  # (G,)
    if norm_adv_by_std_in_grpo:
        gap = gap / (std + epsilon)
    seq_advantages = torch.zeros_like(scores).index_copy_(0, best, gap)
    return _broadcast(seq_advantages, response_mask)


@torch.no_grad()
def _leave_one_out(token_level_rewards, response_mask, index, singleton_keeps_score: bool):
    """A_i = (n·s_i − Σ_g s)/(n − 1) for groups of n > 1; singletons keep s_i or get 0."""
    scores, group, uids = _scores_and_groups(token_level_rewards, index)
    count = torch.bincount(group, minlength=len(uids))  # (G,)
    total = scores.new_zeros(len(uids)).index_add_(0, group, scores)
    n = count[group].to(scores.dtype)  # (B,)
    loo = (n * scores - total[group]) / (n - 1).clamp_min(1)  # s_i − mean of the others
    singleton_value = scores if singleton_keeps_score else torch.zeros_like(scores)
    return _broadcast(torch.where(n > 1, loo, singleton_value), response_mask)


@register_group_estimator("rloo")
def compute_rloo_outcome_advantage(
    token_level_rewards: Tensor,
    response_mask: Tensor,
    index: np.ndarray,
    epsilon: float = GRPO_EPS,
    config=None,
    **kwargs,
) -> tuple[Tensor, Tensor]:
    """REINFORCE leave-one-out (RLOO, arXiv:2402.14740), verl's loop version.

    For a group of n > 1: A_i = s_i·n/(n−1) − mean_g·n/(n−1) = s_i − mean of the other n−1 scores.
    **A singleton keeps A_i = s_i** (compare :func:`compute_rloo_vectorized_outcome_advantage`).

    Example:
        >>> rewards, mask = torch.tensor([[1.], [0.], [1.], [1.], [1.]]), torch.ones(5, 1)
        >>> uid = np.array(["a", "a", "b", "b", "c"], dtype=object)
        >>> compute_rloo_outcome_advantage(rewards, mask, uid)[0].squeeze(-1)
        tensor([ 1., -1.,  0.,  0.,  1.])
    """
    return _leave_one_out(token_level_rewards, response_mask, index, singleton_keeps_score=True)


@register_group_estimator("rloo_vectorized")
def compute_rloo_vectorized_outcome_advantage(
    token_level_rewards: Tensor,
    response_mask: Tensor,
    index: np.ndarray,
    epsilon: float = GRPO_EPS,
    config=None,
    **kwargs,
) -> tuple[Tensor, Tensor]:
    """RLOO as verl's ``rloo_vectorized``: the same for n > 1, but **a singleton gets 0**.

    Example:
        >>> rewards, mask = torch.tensor([[1.], [0.], [1.], [1.], [1.]]), torch.ones(5, 1)
        >>> uid = np.array(["a", "a", "b", "b", "c"], dtype=object)
        >>> compute_rloo_vectorized_outcome_advantage(rewards, mask, uid)[0].squeeze(-1)
        tensor([ 1., -1.,  0.,  0.,  0.])
    """
    return _leave_one_out(token_level_rewards, response_mask, index, singleton_keeps_score=False)


@register_group_estimator("opo")
@torch.no_grad()
def compute_opo_outcome_advantage(
    token_level_rewards: Tensor,
    response_mask: Tensor,
    index: np.ndarray,
    epsilon: float = GRPO_EPS,
    config=None,
    **kwargs,
) -> tuple[Tensor, Tensor]:
    """On-policy optimal baseline (OPO, arXiv:2505.23585): a length-weighted group mean.

    b_g = Σ_g(len_i·s_i) / Σ_g len_i with len_i = Σ_t response_mask; A_i = s_i − b_g; a singleton's
    baseline is 0. A group whose responses are all empty (Σ len = 0) gets baseline 0 (verl: 0/0).

    Example (lengths 1 and 3, scores 1 and 0 → b = 0.25):
        >>> mask = torch.tensor([[1., 0., 0.], [1., 1., 1.]])
        >>> rewards = torch.tensor([[1., 0., 0.], [0., 0., 0.]])
        >>> compute_opo_outcome_advantage(rewards, mask, np.array([0, 0]))[0]
        tensor([[ 0.7500,  0.0000,  0.0000],
                [-0.2500, -0.2500, -0.2500]])
    """
    scores, group, uids = _scores_and_groups(token_level_rewards, index)
    lengths = response_mask.sum(dim=-1).to(scores.dtype)  # (B,)
    count = torch.bincount(group, minlength=len(uids))
    weighted = scores.new_zeros(len(uids)).index_add_(0, group, lengths * scores)
    total_length = scores.new_zeros(len(uids)).index_add_(0, group, lengths)
    has_baseline = (count > 1) & (total_length > 0)
    baseline = torch.where(
        has_baseline, weighted / total_length.clamp_min(1e-30), torch.zeros_like(weighted)
    )
    return _broadcast(scores - baseline[group], response_mask)


@register_group_estimator("gpg")
@torch.no_grad()
def compute_gpg_outcome_advantage(
    token_level_rewards: Tensor,
    response_mask: Tensor,
    index: np.ndarray,
    epsilon: float = GRPO_EPS,
    f_norm: float = 1.0,
    alpha: float = 1.0,
    config=None,
    **kwargs,
) -> tuple[Tensor, Tensor]:
    """Group policy gradient (GPG, arXiv:2504.02546).

    A_i = α·(s_i − mean_g s) / f_norm with α = B / max(1, #{i: s_i ≠ 0}) over the whole batch
    (the ``alpha`` argument is overwritten, as in verl); a singleton's mean is 0.

    Example (α = 5/4):
        >>> rewards, mask = torch.tensor([[1.], [0.], [1.], [1.], [1.]]), torch.ones(5, 1)
        >>> uid = np.array(["a", "a", "b", "b", "c"], dtype=object)
        >>> compute_gpg_outcome_advantage(rewards, mask, uid)[0].squeeze(-1)
        tensor([ 0.6250, -0.6250,  0.0000,  0.0000,  1.2500])
    """
    scores, group, uids = _scores_and_groups(token_level_rewards, index)
    alpha = scores.shape[0] / torch.count_nonzero(scores).clamp_min(1)
    _, mean, _ = group_mean_std(scores, group, len(uids))
    return _broadcast(alpha * (scores - mean[group]) / f_norm, response_mask)


@register_group_estimator("reinforce_plus_plus_baseline")
@torch.no_grad()
def compute_reinforce_plus_plus_baseline_outcome_advantage(
    token_level_rewards: Tensor,
    response_mask: Tensor,
    index: np.ndarray,
    epsilon: float = GRPO_EPS,
    config=None,
    **kwargs,
) -> tuple[Tensor, Tensor]:
    """REINFORCE++ with a group-mean baseline (arXiv:2501.03262), whitened over the batch.

    A = masked_whiten((s_i − mean_g s)·mask, mask)·mask, statistics over all valid tokens of the
    batch (a singleton's mean is 0). Needs ≥ 2 valid tokens in the batch.

    Example:
        >>> rewards, mask = torch.tensor([[1., 0.], [0., 0.]]), torch.ones(2, 2)
        >>> compute_reinforce_plus_plus_baseline_outcome_advantage(rewards, mask, np.array([0, 0]))[0]
        tensor([[ 0.8660,  0.8660],
                [-0.8660, -0.8660]])
    """
    scores, group, uids = _scores_and_groups(token_level_rewards, index)
    _, mean, _ = group_mean_std(scores, group, len(uids))
    tiled = (scores - mean[group]).unsqueeze(-1) * response_mask  # (B, R)
    advantages = masked_whiten(tiled, response_mask) * response_mask
    return advantages, advantages
