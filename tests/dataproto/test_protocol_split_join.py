"""chunk / split / concat / repeat / reshapes, with worked numbers from verl 0.9.1's behaviour."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dataproto import DataProto, dataproto_equal, fold_batch_dim, unfold_batch_dim


def rows(n: int, **kwargs) -> DataProto:
    return DataProto.from_dict(
        {"x": torch.arange(n)},
        {"uid": np.array([f"p{i}" for i in range(n)], dtype=object)},
        **kwargs,
    )


# --- chunk ---


def test_chunk_even_shares_meta_and_views():
    data = rows(6, meta_info={"t": 1})
    pieces = data.chunk(3)
    assert [p.batch["x"].tolist() for p in pieces] == [[0, 1], [2, 3], [4, 5]]
    assert [p.non_tensor_batch["uid"].tolist() for p in pieces][2] == ["p4", "p5"]
    assert all(p.meta_info is data.meta_info for p in pieces)


def test_chunk_uneven_error_names_length_count_and_fix():
    with pytest.raises(ValueError) as info:
        rows(10).chunk(4)
    message = str(info.value)
    assert "10 rows" in message and "4 equal chunks" in message and "10 % 4 = 2" in message
    assert "pad_dataproto_to_divisor" in message and "auto_padding" in message
    with pytest.raises(AssertionError):  # verl code catching AssertionError keeps working
        rows(10).chunk(4)


def test_chunk_with_auto_padding_follows_torch_chunk():
    assert [len(p) for p in rows(10, auto_padding=True).chunk(4)] == [3, 3, 3, 1]
    pieces = rows(10, auto_padding=True).chunk(4)
    assert pieces[3].non_tensor_batch["uid"].tolist() == ["p9"]


def test_chunk_five_into_four_with_padding_is_a_clear_error():
    with pytest.raises(
        ValueError, match="5 rows cut torch-style into pieces of 2 rows give only 3"
    ):
        rows(5, auto_padding=True).chunk(4)


def test_chunk_non_tensor_only_uses_array_split():
    data = DataProto.from_dict(non_tensors={"u": list(range(10))}, auto_padding=True)
    assert [len(p) for p in data.chunk(4)] == [3, 3, 2, 2]
    assert data.chunk(4)[3].non_tensor_batch["u"].tolist() == [8, 9]


def test_chunk_of_empty_gives_empty_pieces_and_rejects_bad_counts():
    assert [len(p) for p in rows(0).chunk(4)] == [0, 0, 0, 0]
    with pytest.raises(ValueError, match="chunks must be a positive int, got 0"):
        rows(4).chunk(0)


# --- split ---


def test_split_last_piece_short_and_zero_is_an_error():
    assert [p.batch["x"].tolist() for p in rows(5).split(2)] == [[0, 1], [2, 3], [4]]
    with pytest.raises(ValueError, match="split_size must be a positive int, got 0"):
        rows(5).split(0)


# --- concat ---


def test_concat_rows_and_metrics_merge():
    a = rows(2, meta_info={"t": 1, "metrics": [{"loss": 1.0, "lr": 0.1}]})
    b = rows(1, meta_info={"t": 1, "metrics": {"loss": 0.5, "lr": 0.1}, "extra": "x"})
    c = rows(1, meta_info={"metrics": None})
    out = DataProto.concat([a, b, c])
    assert out.batch["x"].tolist() == [0, 1, 0, 0]
    assert out.non_tensor_batch["uid"].tolist() == ["p0", "p1", "p0", "p0"]
    assert out.meta_info == {
        "t": 1,
        "metrics": {"loss": [1.0, 0.5], "lr": [0.1, 0.1]},
        "extra": "x",
    }


def test_concat_conflicting_meta_names_key():
    with pytest.raises(ValueError, match="conflicting values for meta_info key 't'"):
        DataProto.concat([rows(1, meta_info={"t": 1}), rows(1, meta_info={"t": 2})])


def test_concat_key_mismatches_name_element_and_key():
    a, b = rows(1), rows(1)
    b.non_tensor_batch["extra"] = np.array([1])
    with pytest.raises(
        KeyError, match=r"element 1 is missing keys \[\] and has extra keys \['extra'\]"
    ):
        DataProto.concat([a, b])
    c = DataProto.from_dict({"y": torch.zeros(1)}, {"uid": ["q"]})
    with pytest.raises(
        KeyError, match=r"layer 'batch' of element 1.*missing \['x'\], extra \['y'\]"
    ):
        DataProto.concat([a, c])


def test_concat_empty_list_and_mixed_batches_are_clear_errors():
    with pytest.raises(ValueError, match="empty list"):
        DataProto.concat([])
    with pytest.raises(ValueError, match="element 1 has batch None"):
        DataProto.concat([rows(1), DataProto.from_dict(non_tensors={"uid": ["a"]})])


def test_concat_keeps_class_of_first_element():
    class MyProto(DataProto):
        pass

    assert type(DataProto.concat([MyProto.from_dict({"x": torch.zeros(1)})] * 2)) is MyProto


# --- repeat and reshapes ---


def test_repeat_interleave_vs_tile():
    data = rows(2)
    inter, tile = data.repeat(2), data.repeat(2, interleave=False)
    assert inter.batch["x"].tolist() == [0, 0, 1, 1]
    assert inter.non_tensor_batch["uid"].tolist() == ["p0", "p0", "p1", "p1"]
    assert tile.batch["x"].tolist() == [0, 1, 0, 1]
    assert tile.non_tensor_batch["uid"].tolist() == ["p0", "p1", "p0", "p1"]
    assert inter.meta_info is data.meta_info
    two_d = DataProto.from_dict(non_tensors={"pair": [[1, 2], [3, 4]]}).repeat(2, interleave=False)
    assert two_d.non_tensor_batch["pair"].tolist() == [[1, 2], [3, 4], [1, 2], [3, 4]]


def test_sample_level_repeat_per_row_counts_in_every_form():
    data = rows(3)
    for counts in ([2, 0, 1], (2, 0, 1), torch.tensor([2, 0, 1]), np.array([2, 0, 1])):
        out = data.sample_level_repeat(counts)
        assert out.non_tensor_batch["uid"].tolist() == ["p0", "p0", "p2"]
    with pytest.raises(ValueError, match="must be 3 ints"):
        data.sample_level_repeat([1, 2])


def test_unfold_column_chunks_splits_chosen_keys_and_repeats_others():
    data = DataProto.from_dict(
        {"x": torch.arange(8).reshape(2, 4), "y": torch.tensor([10, 20])},
        {"cols": np.arange(8).reshape(2, 4), "uid": np.array(["a", "b"], dtype=object)},
    )
    out = data.unfold_column_chunks(2, split_keys=["x", "cols"])
    assert out.batch["x"].tolist() == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert out.batch["y"].tolist() == [10, 10, 20, 20]
    assert out.non_tensor_batch["cols"].tolist() == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert out.non_tensor_batch["uid"].tolist() == ["a", "a", "b", "b"]
    with pytest.raises(ValueError, match="dim 1 must exist and be divisible by n_split=3"):
        data.unfold_column_chunks(3, split_keys=["x"])


def test_fold_and_unfold_batch_dim_round_trip_without_mutating_input():
    data = rows(6)
    folded = fold_batch_dim(data, 3)
    assert len(folded) == 3 and folded.non_tensor_batch["uid"].shape == (3, 2)
    assert data.non_tensor_batch["uid"].shape == (6,)
    assert dataproto_equal(unfold_batch_dim(folded, batch_dims=2), data)
    with pytest.raises(ValueError, match="6 rows cannot be folded into 4"):
        fold_batch_dim(data, 4)
