"""Sequence-length balancing: spread a batch's compute evenly over DP ranks (or micro-batches).

Each row costs about ``workload(L) = 24576·L + L²`` for L tokens (dense-transformer FLOPs
12h²L + 2hL², divided by 2h, for hidden size h = 4096). Rows are split into k partitions with
near-equal workload sums by the Karmarkar–Karp largest-differencing method (k-way states); verl
0.9.1 uses it for ``trainer.balance_batch`` with equal-size partitions, one per actor DP rank.

Example (8 rows over 2 ranks):
    >>> seqlens = torch.tensor([10, 200, 30, 40, 500, 60, 70, 80])
    >>> permutation, metrics = balanced_permutation(seqlens, 2)
    >>> permutation.tolist()
    [0, 6, 4, 3, 2, 7, 1, 5]
    >>> metrics["global_seqlen/max"], metrics["global_seqlen/balanced_max"]  # rank token sums
    (710, 620)
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

import torch
from torch import Tensor

from dataproto import keys
from dataproto.protocol import DataProto

#: 6·h for h = 4096: the linear term of the per-row workload (relative units)
WORKLOAD_LINEAR_COEF = 24576


def calculate_workload(seqlens: Tensor) -> Tensor:
    """Relative compute per row: 24576·L + L², int64 (no overflow for long sequences).

    Example:
        >>> calculate_workload(torch.tensor([1, 100]))
        tensor([  24577, 2467600])
    """
    seqlens = seqlens.long()
    return WORKLOAD_LINEAR_COEF * seqlens + seqlens**2


class _Bucket:
    """One partition under construction: its sum and (index, value) items."""

    __slots__ = ("items", "total")

    def __init__(self) -> None:
        self.total = 0
        self.items: list[tuple[int, int]] = []

    def order_key(self) -> tuple:
        return (self.total, len(self.items), self.items)


class _State:
    """k buckets kept in decreasing order; the heap pops the state with the largest spread first."""

    __slots__ = ("buckets",)

    def __init__(self, buckets: list[_Bucket]) -> None:
        self.buckets = sorted(buckets, key=_Bucket.order_key, reverse=True)

    @property
    def spread(self) -> int:
        return self.buckets[0].total - self.buckets[-1].total

    def __lt__(self, other: _State) -> bool:
        if self.spread != other.spread:
            return self.spread > other.spread
        return self.buckets[0].order_key() > other.buckets[0].order_key()

    def absorb(self, other: _State) -> None:
        """Pair my largest bucket with the other's smallest, and so on; then re-sort."""
        for mine, theirs in zip(self.buckets, reversed(other.buckets)):
            mine.items.extend(theirs.items)
            mine.total += theirs.total
        self.buckets = sorted(self.buckets, key=_Bucket.order_key, reverse=True)


def _seed_state(items: list[tuple[int, int]], k: int) -> _State:
    buckets = [_Bucket() for _ in range(k)]
    for bucket, (idx, value) in zip(buckets, items):
        bucket.items.append((idx, value))
        bucket.total += value
    return _State(buckets)


def karmarkar_karp(
    seqlen_list: Sequence[int], k_partitions: int, equal_size: bool
) -> list[list[int]]:
    """k-way largest differencing method (Karmarkar–Karp) on integer values.

    Values are sorted ascending; each initial state holds k consecutive values, one per bucket
    (``equal_size``), or a single value. The two states with the largest spread (max − min bucket
    sum) are merged repeatedly, largest bucket with smallest, until one state remains.

    Returns:
        k lists of indices into ``seqlen_list`` (bucket order: decreasing sum). With ``equal_size``
        every list has ``len / k`` items; ``len`` must then be divisible by k.

    Example:
        >>> values = [8, 7, 6, 5, 4]  # (8|7) → (11|8) with 4 → (16|14) with (6|5)
        >>> [sum(values[i] for i in p) for p in karmarkar_karp(values, 2, equal_size=False)]
        [16, 14]
    """
    if equal_size and len(seqlen_list) % k_partitions:
        raise ValueError(
            f"equal-size partitioning needs the item count divisible by k: {len(seqlen_list)} items, k={k_partitions}"
        )
    ascending = sorted((int(value), idx) for idx, value in enumerate(seqlen_list))
    step = k_partitions if equal_size else 1
    heap = [
        _seed_state([(idx, value) for value, idx in ascending[start : start + step]], k_partitions)
        for start in range(0, len(ascending), step)
    ]
    heapq.heapify(heap)
    while len(heap) > 1:
        largest, second = heapq.heappop(heap), heapq.heappop(heap)
        largest.absorb(second)
        heapq.heappush(heap, largest)
    return (
        [[idx for idx, _ in bucket.items] for bucket in heap[0].buckets]
        if heap
        else [[] for _ in range(k_partitions)]
    )


def greedy_partition(
    seqlen_list: Sequence[int], k_partitions: int, equal_size: bool
) -> list[list[int]]:
    """Each item, in the given order, goes to the partition with the smallest sum (verl's greedy).

    With ``equal_size`` a bias larger than the total is added to every value, so counts stay
    balanced first (equal sizes when ``len`` is divisible by k).

    Example:
        >>> greedy_partition([8, 7, 6, 5, 4], 2, equal_size=False)
        [[0, 3, 4], [1, 2]]
    """
    bias = sum(int(v) for v in seqlen_list) + 1 if equal_size else 0
    partitions: list[list[int]] = [[] for _ in range(k_partitions)]
    sums = [0] * k_partitions
    for idx, value in enumerate(seqlen_list):
        target = min(range(k_partitions), key=sums.__getitem__)
        partitions[target].append(idx)
        sums[target] += int(value) + bias
    return partitions


