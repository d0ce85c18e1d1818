"""Integer tensors are stored narrow and loaded back exactly (dataproto/compact_dtypes.py)."""

from __future__ import annotations

import json
import struct

import pytest
import torch

from dataproto import DataProto
from dataproto import artifact as artifact_module
from dataproto.artifact import ArtifactError, load_artifact, save_artifact, verify_artifact
from dataproto.compact_dtypes import storage_dtype
from dataproto.fingerprint import content_fingerprint


def rewrite_manifest(path, change) -> None:
    """Apply ``change`` to the artifact's manifest and sign it again (a fingerprint over the
    new layout), as a writer of that manifest would have."""
    manifest = json.loads((path / "manifest.json").read_text())
    change(manifest)
    digests = {name: entry[manifest["digest"]] for name, entry in manifest["files"].items()}
    manifest["fingerprint"] = content_fingerprint(
        digests, artifact_module._layout(manifest), manifest["digest"]
    )
    (path / "manifest.json").write_text(json.dumps(manifest))


def header(path) -> dict:
    raw = (path / "tensors.safetensors").read_bytes()
    (size,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8 : 8 + size])


@pytest.mark.parametrize(
    ("values", "dtype", "stored"),
    [
        ([0, 1], torch.int64, torch.uint8),
        ([-5, 100], torch.int64, torch.int8),
        ([0, 65_535], torch.int64, torch.uint16),
        ([-1, 40_000], torch.int64, torch.int32),
        ([0, 2**31 - 1], torch.int64, torch.int32),
        ([0, 2**31], torch.int64, torch.int64),  # nothing narrower holds it
        ([0, 255], torch.int32, torch.uint8),
        ([3, 7], torch.uint8, torch.uint8),
        ([0, 60_000], torch.uint16, torch.uint16),  # never wider than its own dtype
        ([1, 2], torch.uint32, torch.uint8),
        ([1, 2], torch.uint64, torch.uint64),
    ],
)
def test_the_narrowest_lossless_dtype(values, dtype, stored):
    assert storage_dtype(torch.tensor(values, dtype=dtype)) == stored


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.bool, torch.float64])
def test_floats_and_bools_are_stored_as_they_are(dtype):
    assert storage_dtype(torch.zeros(3, dtype=dtype)) == dtype


def rollout_like(rows: int = 8, width: int = 24, vocab: int = 151_000) -> DataProto:
    generator = torch.Generator().manual_seed(0)
    return DataProto.from_dict(
        {
            "input_ids": torch.randint(0, vocab, (rows, width), generator=generator),
            "attention_mask": torch.randint(0, 2, (rows, width), generator=generator),
            "position_ids": torch.arange(width).repeat(rows, 1),
            "old_log_probs": torch.randn(rows, width, generator=generator),
            "flags": torch.zeros(rows, dtype=torch.bool),
        }
    )


@pytest.mark.parametrize("verify", ["full", "lazy"])
def test_a_load_returns_exactly_what_was_saved(tmp_path, verify):
    data = rollout_like()
    ref = save_artifact(data, tmp_path / "a")
    loaded = load_artifact(ref.path, verify=verify)
    for key, tensor in data.batch.items():
        assert loaded.batch[key].dtype == tensor.dtype
        assert torch.equal(loaded.batch[key], tensor)
    verify_artifact(ref.path)


def test_the_file_holds_the_narrow_dtypes_and_the_manifest_names_them(tmp_path):
    ref = save_artifact(rollout_like(), tmp_path / "a")
    manifest = json.loads((tmp_path / "a" / "manifest.json").read_text())
    assert manifest["format_version"] == 4 and manifest["batch"]["trimmed"] == {}  # no padding
    assert manifest["batch"]["stored"] == {
        "input_ids": "int32",
        "attention_mask": "uint8",
        "position_ids": "uint8",
    }
    schema = {rec["name"]: rec["dtype"] for rec in manifest["schema"]}
    assert schema["input_ids"] == "int64"  # the schema keeps the in-memory dtype
    found = {
        name: entry["dtype"]
        for name, entry in header(tmp_path / "a").items()
        if name != "__metadata__"
    }
    assert found == {
        "input_ids": "I32",
        "attention_mask": "U8",
        "position_ids": "U8",
        "old_log_probs": "F32",
        "flags": "BOOL",
    }
    raw = (tmp_path / "a" / "tensors.safetensors").read_bytes()
    (header_size,) = struct.unpack("<Q", raw[:8])
    cells = 8 * 24
    assert len(raw) - 8 - header_size == cells * (4 + 1 + 1 + 4) + 8  # int64 would be 8 each
    assert manifest["files"]["tensors.safetensors"]["bytes"] == len(raw) and ref.nbytes > len(raw)


def test_equal_content_gives_the_same_fingerprint_and_other_dtypes_another(tmp_path):
    data = rollout_like()
    first = save_artifact(data, tmp_path / "a")
    again = save_artifact(data, tmp_path / "b")
    assert first.fingerprint == again.fingerprint
    as_int32 = DataProto.from_dict(
        {k: v.to(torch.int32) if v.dtype == torch.int64 else v for k, v in data.batch.items()}
    )
    assert save_artifact(as_int32, tmp_path / "c").fingerprint != first.fingerprint


def test_a_version_2_artifact_still_loads(tmp_path, monkeypatch):
    data = rollout_like()
    monkeypatch.setattr(artifact_module, "FORMAT_VERSION", 2)
    ref = save_artifact(data, tmp_path / "v2", narrow=False)
    monkeypatch.undo()
    rewrite_manifest(tmp_path / "v2", lambda m: m["batch"].pop("stored"))  # 2 had no field
    assert json.loads((tmp_path / "v2" / "manifest.json").read_text())["format_version"] == 2
    assert header(tmp_path / "v2")["input_ids"]["dtype"] == "I64"
    loaded = load_artifact(ref.path, verify="lazy")
    assert torch.equal(loaded.batch["input_ids"], data.batch["input_ids"])


def test_narrow_false_stores_every_tensor_in_its_own_dtype(tmp_path):
    data = rollout_like()
    save_artifact(data, tmp_path / "wide", narrow=False)
    assert json.loads((tmp_path / "wide" / "manifest.json").read_text())["batch"]["stored"] == {}
    assert header(tmp_path / "wide")["attention_mask"]["dtype"] == "I64"
    loaded = load_artifact(tmp_path / "wide", verify="lazy")
    assert torch.equal(loaded.batch["attention_mask"], data.batch["attention_mask"])


@pytest.mark.parametrize(
    "stored",
    [{"input_ids": "float32"}, {"no_such_key": "uint8"}, ["input_ids"]],
    ids=["not-a-narrow-int", "unknown-key", "not-a-mapping"],
)
def test_a_manifest_with_a_bad_stored_entry_is_named(tmp_path, stored):
    save_artifact(rollout_like(), tmp_path / "a")
    rewrite_manifest(tmp_path / "a", lambda m: m["batch"].update(stored=stored))
    with pytest.raises(ArtifactError, match=r"manifest\.json: batch\.stored"):
        load_artifact(tmp_path / "a", verify="lazy")


def test_inspect_shows_the_dtypes_on_disk(tmp_path):
    from dataproto.report import describe_artifact

    save_artifact(rollout_like(), tmp_path / "a")
    text = describe_artifact(tmp_path / "a")
    assert (
        "on disk as   input_ids int32, attention_mask uint8, position_ids uint8 "
        "(loaded in the schema's dtypes)"
    ) in text
    assert "on disk as" not in describe_artifact(save_artifact(rollout_like(), tmp_path / "w", narrow=False).path)  # fmt: skip
