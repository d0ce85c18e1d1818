"""DAPO's dynamic sampling: which prompt groups carry a learning signal (arXiv:2503.14476 §3.2).

A group is the ``G`` samples of one prompt (one ``uid``). With a group-relative estimator
(GRPO, RLOO, …) a group whose samples all got the same reward has advantage 0 on every sample,
so it adds nothing to the gradient. DAPO keeps only groups whose filter metric has non-zero
spread; a singleton group (G = 1) is always kept (verl's recipe and 0.9.1's replay buffer).

Spread is the population standard deviation (ddof = 0) of the metric over the group:
``std_g = sqrt(mean_g (v - mean_g v)²)``, and a group is kept when ``std_g > 0`` or ``|g| = 1``.
Exactly equal values give ``std_g == 0``; any difference gives ``std_g > 0``.
"""

from __future__ import annotations

import numpy as np


def group_ids(uid: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(group index per sample (B,), group size per group (U,)), groups numbered in order of
    first appearance.

    Example:
        >>> idx, sizes = group_ids(np.array(["b", "b", "a"], dtype=object))
        >>> idx.tolist(), sizes.tolist()
        ([0, 0, 1], [2, 1])
    """
    _, first, inverse, sizes = np.unique(
        np.asarray(uid).astype(str), return_index=True, return_inverse=True, return_counts=True
    )
    order = np.argsort(first, kind="stable")  # sorted-unique position → appearance rank
    rank = np.empty_like(order)
    rank[order] = np.arange(len(order))
    return rank[inverse.reshape(-1)], sizes[order]


def group_spread(uid: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(population std of ``values`` per group (U,), group sizes (U,)), groups in order of first
    appearance.

    Args:
        uid: (B,) prompt id; samples that share it form a group.
        values: (B,) the metric per sample (a score, an accuracy).

    Example:
        >>> std, sizes = group_spread(np.array([0, 0, 1, 1]), np.array([1.0, 0.0, 2.0, 2.0]))
        >>> std.tolist(), sizes.tolist()
        ([0.5, 0.0], [2, 2])
    """
    values = np.asarray(values, dtype=np.float64)
    if values.shape != (len(uid),):
        raise ValueError(f"values must have shape ({len(uid)},) like uid, got {values.shape}")
    idx, sizes = group_ids(uid)
    mean = np.bincount(idx, weights=values, minlength=len(sizes)) / sizes  # (U,)
    sq = np.bincount(idx, weights=(values - mean[idx]) ** 2, minlength=len(sizes))  # (U,)
    return np.sqrt(sq / sizes), sizes


def kept_group_mask(uid: np.ndarray, values: np.ndarray) -> np.ndarray:
    """(B,) bool: the samples of groups DAPO keeps (std of ``values`` > 0, or a singleton).

    Worked example: groups a = [1, 0] (std 0.5: kept), b = [1, 1] (std 0: filtered),
    c = [0] (singleton: kept).

    Example:
        >>> uid = np.array(["a", "a", "b", "b", "c"], dtype=object)
        >>> kept_group_mask(uid, np.array([1.0, 0.0, 1.0, 1.0, 0.0])).tolist()
        [True, True, False, False, True]
    """
    std, sizes = group_spread(uid, values)
    idx, _ = group_ids(uid)
    return ((std > 0) | (sizes == 1))[idx]


def first_groups_mask(uid: np.ndarray, groups: int) -> np.ndarray:
    """(B,) bool: the samples of the first ``groups`` groups in order of appearance (the trim to
    exactly ``data.train_batch_size`` prompts; verl's recipe keeps the first ones too).

    Example:
        >>> first_groups_mask(np.array([5, 5, 7, 7, 9, 9]), 2).tolist()
        [True, True, True, True, False, False]
    """
    if groups < 0:
        raise ValueError(f"groups must be >= 0, got {groups}")
    idx, _ = group_ids(uid)
    return idx < groups
