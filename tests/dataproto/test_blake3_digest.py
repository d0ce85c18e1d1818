"""The opt-in blake3 file digest: equals plain BLAKE3 of the bytes however they arrive, and
artifacts written with it round-trip, record it, and catch corruption like sha256_tree ones."""

from __future__ import annotations

import io
import itertools
import json
import os

import blake3
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from tensordict import TensorDict

from dataproto.artifact import (
    ArtifactError,
    artifact_ref,
    load_artifact,
    save_artifact,
    verify_artifact,
)
from dataproto.fingerprint import (
    CHUNK_BYTES,
    Blake3Hasher,
    HashingWriter,
    digest_bytes,
    digest_file,
    digest_stream,
)
from dataproto.protocol import DataProto
from dataproto.report import describe_artifact


def plain_blake3(data: bytes) -> str:
    """The oracle: the blake3 package, one thread, one call."""
    return blake3.blake3(data).hexdigest()


def blake3_digests(pieces: list[bytes], tmp_dir: str) -> set[str]:
    whole = b"".join(pieces)
    hasher = Blake3Hasher()
    out = io.BytesIO()
    writer = HashingWriter(out, "blake3")
    for piece in pieces:
        hasher.update(piece)
        writer.write(memoryview(piece))
    path = os.path.join(tmp_dir, "f.bin")
    with open(path, "wb") as handle:
        handle.write(whole)
    assert out.getvalue() == whole and writer.nbytes == hasher.nbytes == len(whole)
    assert digest_file(path, "blake3")[1] == digest_stream(io.BytesIO(whole), "blake3")[1]
    return {
        hasher.hexdigest(),
        writer.hexdigest(),
        digest_bytes(whole, "blake3"),
        digest_stream(io.BytesIO(whole), "blake3")[0],
        digest_file(path, "blake3")[0],
    }


@settings(max_examples=40, deadline=None)
@given(data=st.binary(max_size=3000), cuts=st.lists(st.integers(0, 3000), max_size=6))
def test_every_entry_point_is_plain_blake3_for_any_split(tmp_path_factory, data, cuts):
    bounds = sorted({0, len(data), *(min(c, len(data)) for c in cuts)})
    pieces = [data[a:b] for a, b in itertools.pairwise(bounds)] or [b""]
    assert blake3_digests(pieces, str(tmp_path_factory.mktemp("b3"))) == {plain_blake3(data)}


def test_large_updates_are_queued_in_order(tmp_path):
    """Pieces over CHUNK_BYTES go to the background queue; the small ones after them must wait."""
    rng = np.random.default_rng(0)
    data = rng.integers(0, 256, 3 * CHUNK_BYTES + 5, dtype=np.uint8).tobytes()
    pieces = [data[:7], data[7 : 2 * CHUNK_BYTES], data[2 * CHUNK_BYTES : -3], data[-3:]]
    assert blake3_digests(pieces, str(tmp_path)) == {plain_blake3(data)}
    swapped = [pieces[0], pieces[2], pieces[1], pieces[3]]
    assert blake3_digests(swapped, str(tmp_path)) != {plain_blake3(data)}


def test_unknown_digest_name_is_refused_before_writing(tmp_path):
    with pytest.raises(ValueError, match=r"file digest 'md5' is unknown.*blake3"):
        save_artifact(_data(), tmp_path / "a", digest="md5")
    assert not (tmp_path / "a").exists()


def _data(rows: int = 4, width: int = 8) -> DataProto:
    td = TensorDict(
        {
            "responses": torch.arange(rows * width).reshape(rows, width),
            "values": torch.linspace(-1, 0, rows * width, dtype=torch.bfloat16).reshape(rows, -1),
        },
        batch_size=[rows],
    )
    uid = np.array([f"u{i}" for i in range(rows)], dtype=object)
    return DataProto(batch=td, non_tensor_batch={"uid": uid}, meta_info={"temperature": 1.0})


@pytest.fixture
def art(tmp_path):
    path = tmp_path / "art"
    save_artifact(_data(), path, digest="blake3")
    return path


def test_blake3_artifact_round_trips_and_records_its_digest(art, tmp_path):
    manifest = json.loads((art / "manifest.json").read_text())
    assert manifest["digest"] == "blake3"
    for name, entry in manifest["files"].items():
        assert entry == {"bytes": (art / name).stat().st_size, "blake3": entry["blake3"]}
        assert entry["blake3"] == plain_blake3((art / name).read_bytes())  # b3sum agrees
    for verify in ("full", "lazy"):
        loaded = load_artifact(art, verify=verify)
        assert torch.equal(loaded.batch["values"], _data().batch["values"])
        assert list(loaded.non_tensor_batch["uid"]) == ["u0", "u1", "u2", "u3"]
    verify_artifact(art)
    ref = artifact_ref(art)
    assert f"fingerprint  {ref.fingerprint} (sha256; files: blake3)" in describe_artifact(art)
    sha = save_artifact(_data(), tmp_path / "sha", digest="sha256_tree")
    assert artifact_ref(art).fingerprint != sha.fingerprint  # the digest is part of it


def test_flipped_tensor_byte_is_named_with_the_blake3_digest(art):
    raw = bytearray((art / "tensors.safetensors").read_bytes())
    raw[-3] ^= 1
    (art / "tensors.safetensors").write_bytes(bytes(raw))
    for check in (load_artifact, verify_artifact):
        with pytest.raises(ArtifactError, match=r"tensors\.safetensors: blake3 digest"):
            check(art)


def test_a_manifest_whose_entries_use_another_digest_is_refused(art):
    manifest = json.loads((art / "manifest.json").read_text())
    manifest["digest"] = "sha256_tree"
    (art / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ArtifactError, match=r"file entry .*'sha256_tree': hex str"):
        load_artifact(art)
    manifest["digest"] = "crc32"
    (art / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ArtifactError, match=r"manifest\.json: file digest 'crc32' is unknown"):
        load_artifact(art)


def test_a_manifest_from_before_the_digest_field_reads_as_sha256_tree(tmp_path):
    path = tmp_path / "old"
    ref = save_artifact(_data(), path, digest="sha256_tree")  # all that format 2 wrote then
    manifest = json.loads((path / "manifest.json").read_text())
    del manifest["digest"]  # what artifact format 2 wrote before the field existed
    (path / "manifest.json").write_text(json.dumps(manifest))
    assert artifact_ref(path).fingerprint == ref.fingerprint
    verify_artifact(path)
    assert torch.equal(load_artifact(path).batch["responses"], _data().batch["responses"])


def test_blake3_artifact_in_a_memory_store_is_verified():
    url = "memory://ppoflow-tests/blake3-art"
    save_artifact(_data(), url, digest="blake3", overwrite=True)
    assert torch.equal(load_artifact(url).batch["responses"], _data().batch["responses"])
    verify_artifact(url)
