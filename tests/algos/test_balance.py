"""Karmarkar–Karp partitioning and balance_batch."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from tensordict import TensorDict

from dataproto.protocol import DataProto
from stages.algos.balance import (
    arrange_partition,
    balance_batch,
    balanced_permutation,
    calculate_workload,
    get_seqlen_balanced_partitions,
    greedy_partition,
    karmarkar_karp,
    seqlen_balance_metrics,
)


def _spread(values, partitions) -> int:
    sums = [sum(values[i] for i in part) for part in partitions]
    return max(sums) - min(sums)


@pytest.mark.parametrize("seed", range(30))
def test_kk_equal_size_partitions_cover_every_item_once_and_beat_greedy(seed):
    rng = random.Random(seed)
    k = rng.randint(2, 8)
    n = k * rng.randint(1, 16)
    workloads = calculate_workload(
        torch.randint(1, 4096, (n,), generator=torch.Generator().manual_seed(seed))
    ).tolist()
    partitions = get_seqlen_balanced_partitions(workloads, k, equal_size=True)
    assert len(partitions) == k
    assert all(len(part) == n // k for part in partitions)
    assert sorted(i for part in partitions for i in part) == list(range(n))
    assert all(part == sorted(part) for part in partitions)
    assert _spread(workloads, partitions) <= _spread(
        workloads, greedy_partition(workloads, k, equal_size=True)
    )


def test_kk_unequal_sizes_can_trade_count_for_balance():
    values = [100, 1, 1, 1, 1, 96]
    partitions = karmarkar_karp(values, 2, equal_size=False)
    assert sorted(sum(values[i] for i in part) for part in partitions) == [100, 100]


def test_greedy_equal_size_keeps_counts_equal():
    partitions = greedy_partition([9, 1, 1, 1, 8, 2], 3, equal_size=True)
    assert [len(part) for part in partitions] == [2, 2, 2]


@pytest.mark.parametrize(
    ("values", "k", "equal", "message"),
    [
        ([1, 2], 3, True, "cannot split 2 items into 3"),
        ([1, 2, 3], 2, True, "divisible"),
        ([1, 2], 0, False, "k_partitions must be >= 1"),
    ],
)
def test_partition_preconditions_are_value_errors(values, k, equal, message):
    with pytest.raises(ValueError, match=message):
        get_seqlen_balanced_partitions(values, k, equal_size=equal)


def test_arrange_partition_puts_small_items_at_both_ends():
    # sorted by (workload, idx): 1(10) 3(20) 4(30) 2(40) 0(50) → evens [1, 4, 0] + reversed odds [2, 3]
    assert arrange_partition([0, 1, 2, 3, 4], [50, 10, 40, 20, 30]) == [1, 4, 0, 2, 3]
    assert arrange_partition([3, 1], [0, 5, 0, 5]) == [1, 3]  # ties broken by index


def test_metrics_use_original_chunks_and_balanced_partitions():
    seqlens = [10, 20, 30, 40]
    metrics = seqlen_balance_metrics(seqlens, [[0, 3], [1, 2]])
    assert metrics == {
        "global_seqlen/min": 30,  # chunk [10, 20]
        "global_seqlen/max": 70,  # chunk [30, 40]
        "global_seqlen/minmax_diff": 40,
        "global_seqlen/balanced_min": 50,
        "global_seqlen/balanced_max": 50,
        "global_seqlen/mean": 50.0,
    }


def _batch(seqlens: list[int], width: int = 64) -> DataProto:
    attention = (torch.arange(width)[None] < torch.tensor(seqlens)[:, None]).long()
    return DataProto(
        batch=TensorDict({"attention_mask": attention}, batch_size=[len(seqlens)]),
        non_tensor_batch={"uid": np.arange(len(seqlens)).astype(object)},
        meta_info={},
    )


def test_balance_batch_returns_a_permutation_that_balances_contiguous_chunks():
    seqlens = [60, 60, 60, 60, 5, 5, 5, 5]
    batch = _batch(seqlens)
    permutation, metrics = balance_batch(batch, dp_size=2)
    assert sorted(permutation.tolist()) == list(range(8))
    reordered = [seqlens[i] for i in permutation.tolist()]
    assert sum(reordered[:4]) == sum(reordered[4:]) == 130
    assert (metrics["global_seqlen/max"], metrics["global_seqlen/balanced_max"]) == (240, 130)
    assert batch.batch["attention_mask"].sum(-1).tolist() == seqlens  # input untouched


def test_balance_per_minibatch_keeps_rows_in_their_minibatch():
    seqlens = torch.tensor([50, 1, 40, 2, 9, 30, 8, 20])
    permutation, _ = balanced_permutation(seqlens, 2, minibatch_size=4)
    ranks = [permutation[:4].tolist(), permutation[4:].tolist()]
    for rank_rows in ranks:  # each rank gets 2 rows of mini-batch 0 and 2 of mini-batch 1
        assert sorted(r // 4 for r in rank_rows) == [0, 0, 1, 1]
    with pytest.raises(ValueError, match="not divisible into mini-batches of 3"):
        balanced_permutation(seqlens, 2, minibatch_size=3)


def test_balance_batch_needs_attention_mask():
    with pytest.raises(KeyError, match="attention_mask"):
        balance_batch(
            DataProto(batch=TensorDict({}, batch_size=[2]), non_tensor_batch={}, meta_info={}), 2
        )
