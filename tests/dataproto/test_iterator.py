"""make_iterator (mini-batch count, seeded shuffling, meta_info) and collate_fn."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from dataproto import DataProto, collate_fn


def rows(n: int) -> DataProto:
    return DataProto.from_dict(
        {"x": torch.arange(n), "y": torch.arange(2 * n).reshape(n, 2)},
        {"uid": np.array([f"p{i}" for i in range(n)], dtype=object)},
        {"temperature": 0.7},
    )


def order(batches) -> list[int]:
    return [int(v) for b in batches for v in b.batch["x"]]


def test_count_is_epochs_times_len_over_mini_batch_size():
    batches = list(rows(12).make_iterator(mini_batch_size=4, epochs=3))
    assert len(batches) == 3 * 12 // 4
    assert all(len(b) == 4 for b in batches)
    assert order(batches[:3]) == list(range(12))  # no shuffle: sequential


def test_every_mini_batch_carries_the_meta_info_object():
    data = rows(4)
    assert all(b.meta_info is data.meta_info for b in data.make_iterator(2, epochs=1))


def test_rows_stay_aligned_across_layers():
    for batch in rows(8).make_iterator(4, epochs=1, seed=3, dataloader_kwargs={"shuffle": True}):
        assert [f"p{v}" for v in batch.batch["x"].tolist()] == batch.non_tensor_batch[
            "uid"
        ].tolist()
        assert torch.equal(batch.batch["y"][:, 0], 2 * batch.batch["x"])


def item_loader_order(data: DataProto, mini_batch_size: int, epochs: int, seed: int) -> list[int]:
    """Oracle: verl's construction, a DataLoader over the DataProto item by item + collate_fn."""
    generator = torch.Generator().manual_seed(seed)
    loader = DataLoader(
        data, batch_size=mini_batch_size, collate_fn=collate_fn, generator=generator, shuffle=True
    )
    return [int(v) for _ in range(epochs) for b in loader for v in b.batch["x"]]


def test_seeded_shuffle_is_deterministic_and_matches_the_item_loader():
    data = rows(16)
    kwargs = {"shuffle": True}
    first = order(data.make_iterator(4, epochs=2, seed=7, dataloader_kwargs=kwargs))
    second = order(data.make_iterator(4, epochs=2, seed=7, dataloader_kwargs=kwargs))
    assert first == second
    assert first == item_loader_order(data, 4, epochs=2, seed=7)
    assert first[:16] != first[16:]  # each epoch draws a new permutation
    other_seed = order(data.make_iterator(4, epochs=2, seed=8, dataloader_kwargs=kwargs))
    assert other_seed != first and sorted(other_seed) == sorted(first)


def test_works_without_a_tensor_batch():
    data = DataProto.from_dict(non_tensors={"uid": ["a", "b", "c", "d"]})
    assert [b.non_tensor_batch["uid"].tolist() for b in data.make_iterator(2, 1)] == [
        ["a", "b"],
        ["c", "d"],
    ]


def test_indivisible_mini_batch_size_error_names_numbers():
    with pytest.raises(
        ValueError, match=r"10 rows do not split into mini-batches of 4 \(10 % 4 != 0\)"
    ):
        rows(10).make_iterator(4, epochs=1)


def test_collate_fn_stacks_items_into_object_arrays():
    data = rows(3)
    out = collate_fn([data[2], data[0]])
    assert out.batch["y"].tolist() == [[4, 5], [0, 1]]
    assert out.non_tensor_batch["uid"].dtype == object
    assert out.non_tensor_batch["uid"].tolist() == ["p2", "p0"]
    with pytest.raises(ValueError, match="no items"):
        collate_fn([])