def get_seqlen_balanced_partitions(
    seqlen_list: Sequence[int], k_partitions: int, equal_size: bool = True
) -> list[list[int]]:
    """Karmarkar–Karp partitions of ``range(len(seqlen_list))``, validated; each partition sorted.

    Raises ``ValueError`` when there are fewer items than partitions, when equal sizes are asked
    for an indivisible count, or when a partition comes out empty.

    Example:
        >>> get_seqlen_balanced_partitions([5, 1, 4, 2], 2)
        [[2, 3], [0, 1]]
    """
    n = len(seqlen_list)
    if k_partitions < 1:
        raise ValueError(f"k_partitions must be >= 1, got {k_partitions}")
    if n < k_partitions:
        raise ValueError(
            f"cannot split {n} items into {k_partitions} non-empty partitions; need at least {k_partitions} items"
        )
    partitions = karmarkar_karp(seqlen_list, k_partitions, equal_size)
    for i, partition in enumerate(partitions):
        if not partition:
            raise ValueError(f"partition {i} of {k_partitions} came out empty for {n} items")
    assert sorted(idx for p in partitions for idx in p) == list(range(n)), "every item exactly once"
    return [sorted(partition) for partition in partitions]


def arrange_partition(partition: Sequence[int], workloads: Sequence[int]) -> list[int]:
    """Order a partition's rows: sort by (workload, index), then evens followed by reversed odds.

    Small rows sit at both ends and large ones in the middle (fewer pipeline bubbles).

    Example:
        >>> arrange_partition([0, 1, 2, 3, 4], [50, 10, 40, 20, 30])
        [1, 4, 0, 2, 3]
    """
    ordered = sorted(partition, key=lambda idx: (workloads[idx], idx))
    return ordered[::2] + ordered[1::2][::-1]


def seqlen_balance_metrics(
    seqlens: Sequence[int], partitions: Sequence[Sequence[int]], prefix: str = "global_seqlen"
) -> dict[str, float]:
    """Token sums before and after balancing (verl's ``log_seqlen_unbalance``).

    ``min``/``max``/``minmax_diff``: over k contiguous chunks of the *original* order (what each rank
    would get without balancing); ``balanced_min``/``balanced_max``: over the partitions;
    ``mean``: total tokens / k.
    """
    k = len(partitions)
    chunk = max(len(seqlens) // k, 1)
    chunk_sums = [sum(seqlens[start : start + chunk]) for start in range(0, len(seqlens), chunk)]
    balanced_sums = [sum(seqlens[idx] for idx in partition) for partition in partitions]
    return {
        f"{prefix}/min": min(chunk_sums),
        f"{prefix}/max": max(chunk_sums),
        f"{prefix}/minmax_diff": max(chunk_sums) - min(chunk_sums),
        f"{prefix}/balanced_min": min(balanced_sums),
        f"{prefix}/balanced_max": max(balanced_sums),
        f"{prefix}/mean": sum(chunk_sums) / k,
    }


def balanced_permutation(
    seqlens: Tensor,
    dp_size: int,
    *,
    minibatch_size: int | None = None,
    prefix: str = "global_seqlen",
) -> tuple[Tensor, dict[str, float]]:
    """Row order that gives each of ``dp_size`` contiguous equal chunks a near-equal workload.

    Args:
        seqlens: (B,) tokens per row (prompt + response attention sum).
        dp_size: number of DP ranks k; B must be divisible by it.
        minibatch_size: when set, balance each consecutive mini-batch of this many rows separately
            (verl's ``keep_minibatch``); B must be divisible by it.

    Returns:
        ``(permutation (B,) int64, metrics)``: ``batch.reorder(permutation)`` (or select by it) puts
        rank r's rows at positions [r·B/k, (r+1)·B/k); metrics per :func:`seqlen_balance_metrics`.
    """
    lengths = [int(v) for v in seqlens.tolist()]
    workloads = calculate_workload(seqlens.cpu()).tolist()
    block = minibatch_size or len(lengths)
    if block <= 0 or len(lengths) % block:
        raise ValueError(
            f"batch of {len(lengths)} rows is not divisible into mini-batches of {minibatch_size}"
        )
    partitions: list[list[int]] = [[] for _ in range(dp_size)]
    for start in range(0, len(lengths), block):
        block_parts = get_seqlen_balanced_partitions(
            workloads[start : start + block], dp_size, equal_size=True
        )
        for rank, part in enumerate(block_parts):
            partitions[rank].extend(start + idx for idx in part)
    partitions = [arrange_partition(part, workloads) for part in partitions]
    permutation = torch.tensor([idx for part in partitions for idx in part], dtype=torch.long)
    return permutation, seqlen_balance_metrics(lengths, partitions, prefix)


def balance_batch(
    batch: DataProto, dp_size: int, *, minibatch_size: int | None = None
) -> tuple[Tensor, dict[str, float]]:
    """:func:`balanced_permutation` for a batch: L = per-row ``attention_mask`` sum (prompt + response).

    The batch is not modified; apply the permutation with ``batch.reorder(permutation)`` (verl,
    in place) or ``batch.select_idxs(permutation)``.
    """
    if batch.batch is None or keys.ATTENTION_MASK not in batch.batch:
        raise KeyError(
            f"balance_batch needs batch key {keys.ATTENTION_MASK!r} to measure sequence lengths"
        )
    attention_mask = batch.batch[keys.ATTENTION_MASK]
    seqlens = attention_mask.reshape(attention_mask.shape[0], -1).sum(-1)  # (B,)
    return balanced_permutation(seqlens, dp_size, minibatch_size=minibatch_size)
