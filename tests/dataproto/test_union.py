"""union (in place, verl), merge / `|` (non-mutating), and the equality rules behind them."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dataproto import (
    DataProto,
    deep_equal,
    loose_equal,
    union_numpy_dict,
    union_tensor_dict,
    union_two_dict,
)
from dataproto.equality import tensors_equal

NAN = float("nan")


def base() -> DataProto:
    return DataProto.from_dict(
        {"x": torch.tensor([1, 2])}, {"uid": np.array(["a", "b"], dtype=object)}, {"t": 1.0}
    )


def test_union_is_in_place_and_returns_self():
    data = base()
    other = DataProto.from_dict({"y": torch.zeros(2)}, {"score": np.array([0.5, 1.0])}, {"s": 2})
    assert data.union(other) is data
    assert sorted(data.batch.keys()) == ["x", "y"]
    assert sorted(data.non_tensor_batch) == ["score", "uid"]
    assert data.meta_info == {"t": 1.0, "s": 2}


def test_union_int_and_float_tensors_with_equal_values_keep_self_dtype():
    data = base()
    data.union(DataProto.from_dict({"x": torch.tensor([1.0, 2.0])}))
    assert data.batch["x"].dtype == torch.int64


def test_union_tensor_conflict_names_key_and_layer_and_changes_nothing():
    data = base()
    other = DataProto.from_dict({"x": torch.tensor([1, 3]), "y": torch.zeros(2)})
    with pytest.raises(ValueError, match=r"key 'x' in layer 'batch' holds different values"):
        data.union(other)
    assert list(data.batch.keys()) == ["x"]  # checked before anything was added


def test_union_non_tensor_conflict_names_key_and_layer():
    other = DataProto.from_dict(non_tensors={"uid": np.array(["a", "c"], dtype=object)})
    with pytest.raises(ValueError, match=r"key 'uid' in layer 'non_tensor_batch'"):
        base().union(other)


def test_union_meta_conflict_names_key_and_layer():
    other = DataProto.from_dict({"x": torch.tensor([1, 2])}, meta_info={"t": 0.5})
    with pytest.raises(ValueError, match=r"key 't' in layer 'meta_info' differs"):
        base().union(other)
    with pytest.raises(AssertionError):  # verl raised AssertionError here
        base().union(other)


def test_union_nan_values_are_equal_in_every_layer():
    data = DataProto.from_dict(
        {"v": torch.tensor([NAN, 1.0])},
        {"score": np.array([NAN, 1.0]), "info": np.array([{"r": NAN}, [NAN, 1]], dtype=object)},
        {"kl": NAN},
    )
    same = DataProto.from_dict(
        {"v": torch.tensor([NAN, 1.0])},
        {"score": np.array([NAN, 1.0]), "info": np.array([{"r": NAN}, [NAN, 1]], dtype=object)},
        {"kl": NAN},
    )
    assert data.union(same) is data


def test_union_rows_must_match():
    with pytest.raises(ValueError, match="self has 2 rows, other has 3"):
        base().union(DataProto.from_dict({"y": torch.zeros(3)}))
    with pytest.raises(ValueError, match=r"batch sizes differ: \(2,\) vs \(3,\)"):
        union_tensor_dict(base().batch, DataProto.from_dict({"y": torch.zeros(3)}).batch)
    with pytest.raises(ValueError, match="self has 2 rows, other has 3"):
        base().union(DataProto.from_dict(non_tensors={"u": [1, 2, 3]}))


def test_union_with_missing_batch_on_either_side():
    data = base()
    data.union(DataProto.from_dict(non_tensors={"extra": [1, 2]}))
    assert sorted(data.non_tensor_batch) == ["extra", "uid"]
    no_batch = DataProto.from_dict(non_tensors={"uid": np.array(["a", "b"], dtype=object)})
    no_batch.union(base())
    assert no_batch.batch["x"].tolist() == [1, 2]


def test_merge_and_or_leave_both_operands_unchanged():
    a, b = base(), DataProto.from_dict({"y": torch.zeros(2)}, {"s": [1, 2]}, {"k": 1})
    merged = a.merge(b)
    piped = a | b
    for out in (merged, piped):
        assert sorted(out.batch.keys()) == ["x", "y"] and sorted(out.non_tensor_batch) == [
            "s",
            "uid",
        ]
        assert out.meta_info == {"t": 1.0, "k": 1}
        assert out.batch["x"] is a.batch["x"]  # tensors shared, not copied
    assert list(a.batch.keys()) == ["x"] and list(a.non_tensor_batch) == ["uid"]
    assert a.meta_info == {"t": 1.0} and list(b.batch.keys()) == ["y"]
    with pytest.raises(ValueError, match="key 'x'"):
        a | DataProto.from_dict({"x": torch.tensor([0, 0])})


def test_union_module_helpers():
    from tensordict import TensorDict

    td = TensorDict({"x": torch.tensor([1, 2])}, batch_size=[2])
    union_tensor_dict(td, TensorDict({"y": torch.zeros(2)}, batch_size=[2]))
    assert sorted(td.keys()) == ["x", "y"]
    theirs = {"a": np.array([1, 2])}
    mine = union_numpy_dict({"a": np.array([1, 2])}, theirs)
    assert mine["a"] is theirs["a"]  # the other's array is stored (verl)
    with pytest.raises(ValueError, match="key 'a' in layer 'non_tensor_batch'"):
        union_numpy_dict({"a": np.array([1, 2])}, {"a": np.array([1.0, 2.0])})  # dtypes differ
    with pytest.raises(ValueError, match="key 'k' in layer 'meta_info'"):
        union_two_dict({"k": 1}, {"k": 2})


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [
        (NAN, NAN, True),
        (np.float32(NAN), np.float32(NAN), True),
        (1, 1.0, False),
        ({"a": [1, {"b": NAN}]}, {"a": [1, {"b": NAN}]}, True),
        ({"a": 1}, {"a": 2}, False),
        ([1, 2], (1, 2), False),
        (np.array([1, 2]), np.array([1, 2]), True),
        (np.array([1, 2]), np.array([[1, 2]]), False),
        (np.array(["x", "y"]), np.array(["x", "y"]), True),
        (
            np.array([{"k": np.zeros(2)}], dtype=object),
            np.array([{"k": np.zeros(2)}], dtype=object),
            True,
        ),
    ],
)
def test_deep_equal_cases(a, b, expected):
    assert deep_equal(a, b) is expected


def test_deep_equal_treats_cycles_as_equal():
    a: list = [1]
    a.append(a)
    b: list = [1]
    b.append(b)
    assert deep_equal(a, b)


def test_loose_equal_is_python_equality_made_safe():
    assert loose_equal(1, 1.0) and loose_equal(np.array([1, 2]), np.array([1.0, 2.0]))
    assert not loose_equal(np.array([1, 2]), 1)
    assert loose_equal(torch.tensor([NAN]), torch.tensor([NAN]))


def test_tensors_equal_short_circuits_on_shared_memory():
    x = torch.tensor([NAN, 1.0])
    assert tensors_equal(x, x) and tensors_equal(x, x.view(2))
    assert not tensors_equal(torch.tensor([1.0, 2.0]), torch.tensor([1.0, 3.0]))
