"""Micro-batch plans: which rows go into each forward/backward pass, and how to undo the order.

- :func:`split_by_token_budget` (``use_dynamic_bsz``): as few micro-batches as the token budget
  allows (``ppo_max_token_len_per_gpu``), with workloads balanced between them by Karmarkar–Karp
  (verl's ``rearrange_micro_batches``). Rows are regrouped, so outputs come back permuted.
- :func:`split_fixed_size` (``log_prob_micro_batch_size`` / ``ppo_micro_batch_size``): contiguous
  slices of a fixed row count, the last one possibly shorter.
- :func:`split_fixed_size_by_length`: the same counts with the rows sorted by length first, so
  each micro-batch holds rows of similar length (what the workers use: less padding per forward).
- :func:`restore_order`: concatenated per-micro-batch outputs → the original row order.

A plan is a list of index lists (row indices into the batch, one list per micro-batch).

Example (budget 10 tokens):
    >>> plan = split_by_token_budget(torch.tensor([6, 3, 4, 5]), max_token_len=10)
    >>> plan
    [[0, 1], [2, 3]]
    >>> restore_order([torch.tensor([60, 30]), torch.tensor([40, 50])], plan)
    tensor([60, 30, 40, 50])
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from stages.algos.balance import calculate_workload, get_seqlen_balanced_partitions


def _row_lengths(lengths_or_mask: Tensor | Sequence[int]) -> list[int]:
    lengths = torch.as_tensor(lengths_or_mask)
    if lengths.ndim == 2:  # an attention mask (B, T): tokens per row
        lengths = lengths.sum(dim=-1)
    if lengths.ndim != 1:
        raise ValueError(
            f"expected (B,) row lengths or a (B, T) attention mask, got shape {tuple(lengths.shape)}"
        )
    return [int(v) for v in lengths.tolist()]


def _micro_batch_count(
    lengths: list[int], max_token_len: int, min_num: int | None, divisor: int | None
) -> int:
    """Lower bound: ceil(total / budget), at least ``min_num``, rounded up to a multiple of ``divisor``."""
    count = min(len(lengths), -(-sum(lengths) // max_token_len))
    count = max(count, min_num or 1)
    if divisor:
        count = -(-count // divisor) * divisor
    return count


def split_by_token_budget(
    lengths_or_mask: Tensor | Sequence[int],
    max_token_len: int,
    *,
    min_num_micro_batches: int | None = None,
    num_batches_divided_by: int | None = None,
    balance_order: bool = True,
) -> list[list[int]]:
    """Partition rows into micro-batches of at most ``max_token_len`` tokens each.

    Starting from ceil(total tokens / budget) micro-batches, rows are split by Karmarkar–Karp on
    their workloads (24576·L + L²); while some micro-batch exceeds the budget, one more micro-batch
    (or ``num_batches_divided_by`` more) is tried. Every micro-batch is non-empty.

    Args:
        lengths_or_mask: (B,) tokens per row, or a (B, T) attention mask.
        max_token_len: token budget per micro-batch; every single row must fit.
        min_num_micro_batches: at least this many micro-batches (e.g. pipeline stages).
        num_batches_divided_by: make the count a multiple of this (e.g. virtual pipeline size).
        balance_order: order micro-batches by workload with the light ones at both ends (verl's
            ``use_dynamic_bsz_balance``); otherwise keep the partitioner's order.

    Returns:
        Index lists, one per micro-batch, each sorted ascending.

    Raises:
        ValueError: a row longer than the budget, or more micro-batches required than rows.
    """
    lengths = _row_lengths(lengths_or_mask)
    if max_token_len <= 0:
        raise ValueError(f"max_token_len must be positive, got {max_token_len}")
    if not lengths:
        return []
    longest = max(range(len(lengths)), key=lengths.__getitem__)
    if lengths[longest] > max_token_len:
        raise ValueError(
            f"row {longest} has {lengths[longest]} tokens, more than max_token_len={max_token_len}; "
            "raise ppo_max_token_len_per_gpu (or log_prob_max_token_len_per_gpu) to at least the longest sequence"
        )
    workloads = calculate_workload(torch.tensor(lengths)).tolist()
    count = _micro_batch_count(
        lengths, max_token_len, min_num_micro_batches, num_batches_divided_by
    )
    while True:
        if count > len(lengths):
            raise ValueError(
                f"cannot make {count} non-empty micro-batches from {len(lengths)} rows "
                f"(max_token_len={max_token_len}, min_num_micro_batches={min_num_micro_batches}, "
                f"num_batches_divided_by={num_batches_divided_by})"
            )
        plan = get_seqlen_balanced_partitions(workloads, count, equal_size=False)
        if all(sum(lengths[i] for i in part) <= max_token_len for part in plan):
            break
        count += num_batches_divided_by or 1
    return _order_by_workload(plan, workloads) if balance_order else plan


def _order_by_workload(plan: list[list[int]], workloads: list[int]) -> list[list[int]]:
    """Heaviest first by (workload sum, first row), then light micro-batches moved to both ends."""
    by_weight = sorted(
        plan, key=lambda part: (sum(workloads[i] for i in part), part[0]), reverse=True
    )
    return by_weight[::2][::-1] + by_weight[1::2]


def split_fixed_size(batch_size: int, micro_batch_size: int) -> list[list[int]]:
    """Contiguous micro-batches of ``micro_batch_size`` rows; the last may be shorter.

    Example:
        >>> split_fixed_size(5, 2)
        [[0, 1], [2, 3], [4]]
    """
    if micro_batch_size <= 0:
        raise ValueError(f"micro_batch_size must be positive, got {micro_batch_size}")
    return [
        list(range(start, min(start + micro_batch_size, batch_size)))
        for start in range(0, batch_size, micro_batch_size)
    ]


def split_fixed_size_by_length(
    lengths_or_mask: Tensor | Sequence[int], micro_batch_size: int
) -> list[list[int]]:
    """Micro-batches of ``micro_batch_size`` rows (the last may be shorter), the rows taken in
    order of length (ties in row order), each micro-batch's indices ascending.

    Under loss denominators of the whole mini-batch (ppoflow's, verl's ``global_batch_info``)
    the accumulated gradient does not depend on which rows share a micro-batch; a forward pads
    (or packs) its rows to the longest of them, so rows of similar length waste less.

    Example:
        >>> split_fixed_size_by_length(torch.tensor([9, 2, 8, 3, 5]), 2)
        [[1, 3], [2, 4], [0]]
    """
    if micro_batch_size <= 0:
        raise ValueError(f"micro_batch_size must be positive, got {micro_batch_size}")
    lengths = _row_lengths(lengths_or_mask)
    by_length = sorted(range(len(lengths)), key=lambda i: (lengths[i], i))
    return [
        sorted(by_length[start : start + micro_batch_size])
        for start in range(0, len(lengths), micro_batch_size)
    ]


def restore_order(outputs: Tensor | Sequence[Tensor], plan: Sequence[Sequence[int]]) -> Tensor:
    """Undo a plan: ``outputs`` (micro-batch results concatenated on dim 0, or their list) → original rows.

    Row j of the result is the output computed for batch row j.
    """
    stacked = torch.cat(list(outputs), dim=0) if not isinstance(outputs, Tensor) else outputs
    order = [idx for part in plan for idx in part]
    if len(order) != stacked.shape[0] or sorted(order) != list(range(len(order))):
        raise ValueError(
            f"plan does not match the outputs: {stacked.shape[0]} output rows, plan covers "
            f"{len(order)} indices that must be a permutation of 0..{stacked.shape[0] - 1}"
        )
    inverse = torch.empty(len(order), dtype=torch.long)
    inverse[torch.tensor(order, dtype=torch.long)] = torch.arange(len(order))
    return stacked[inverse.to(stacked.device)]
