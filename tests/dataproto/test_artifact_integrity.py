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
    with pytest.raises(ArtifactError, match=r"tensors\.safetensors: blake3 digest"):
        load_artifact(art)
    with pytest.raises(ArtifactError, match=r"tensors\.safetensors: blake3 digest"):
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


@pytest.mark.parametrize("version", [1, 99])
def test_manifest_from_another_version_is_named(art, version):
    # version 1 digested files with plain sha256; its manifests must not be misread as version 2
    manifest = json.loads((art / "manifest.json").read_text())
    manifest["format_version"] = version
    (art / "manifest.json").write_text(json.dumps(manifest))
    for verify in ("full", "lazy"):
        with pytest.raises(
            ArtifactError, match=rf"manifest\.json: format version {version}; this ppoflow reads"
        ):
            load_artifact(art, verify=verify)
    with pytest.raises(ArtifactError, match=rf"format version {version}"):
        verify_artifact(art)


def test_missing_or_unreadable_manifest(art, tmp_path):
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
    values = torch.arange(1, rows * width + 1, dtype=torch.float32).view(rows, width)
    td = TensorDict({"values": values}, batch_size=[rows])  # no padding: stored dense
    save_artifact(DataProto(batch=td), tmp_path / "big")
    tensor_file = str(tmp_path / "big" / "tensors.safetensors")

    hashed = []
    original = artifact.Store.hash_file
    monkeypatch.setattr(
        artifact.Store,
        "hash_file",
        lambda self, name, digest: hashed.append(name) or original(self, name, digest),
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
    manifest["files"]["../outside.json"] = {"bytes": 1, "sha256_tree": "0"}
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


def test_manifest_file_entry_of_the_wrong_shape_is_named(art):
    manifest = json.loads((art / "manifest.json").read_text())
    manifest["files"]["meta_info.json"] = {"bytes": 10, "sha256": "0" * 64}  # a version-1 entry
    (art / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ArtifactError, match=r"file entry 'meta_info\.json'.*blake3"):
        load_artifact(art, verify="lazy")


# --- a large tensor file: several digest chunks --------------------------------------------


@pytest.fixture(scope="module")
def large_art(tmp_path_factory):
    """An artifact whose tensor file spans 3 chunks of the file digest (about 20 MiB)."""
    from dataproto.fingerprint import CHUNK_BYTES

    rows = 16
    width = (5 * CHUNK_BYTES // 2) // (rows * 4)  # 2.5 chunks of float32
    td = TensorDict(
        {"values": torch.randn(rows, width, generator=torch.Generator().manual_seed(0))},
        batch_size=[rows],
    )
    path = tmp_path_factory.mktemp("large") / "art"
    save_artifact(DataProto(batch=td), path)
    return path


@pytest.mark.parametrize("where", ["first", "chunk_1", "chunk_1_end", "last"])
def test_flipped_byte_in_any_chunk_of_a_large_tensor_is_caught(large_art, tmp_path, where):
    import shutil

    from dataproto.fingerprint import CHUNK_BYTES

    art = tmp_path / "copy"
    shutil.copytree(large_art, art)
    size = (art / "tensors.safetensors").stat().st_size
    assert size > 2 * CHUNK_BYTES  # the fixture really spans three chunks
    offset = {
        "first": 4096,
        "chunk_1": CHUNK_BYTES + 12345,
        "chunk_1_end": 2 * CHUNK_BYTES - 1,
        "last": size - 1,
    }[where]
    verify_artifact(art)
    _flip(art / "tensors.safetensors", offset)
    with pytest.raises(ArtifactError, match=r"tensors\.safetensors: blake3 digest"):
        load_artifact(art)
    with pytest.raises(ArtifactError, match=r"tensors\.safetensors: blake3 digest"):
        verify_artifact(art)


def test_large_tensor_round_trips_bit_exact(large_art):
    values = load_artifact(large_art).batch["values"]
    expected = torch.randn(values.shape, generator=torch.Generator().manual_seed(0))
    assert torch.equal(values, expected)


def test_large_artifact_in_memory_store_is_verified(large_art):
    import uuid

    import fsspec

    url = f"memory://ppoflow-tests/{uuid.uuid4().hex}/large"
    data = load_artifact(large_art)
    ref = save_artifact(data, url)
    assert ref.fingerprint == artifact.artifact_ref(large_art).fingerprint  # same bytes, same key
    verify_artifact(url)
    fs = fsspec.filesystem("memory")
    name = f"{url.removeprefix('memory://')}/tensors.safetensors"
    raw = bytearray(fs.cat_file(name))
    raw[len(raw) // 2] ^= 0x10
    fs.pipe_file(name, bytes(raw))
    with pytest.raises(ArtifactError, match=r"memory://.*tensors\.safetensors: blake3 digest"):
        load_artifact(url, verify="lazy")
    with pytest.raises(ArtifactError, match=r"memory://.*tensors\.safetensors: blake3 digest"):
        verify_artifact(url)
