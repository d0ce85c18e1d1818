"""Artifact integrity: corruption of every kind is an ArtifactError naming the file; atomic writes;
lazy loads memory-map the tensors without hashing or reading them."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch
from tensordict import TensorDict

import dataproto.artifact as artifact
from dataproto.artifact import ArtifactError, load_artifact, save_artifact, verify_artifact
from dataproto.protocol import DataProto


def _data(rows: int = 4, width: int = 8) -> DataProto:
    td = TensorDict(
        {
            "responses": torch.arange(rows * width).reshape(rows, width),
            "old_log_probs": torch.linspace(-1, 0, rows * width).reshape(rows, width),
        },
        batch_size=[rows],
    )
    uid = np.array([f"u{i}" for i in range(rows)], dtype=object)
    return DataProto(batch=td, non_tensor_batch={"uid": uid}, meta_info={"temperature": 1.0})


@pytest.fixture
def art(tmp_path):
    path = tmp_path / "art"
    save_artifact(_data(), path)
    return path


def _flip(path, offset: int) -> None:
    raw = bytearray(path.read_bytes())
    raw[offset] ^= 0x01
    path.write_bytes(bytes(raw))


def test_flipped_tensor_byte_full_load_and_verify_raise_lazy_is_documented(art):
    _flip(art / "tensors.safetensors", -3)  # inside the tensor data
    with pytest.raises(ArtifactError, match=r"tensors\.safetensors.*sha256"):
        load_artifact(art)
    with pytest.raises(ArtifactError, match=r"tensors\.safetensors.*sha256"):
        verify_artifact(art)
    # lazy mode does not hash tensor data (module docstring); sizes and header still match
    assert load_artifact(art, verify="lazy").batch is not None


@pytest.mark.parametrize("verify", ["full", "lazy"])
def test_flipped_byte_in_small_files_detected_in_both_modes(art, verify):
    manifest = json.loads((art / "manifest.json").read_text())
    name = manifest["non_tensor"][0]["file"]
    _flip(art / name, 20)
    with pytest.raises(ArtifactError, match=name):
        load_artifact(art, verify=verify)


@pytest.mark.parametrize("verify", ["full", "lazy"])
def test_tensor_header_corruption_detected_in_both_modes(art, verify):
    raw = (art / "tensors.safetensors").read_bytes()
    offset = raw.index(b"responses")
    _flip(art / "tensors.safetensors", offset)  # "responses" → "sesponses"
    with pytest.raises(ArtifactError, match=r"tensors\.safetensors"):
        load_artifact(art, verify=verify)


@pytest.mark.parametrize("verify", ["full", "lazy"])
@pytest.mark.parametrize("name", ["tensors.safetensors", "meta_info.json", "non_tensor_000.json"])
def test_truncated_file_named(art, verify, name):
    path = art / name
    path.write_bytes(path.read_bytes()[:-5])
    with pytest.raises(ArtifactError, match=rf"{name}.*truncated"):
        load_artifact(art, verify=verify)


@pytest.mark.parametrize("name", ["tensors.safetensors", "meta_info.json", "non_tensor_000.json"])
def test_missing_file_named(art, name):
    os.remove(art / name)
    with pytest.raises(ArtifactError, match=rf"{name}: missing file"):
        load_artifact(art, verify="lazy")
    with pytest.raises(ArtifactError, match=name):
        verify_artifact(art)


def test_other_format_version_and_missing_manifest(art, tmp_path):
    manifest = json.loads((art / "manifest.json").read_text())
    manifest["format_version"] = 2
    (art / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ArtifactError, match=r"manifest\.json: format version 2"):
        load_artifact(art)
    os.remove(art / "manifest.json")
    with pytest.raises(ArtifactError, match=r"manifest\.json: missing manifest"):
        load_artifact(art)
    with pytest.raises(ArtifactError, match="missing manifest"):
        load_artifact(tmp_path / "never-written")
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "manifest.json").write_text("{not json")
    with pytest.raises(ArtifactError, match="unreadable manifest"):
        load_artifact(tmp_path / "junk")


def test_altered_manifest_schema_breaks_fingerprint(art):
    manifest = json.loads((art / "manifest.json").read_text())
    manifest["non_tensor"][0]["key"] = "renamed"
    (art / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ArtifactError, match=r"manifest\.json: the fingerprint"):
        load_artifact(art, verify="lazy")


def test_failed_write_leaves_no_target_and_no_temp(tmp_path, monkeypatch):
    def explode(tensors, out):
        out.write(b"partial bytes")
        raise OSError("disk full")

    monkeypatch.setattr(artifact, "write_tensor_file", explode)
    with pytest.raises(OSError, match="disk full"):
        save_artifact(_data(), tmp_path / "art")
    assert list(tmp_path.iterdir()) == []


def test_failed_overwrite_keeps_the_old_artifact(art, monkeypatch):
    before = artifact.read_manifest(art)["fingerprint"]

    def explode(tensors, out):
        raise OSError("disk full")

    monkeypatch.setattr(artifact, "write_tensor_file", explode)
    with pytest.raises(OSError):
        save_artifact(_data(rows=2), art, overwrite=True)
    verify_artifact(art)
    assert artifact.read_manifest(art)["fingerprint"] == before
    assert sorted(p.name for p in art.parent.iterdir()) == ["art"]


def test_existing_path_needs_overwrite(art):
    with pytest.raises(ArtifactError, match="already exists; pass overwrite=True"):
        save_artifact(_data(), art)


def _mapped_files(ptr: int) -> set[str]:
    """Files whose memory mapping in this process contains address ``ptr`` (Linux)."""
    found = set()
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split()
            start, end = (int(x, 16) for x in fields[0].split("-"))
            if start <= ptr < end and len(fields) >= 6:
                found.add(fields[5])
    return found


@pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="needs Linux /proc")
def test_lazy_load_maps_tensors_without_hashing_or_reading(tmp_path, monkeypatch):
    rows, width = 64, 32768  # 8 MiB of float32
    td = TensorDict({"values": torch.ones(rows, width)}, batch_size=[rows])
    save_artifact(DataProto(batch=td), tmp_path / "big")
    tensor_file = str(tmp_path / "big" / "tensors.safetensors")

    hashed = []
    original = artifact.Store.hash_file
    monkeypatch.setattr(
        artifact.Store, "hash_file", lambda self, name: hashed.append(name) or original(self, name)
    )
    lazy = load_artifact(tmp_path / "big", verify="lazy")
    assert hashed == []  # tensor bytes were not hashed…
    values = lazy.batch["values"]
    assert tensor_file in _mapped_files(values.data_ptr())  # …and are a view of the file's mmap
    assert values.shape == (rows, width)
    load_artifact(tmp_path / "big", verify="full")
    assert hashed == ["tensors.safetensors"]


def test_loaded_tensors_are_copy_on_write(art):
    loaded = load_artifact(art)
    loaded.batch["responses"].add_(1)  # writing to the mapped view must not touch the file
    verify_artifact(art)


def test_manifest_file_names_cannot_escape_the_directory(art):
    manifest = json.loads((art / "manifest.json").read_text())
    manifest["files"]["../outside.json"] = {"bytes": 1, "sha256": "0"}
    (art / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ArtifactError, match="not a plain file name"):
        load_artifact(art)


def test_failed_write_to_memory_store_leaves_nothing(monkeypatch):
    import uuid

    import fsspec

    def explode(tensors, out):
        out.write(b"partial")
        raise OSError("connection lost")

    monkeypatch.setattr(artifact, "write_tensor_file", explode)
    parent = f"/ppoflow-tests/{uuid.uuid4().hex}"
    with pytest.raises(OSError, match="connection lost"):
        save_artifact(_data(), f"memory:/{parent}/art")
    fs = fsspec.filesystem("memory")
    assert not fs.exists(f"{parent}/art")
    assert not fs.exists(parent) or fs.ls(parent, detail=False) == []


def test_ref_path_is_absolute_for_relative_local_paths(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    ref = save_artifact(_data(), "rel/art")
    assert ref.path == str(tmp_path / "rel" / "art")
    assert artifact.artifact_ref("rel/art") == ref


def test_hashing_writer_keeps_order_across_small_and_large_writes():
    import hashlib
    import io

    from dataproto.fingerprint import BACKGROUND_HASH_BYTES, HashingWriter

    pieces = [
        b"head",
        os.urandom(BACKGROUND_HASH_BYTES),
        b"mid",
        os.urandom(2 * BACKGROUND_HASH_BYTES),
    ]
    pieces += [b"tail"]
    out = io.BytesIO()
    with HashingWriter(out) as writer:
        for piece in pieces:
            writer.write(memoryview(piece))
        digest = writer.hexdigest()
    assert (
        digest
        == hashlib.sha256(b"".join(pieces)).hexdigest()
        == hashlib.sha256(out.getvalue()).hexdigest()
    )
    assert writer.nbytes == len(out.getvalue())
