"""Artifact round trips: every tensor dtype, every object kind, meta_info, memory://, hypothesis."""

from __future__ import annotations

import math
import tempfile
import uuid

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tensordict import TensorDict

from dataproto.artifact import (
    ArtifactError,
    ArtifactTypeError,
    artifact_ref,
    load_artifact,
    read_manifest,
    save_artifact,
    verify_artifact,
)
from dataproto.protocol import DataProto
from dataproto.tensor_file import DTYPE_CODES


def same_value(a, b) -> bool:
    """Exact equality: same types all the way down, NaN equals NaN, arrays compared elementwise."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float | np.floating) and math.isnan(a):
        return math.isnan(b)
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(same_value(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return list(a) == list(b) and all(same_value(a[k], b[k]) for k in a)
    if isinstance(a, np.ndarray):
        if a.dtype != b.dtype or a.shape != b.shape:
            return False
        if a.dtype == object:
            return all(same_value(x, y) for x, y in zip(a.ravel(), b.ravel()))
        return np.array_equal(a, b, equal_nan=a.dtype.kind in "fc")
    return bool(a == b)


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().reshape(-1).view(torch.uint8)


def assert_same_dataproto(a: DataProto, b: DataProto) -> None:
    assert (a.batch is None) == (b.batch is None)
    if a.batch is not None:
        assert a.batch.batch_size == b.batch.batch_size
        assert list(a.batch.keys()) == list(b.batch.keys())
        for key, x in a.batch.items():
            y = b.batch[key]
            assert x.dtype == y.dtype and x.shape == y.shape, key
            # bit-exact, NaN included
            assert torch.equal(_bytes(x), _bytes(y)), key
    assert list(a.non_tensor_batch) == list(b.non_tensor_batch)
    for key, x in a.non_tensor_batch.items():
        assert same_value(x, b.non_tensor_batch[key]), key
    assert same_value(a.meta_info, b.meta_info)


def round_trip(data: DataProto, path, **kw) -> DataProto:
    save_artifact(data, path)
    return load_artifact(path, **kw)


def obj(*values) -> np.ndarray:
    out = np.empty(len(values), dtype=object)
    for i, v in enumerate(values):
        out[i] = v
    return out


@pytest.mark.parametrize("dtype", list(DTYPE_CODES), ids=str)
@pytest.mark.parametrize("rows", [3, 0])
def test_every_tensor_dtype_round_trips(tmp_path, dtype, rows):
    raw = torch.randint(0, 255, (rows, 5, 2), dtype=torch.uint8)
    itemsize = torch.empty(0, dtype=dtype).element_size()
    tensor = torch.randint(0, 255, (rows, 5, 2 * itemsize), dtype=torch.uint8).view(dtype)
    tensor = tensor if dtype != torch.bool else raw.bool()
    data = DataProto(batch=TensorDict({"x": tensor, "y": torch.ones(rows)}, batch_size=[rows]))
    back = round_trip(data, tmp_path / "a")
    assert_same_dataproto(data, back)
    assert len(back.batch) == rows


def test_mixed_dtypes_keep_order_and_non_contiguous_views(tmp_path):
    base = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    td = TensorDict(
        {
            "b": torch.tensor([True, False, True, True]),
            "h": base.half(),
            "view": base[:, ::2],  # non-contiguous, shares storage with `a`
            "a": base,
            "bf": base.bfloat16(),
            "ids": torch.arange(4, dtype=torch.int64),
        },
        batch_size=[4],
    )
    back = round_trip(DataProto(batch=td), tmp_path / "a")
    assert_same_dataproto(DataProto(batch=td), back)


def test_batch_none_empty_and_keyless(tmp_path):
    only_nt = DataProto(batch=None, non_tensor_batch={"uid": obj("a", "b")})
    assert_same_dataproto(only_nt, round_trip(only_nt, tmp_path / "nt"))
    assert read_manifest(tmp_path / "nt")["rows"] == 2
    empty = DataProto()
    assert_same_dataproto(empty, round_trip(empty, tmp_path / "empty"))
    keyless = DataProto(batch=TensorDict({}, batch_size=[5]))
    back = round_trip(keyless, tmp_path / "keyless")
    assert back.batch.batch_size == torch.Size([5]) and len(back.batch.keys()) == 0


def test_every_object_kind_round_trips_exactly(tmp_path):
    nan, inf = float("nan"), float("inf")
    two_d = np.empty((3, 2), dtype=object)
    two_d[:2] = [[1, "x"], [None, 2.5]]
    two_d[2, 0], two_d[2, 1] = [1.0], {"k": (1,)}
    non_tensor = {
        "uid": obj("a", "b", "c"),
        "scalars": obj(1, 1.0, True),
        "specials": obj(nan, inf, -inf),
        "none_and_str": obj(None, "", "日本\ud800"),
        "nested": obj({"a": [1, 2.0, {"b": None}]}, [[], {}], {"gt": "4", "style": "rule"}),
        "tuples_and_keys": obj((1, (2.0,)), {1: "int key", (1, 2): "tuple key"}, {"$float": "x"}),
        "numpy_inside": obj(np.float32(0.5), np.int64(-3), np.array([[1.5, nan]])),
        "numpy_str_bool": obj(np.str_("s"), np.bool_(True), np.array(["u", 1], dtype=object)),
        "big_int": obj(2**80, -(2**70), 0),
        "two_d": two_d,
        "numeric": np.array([[1, 2], [3, 4], [5, 6]], dtype=np.int32),
        "flags": np.array([True, False, True]),
        "fixed_str": np.array(["ab", "c", ""]),
        "floats": np.array([0.5, nan, -inf], dtype=np.float32),
    }
    data = DataProto(batch=None, non_tensor_batch=non_tensor)
    back = round_trip(data, tmp_path / "a")
    assert_same_dataproto(data, back)
    # int stays int, float stays float
    assert [type(v) for v in back.non_tensor_batch["scalars"]] == [int, float, bool]


def test_meta_info_round_trip_and_numpy_scalars_become_python(tmp_path):
    meta = {
        "temperature": np.float64(0.7),
        "global_steps": np.int64(3),
        "global_token_num": [5, 7],
        "metrics": {"actor/loss": [0.1, float("nan")], "n": None, "ok": True},
        "pair": (1, 2),
        "array": np.arange(3),
    }
    back = round_trip(DataProto(meta_info=meta), tmp_path / "a").meta_info
    assert type(back["temperature"]) is float and back["temperature"] == 0.7
    assert type(back["global_steps"]) is int
    assert same_value(back["metrics"], meta["metrics"])
    assert back["pair"] == (1, 2) and same_value(back["array"], np.arange(3))


class Opaque:
    pass


@pytest.mark.parametrize(
    ("value", "path", "type_name"),
    [
        (torch.zeros(2), "", "torch.Tensor"),
        (Opaque(), "", "Opaque"),
        ({"gt": [1, {2, 3}]}, "['gt'][1]", "builtins.set"),
        (b"bytes", "", "builtins.bytes"),
        (1 + 2j, "", "builtins.complex"),
    ],
)
def test_unstorable_object_rejected_at_write_naming_key_row_type(tmp_path, value, path, type_name):
    data = DataProto(batch=None, non_tensor_batch={"reward_model": obj({"ok": 1}, {}, value)})
    with pytest.raises(ArtifactTypeError) as info:
        save_artifact(data, tmp_path / "a")
    message = str(info.value)
    assert "'reward_model'" in message and "row 2" in message and type_name in message
    assert path in message
    assert not (tmp_path / "a").exists() and list(tmp_path.iterdir()) == []


def test_unstorable_meta_info_names_key_path(tmp_path):
    with pytest.raises(ArtifactTypeError, match=r"meta_info\['metrics'\]\['x'\].*torch.Tensor"):
        save_artifact(DataProto(meta_info={"metrics": {"x": torch.ones(1)}}), tmp_path / "a")
    with pytest.raises(ArtifactTypeError, match="'config'"):
        save_artifact(DataProto(), tmp_path / "b", config={"x": object()})
    assert list(tmp_path.iterdir()) == []


def test_manifest_records_stage_config_schema_sizes_and_fingerprint(tmp_path):
    td = TensorDict({"responses": torch.zeros(2, 3, dtype=torch.long)}, batch_size=[2])
    data = DataProto(batch=td, non_tensor_batch={"uid": obj("a", "b")}, meta_info={"t": 1})
    ref = save_artifact(
        data, tmp_path / "a", stage="reward", stage_version="3", config={"k": [1]}, extra={"e": 1}
    )
    manifest = read_manifest(tmp_path / "a")
    assert (manifest["stage"], manifest["stage_version"]) == ("reward", "3")
    assert (manifest["config"], manifest["extra"]) == ({"k": [1]}, {"e": 1})
    assert manifest["schema"][0]["name"] == "responses"
    sizes = {name: (tmp_path / "a" / name).stat().st_size for name in manifest["files"]}
    assert sizes == {name: entry["bytes"] for name, entry in manifest["files"].items()}
    assert ref.nbytes == sum(sizes.values()) and ref.rows == 2
    assert ref.fingerprint == manifest["fingerprint"] == artifact_ref(tmp_path / "a").fingerprint
    # content fingerprint: stage/config do not matter, content does
    other = save_artifact(data, tmp_path / "b", stage="other", config={"k": 2})
    assert other.fingerprint == ref.fingerprint
    data.meta_info["t"] = 2
    assert save_artifact(data, tmp_path / "c").fingerprint != ref.fingerprint


def test_memory_url_round_trip_and_corruption_detected():
    url = f"memory://ppoflow-tests/{uuid.uuid4().hex}/art"
    td = TensorDict({"x": torch.randn(4, 3), "m": torch.ones(4, 3, dtype=torch.bool)}, [4])
    data = DataProto(batch=td, non_tensor_batch={"uid": obj(*"abcd")}, meta_info={"a": [1]})
    ref = save_artifact(data, url)
    assert ref.path == url
    assert_same_dataproto(data, load_artifact(url))
    assert_same_dataproto(data, load_artifact(url, verify="lazy"))
    verify_artifact(url)
    import fsspec

    fs = fsspec.filesystem("memory")
    root = url.removeprefix("memory://")
    assert not [p for p in fs.ls(root.rsplit("/", 1)[0], detail=False) if ".tmp-" in p]
    raw = bytearray(fs.cat_file(f"{root}/tensors.safetensors"))
    raw[-1] ^= 0xFF
    fs.pipe_file(f"{root}/tensors.safetensors", bytes(raw))
    with pytest.raises(ArtifactError, match=r"memory://.*tensors.safetensors: blake3 digest"):
        load_artifact(url, verify="lazy")  # remote bytes are always hashed
    with pytest.raises(ArtifactError, match="already exists"):
        save_artifact(data, url)
    save_artifact(data, url, overwrite=True)
    verify_artifact(url)


def test_file_url_and_overwrite_replaces_content(tmp_path):
    url = f"file://{tmp_path}/art"
    first = DataProto(non_tensor_batch={"uid": obj("a")})
    save_artifact(first, url)
    second = DataProto(non_tensor_batch={"score": np.array([1.0, 2.0])})
    save_artifact(second, url, overwrite=True)
    assert_same_dataproto(second, load_artifact(tmp_path / "art"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["art"]


def test_bad_verify_mode():
    with pytest.raises(ValueError, match="verify='fast'"):
        load_artifact("/nonexistent", verify="fast")


# --- property: write → read is the identity on random small batches -------------------------

_json_leaf = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=5),
)
_json_value = st.recursive(
    _json_leaf,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.dictionaries(st.text(max_size=4), inner, max_size=3),
        st.tuples(inner, inner),
    ),
    max_leaves=8,
)
_tensor_dtypes = st.sampled_from(
    [torch.float32, torch.bfloat16, torch.float16, torch.int64, torch.int32, torch.bool]
)


@st.composite
def small_batches(draw) -> DataProto:
    rows = draw(st.integers(0, 4))
    width = draw(st.integers(0, 3))
    tensors = {}
    for i in range(draw(st.integers(0, 3))):
        dtype = draw(_tensor_dtypes)
        values = torch.tensor(
            draw(st.lists(st.integers(-100, 100), min_size=rows * width, max_size=rows * width)),
            dtype=torch.float64,
        ).reshape(rows, width)
        tensors[f"t{i}"] = values.to(dtype)
    non_tensor = {
        f"o{i}": obj(*draw(st.lists(_json_value, min_size=rows, max_size=rows)))
        for i in range(draw(st.integers(0, 2)))
    }
    has_batch = draw(st.booleans()) or not non_tensor
    batch = TensorDict(tensors, batch_size=[rows]) if has_batch else None
    meta = draw(st.dictionaries(st.text(max_size=4), _json_value, max_size=3))
    return DataProto(batch=batch, non_tensor_batch=non_tensor, meta_info=meta)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=small_batches(), verify=st.sampled_from(["full", "lazy"]))
def test_property_write_read_identity(data, verify):
    with tempfile.TemporaryDirectory() as root:
        assert_same_dataproto(data, round_trip(data, f"{root}/a", verify=verify))
