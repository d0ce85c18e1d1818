"""Token-budget and fixed-size micro-batch plans, and restoring the row order."""

from __future__ import annotations

import pytest
import torch

from stages.algos.micro_batch import (
    restore_order,
    split_by_token_budget,
    split_fixed_size,
    split_fixed_size_by_length,
)


@pytest.mark.parametrize("seed", range(20))
def test_budget_is_respected_every_row_once_and_order_restored(seed):
    gen = torch.Generator().manual_seed(seed)
    rows = int(torch.randint(1, 40, (1,), generator=gen))
    lengths = torch.randint(1, 257, (rows,), generator=gen)
    budget = int(torch.randint(256, 1025, (1,), generator=gen))
    plan = split_by_token_budget(lengths, budget)
    assert all(part and sum(lengths[i].item() for i in part) <= budget for part in plan)
    assert sorted(i for part in plan for i in part) == list(range(rows))
    assert len(plan) >= -(-int(lengths.sum()) // budget)
    outputs = [lengths[part] * 10 for part in plan]  # stand-in for per-micro-batch model outputs
    assert torch.equal(restore_order(outputs, plan), lengths * 10)
    assert torch.equal(restore_order(torch.cat(outputs), plan), lengths * 10)


def test_attention_mask_input_counts_tokens_per_row():
    mask = torch.tensor([[1, 1, 1, 0], [0, 1, 1, 1], [1, 0, 0, 0], [1, 1, 0, 0]])
    assert split_by_token_budget(mask, 4) == split_by_token_budget([3, 3, 1, 2], 4)


def test_minimum_count_and_divisibility():
    lengths = [5] * 8
    assert len(split_by_token_budget(lengths, 100)) == 1
    assert len(split_by_token_budget(lengths, 100, min_num_micro_batches=3)) == 3
    assert (
        len(split_by_token_budget(lengths, 100, min_num_micro_batches=3, num_batches_divided_by=2))
        == 4
    )


def test_light_micro_batches_sit_at_both_ends():
    lengths = [100, 90, 10, 10, 50, 40, 30]
    plan = split_by_token_budget(lengths, 100, balance_order=True)
    workloads = [sum(24576 * lengths[i] + lengths[i] ** 2 for i in part) for part in plan]
    assert len(plan) >= 4
    assert sorted([workloads[0], workloads[-1]]) == sorted(workloads)[:2]


def test_row_longer_than_budget_and_too_many_batches_are_errors():
    with pytest.raises(ValueError, match="row 1 has 300 tokens, more than max_token_len=256"):
        split_by_token_budget([10, 300, 20], 256)
    with pytest.raises(ValueError, match="cannot make 4 non-empty micro-batches from 3 rows"):
        split_by_token_budget([10, 20, 30], 100, min_num_micro_batches=4)
    assert split_by_token_budget([], 10) == []


def test_fixed_size_plan():
    assert split_fixed_size(5, 2) == [[0, 1], [2, 3], [4]]
    assert split_fixed_size(0, 4) == []
    with pytest.raises(ValueError, match="micro_batch_size must be positive"):
        split_fixed_size(4, 0)


def test_fixed_size_by_length_groups_rows_of_similar_length():
    lengths = torch.tensor([7, 2, 9, 2, 5, 8, 1])
    plan = split_fixed_size_by_length(lengths, 3)
    assert plan == [[1, 3, 6], [0, 4, 5], [2]]  # lengths {1, 2, 2}, {5, 7, 8}, {9}; ties by row
    assert sorted(i for part in plan for i in part) == list(range(7))
    mask = (torch.arange(10)[None, :] < lengths[:, None]).long()  # a (B, T) mask works too
    assert split_fixed_size_by_length(mask, 3) == plan
    values = torch.arange(7) * 10
    assert torch.equal(restore_order([values[part] for part in plan], plan), values)
    assert split_fixed_size_by_length([], 4) == []
    with pytest.raises(ValueError, match="micro_batch_size must be positive"):
        split_fixed_size_by_length([3, 4], 0)


def test_restore_order_rejects_a_plan_that_does_not_fit():
    with pytest.raises(ValueError, match="plan does not match the outputs"):
        restore_order(torch.zeros(3), [[0, 1], [1]])
