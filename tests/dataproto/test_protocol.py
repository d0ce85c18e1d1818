"""DataProto construction, invariants, indexing, selection and in-place mutation (verl 0.9.1's semantics)."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch
from tensordict import TensorDict

from dataproto import (
    DataProto,
    DataProtoItem,
    DataProtoTypeError,
    DataProtoValueError,
    dataproto_equal,
)


def make(n: int = 4) -> DataProto:
    return DataProto.from_dict(
        {"x": torch.arange(n * 2).reshape(n, 2), "y": torch.arange(n, dtype=torch.float32)},
        {"uid": np.array([f"p{i}" for i in range(n)], dtype=object)},
        {"temperature": 1.0},
    )


# --- construction and invariants ---


def test_from_dict_converts_lists_to_object_arrays_and_keeps_caller_dicts():
    non_tensors = {"uid": ["a", "b"], "pair": [[1, 2], [3, 4]], "ragged": [[1], [2, 3]]}
    data = DataProto.from_dict({"x": torch.zeros(2)}, non_tensors)
    assert data.non_tensor_batch["uid"].dtype == object
    assert data.non_tensor_batch["pair"].shape == (2, 2)  # equal-length lists → 2-D object array
    assert data.non_tensor_batch["pair"].dtype == object
    assert data.non_tensor_batch["ragged"].shape == (2,)
    assert isinstance(non_tensors["uid"], list)  # the caller's dict is untouched


def test_from_dict_without_tensors_gives_none_batch_and_length_from_non_tensors():
    data = DataProto.from_dict(non_tensors={"uid": ["a", "b", "c"]})
    assert data.batch is None and len(data) == 3
    assert len(DataProto()) == 0


def test_from_dict_mismatched_tensor_rows_names_both_keys():
    with pytest.raises(
        DataProtoValueError, match=r"'b' has leading shape \(3,\), but 'a' has \(2,\)"
    ):
        DataProto.from_dict({"a": torch.zeros(2), "b": torch.zeros(3)})


def test_from_dict_num_batch_dims_rules():
    with pytest.raises(ValueError, match="num_batch_dims must be > 0"):
        DataProto.from_dict({"a": torch.zeros(2)}, num_batch_dims=0)
    with pytest.raises(ValueError, match="must be 1 when non_tensors"):
        DataProto.from_dict({"a": torch.zeros(2, 2)}, {"u": [1, 2]}, num_batch_dims=2)
    with pytest.raises(AssertionError, match=r"exactly one batch dim.*\(2, 3\)"):
        DataProto.from_dict({"a": torch.zeros(2, 3)}, num_batch_dims=2)


def test_from_dict_auto_padding_flag_does_not_mutate_callers_meta():
    meta = {"step": 1}
    data = DataProto.from_dict({"a": torch.zeros(2)}, meta_info=meta, auto_padding=True)
    assert data.meta_info == {"step": 1, "_verl_auto_padding": True}
    assert meta == {"step": 1}
    assert data.is_padding_enabled()
    plain = DataProto.from_dict({"a": torch.zeros(2)}, meta_info=meta)
    assert plain.meta_info is meta  # shared, as in verl


def test_from_single_dict_routes_by_type_and_rejects_others():
    data = DataProto.from_single_dict({"x": torch.zeros(2), "uid": np.array(["a", "b"])})
    assert list(data.batch.keys()) == ["x"] and list(data.non_tensor_batch) == ["uid"]
    with pytest.raises(ValueError, match="key 'bad' holds list"):
        DataProto.from_single_dict({"x": torch.zeros(2), "bad": [1, 2]})


def test_from_single_dict_preserves_subclass():
    class MyProto(DataProto):
        pass

    assert type(MyProto.from_single_dict({"x": torch.zeros(2)})) is MyProto


def test_consistency_error_names_key_length_and_batch_size():
    td = TensorDict({"x": torch.zeros(4)}, batch_size=[4])
    with pytest.raises(DataProtoValueError, match=r"key 'uid' has 3 rows, but the DataProto has 4"):
        DataProto(batch=td, non_tensor_batch={"uid": np.array(["a", "b", "c"])})
    with pytest.raises(DataProtoTypeError, match=r"key 'uid' must be a np.ndarray.*got list"):
        DataProto(batch=td, non_tensor_batch={"uid": ["a", "b", "c", "d"]})
    with pytest.raises(TypeError, match="batch must be a TensorDict"):
        DataProto(batch={"x": torch.zeros(4)})


def test_consistency_checks_non_tensor_lengths_without_batch():
    with pytest.raises(ValueError, match="key 'b' has 1 rows, but the DataProto has 2"):
        DataProto(non_tensor_batch={"a": np.zeros(2), "b": np.zeros(1)})


def test_none_layers_read_as_empty_dicts():
    data = DataProto(batch=None, non_tensor_batch=None, meta_info=None)
    assert data.non_tensor_batch == {} and data.meta_info == {} and len(data) == 0


# --- indexing ---


def test_getitem_int_and_numpy_int_give_item_sharing_meta():
    data = make()
    item = data[np.int64(2)]
    assert isinstance(item, DataProtoItem)
    assert item.batch["x"].tolist() == [4, 5] and item.non_tensor_batch["uid"] == "p2"
    assert item.meta_info is data.meta_info
    assert data[True].non_tensor_batch["uid"] == "p1"  # True counts as 1


def test_getitem_slice_list_array_tensor_and_mask():
    data = make()
    assert data[1:3].batch["x"].tolist() == [[2, 3], [4, 5]]
    assert data[::2].non_tensor_batch["uid"].tolist() == ["p0", "p2"]
    assert data[[3, 1]].non_tensor_batch["uid"].tolist() == ["p3", "p1"]
    assert data[np.array([0, -1])].batch["y"].tolist() == [0.0, 3.0]
    assert data[torch.tensor([2])].batch["x"].tolist() == [[4, 5]]
    mask = torch.tensor([True, False, False, True])
    assert data[mask].non_tensor_batch["uid"].tolist() == ["p0", "p3"]
    assert len(data[[]]) == 0


def test_getitem_rejects_other_types():
    with pytest.raises(TypeError, match="indexing with str is not supported"):
        make()["x"]
    with pytest.raises(IndexError, match="use an int"):
        make()[torch.tensor(1)]


def test_select_idxs_bool_mask_numpy_and_torch_agree():
    data = make()
    np_mask = np.array([False, True, True, False])
    a, b = data.select_idxs(np_mask), data.select_idxs(torch.from_numpy(np_mask))
    assert len(a) == 2 and dataproto_equal(a, b)
    assert a.meta_info is data.meta_info


def test_select_idxs_errors_name_the_sizes():
    data = make()
    with pytest.raises(IndexError, match="mask has length 3, but the DataProto has 4 rows"):
        data.select_idxs([True, False, True])
    with pytest.raises(IndexError, match="row index 4 is out of range for a DataProto of 4 rows"):
        data.select_idxs([0, 4])


def test_select_idxs_copies_rows_while_slice_shares_them():
    data = make()
    data.select_idxs([0]).batch["y"][0] = 100.0
    assert data.batch["y"][0] == 0.0
    data[0:1].batch["y"][0] = 100.0
    assert data.batch["y"][0] == 100.0


def test_select_keeps_layers_shares_when_none_and_deepcopies_non_tensors_only():
    data = make()
    selected = data.select(batch_keys=["x"], non_tensor_batch_keys=["uid", "absent"])
    assert list(selected.batch.keys()) == ["x"] and list(selected.non_tensor_batch) == ["uid"]
    assert selected.meta_info is data.meta_info
    assert data.select().non_tensor_batch is data.non_tensor_batch
    deep = data.select(deepcopy=True)
    assert deep.non_tensor_batch["uid"] is not data.non_tensor_batch["uid"]
    assert deep.meta_info is not data.meta_info
    assert deep.batch["x"] is data.batch["x"]  # tensors are never copied
    with pytest.raises(KeyError, match=r"keys \['nope'\] are not in layer 'batch'"):
        data.select(batch_keys=["nope"])
    with pytest.raises(KeyError, match="batch is None"):
        DataProto.from_dict(non_tensors={"u": [1]}).select(batch_keys=["x"])


def test_pop_removes_in_place_and_returns_plain_dataproto():
    class MyProto(DataProto):
        pass

    data = MyProto.from_dict(
        {"x": torch.zeros(2), "y": torch.ones(2)}, {"uid": ["a", "b"]}, {"t": 1, "s": 2}
    )
    popped = data.pop(batch_keys=["y"], non_tensor_batch_keys=["uid"], meta_info_keys=["t"])
    assert type(popped) is DataProto
    assert list(popped.batch.keys()) == ["y"] and list(popped.non_tensor_batch) == ["uid"]
    assert popped.meta_info == {"t": 1}
    assert list(data.batch.keys()) == ["x"] and data.non_tensor_batch == {}
    assert data.meta_info == {"s": 2}
    assert data.pop(meta_info_keys=["s"]).batch is None


def test_pop_missing_key_changes_nothing():
    data = make()
    with pytest.raises(KeyError, match=r"keys \['nope'\] are not in layer 'non_tensor_batch'"):
        data.pop(batch_keys=["x"], non_tensor_batch_keys=["nope"])
    assert list(data.batch.keys()) == ["x", "y"]


def test_rename_in_place_several_keys_and_errors():
    data = make()
    assert data.rename("x", "x2") is data
    data.rename(["x2", "y"], ["a", "b"])
    assert sorted(data.batch.keys()) == ["a", "b"]
    with pytest.raises(ValueError, match="same length, got 1 and 2"):
        data.rename(["a", "b"], ["c"])
    with pytest.raises(KeyError, match=r"\['zz'\] are not in layer 'batch'"):
        data.rename("zz", "c")
    with pytest.raises(KeyError, match="would collide"):
        data.rename("a", "b")
    with pytest.raises(TypeError, match="old_keys must be a str or a list"):
        data.rename(1, "c")


def test_reorder_is_in_place_and_accepts_lists_and_tensors():
    data = make()
    data.reorder(torch.tensor([3, 2, 1, 0]))
    assert data.non_tensor_batch["uid"].tolist() == ["p3", "p2", "p1", "p0"]
    data.reorder([3, 2, 1, 0])
    assert data.batch["y"].tolist() == [0.0, 1.0, 2.0, 3.0]


def test_to_moves_batch_in_place():
    data = make()
    assert data.to("cpu") is data and data.batch.device == torch.device("cpu")


# --- information and serialization ---


def test_get_data_info_sections_and_schema():
    info = make().get_data_info()
    assert "batch\n  x: (4, 2) (torch.int64) cpu" in info
    assert "non_tensor_batch\n  uid: ndarray(4,) (object)" in info
    assert "meta_info\n  temperature: float" in info
    assert "schema" in info and "non_tensor_batch  object" in info


def test_get_data_info_without_batch_does_not_crash():
    info = DataProto.from_dict(
        non_tensors={"uid": ["a"]}, meta_info={"m": [1, "a"]}
    ).get_data_info()
    assert info.startswith("batch\nnon_tensor_batch\n  uid: ndarray(1,) (object)")
    assert "m: list[int|str]" in info


def test_print_size(capsys):
    DataProto.from_dict({"x": torch.zeros(1024, 256)}).print_size("step 1")
    assert capsys.readouterr().out.startswith("step 1, Size of tensordict: 0.0009765625 GB")


def test_pickle_round_trip_with_and_without_batch():
    data = make()
    data.batch["y"][0] = float("nan")
    restored = pickle.loads(pickle.dumps(data))
    assert dataproto_equal(restored, data)
    no_batch = DataProto.from_dict(non_tensors={"uid": ["a"]})
    assert pickle.loads(pickle.dumps(no_batch)).batch is None


def test_tensordict_round_trip():
    data = make()
    data.non_tensor_batch["extra"] = np.array([{"k": i} for i in range(4)], dtype=object)
    td = data.to_tensordict()
    back = DataProto.from_tensordict(td)
    assert dataproto_equal(back, data)
    with pytest.raises(KeyError, match="'x' is in both"):
        DataProto(batch=data.batch, non_tensor_batch={"x": np.zeros(4)}).to_tensordict()


def test_save_to_disk_round_trip(tmp_path):
    data = make()
    data.save_to_disk(tmp_path / "batch")
    assert dataproto_equal(DataProto.load_from_disk(tmp_path / "batch"), data)
