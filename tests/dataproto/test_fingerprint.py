"""The sha256 chunk-tree file digest: matches its documented formula however the bytes arrive
(one buffer, many writes, a stream, a memory-mapped file), and every byte and chunk order counts."""

from __future__ import annotations

import hashlib
import io
import itertools
import multiprocessing
import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import dataproto.fingerprint as fp
from dataproto.fingerprint import (
    CHUNK_BYTES,
    TreeHasher,
)

TREE = "sha256_tree"  # this module tests the tree digest, whatever the default is


def digest_bytes(data, digest=TREE):
    return fp.digest_bytes(data, digest)


def digest_stream(stream, digest=TREE):
    return fp.digest_stream(stream, digest)


def digest_file(path, digest=TREE):
    return fp.digest_file(path, digest)


def HashingWriter(raw, digest=TREE):  # stands for the class, tree digest
    return fp.HashingWriter(raw, digest)


def reference_digest(data: bytes, chunk: int) -> str:
    """The formula of dataproto/fingerprint.py's docstring, written out independently."""
    leaves = b"".join(
        hashlib.sha256(data[i : i + chunk]).digest() for i in range(0, len(data), chunk)
    )
    head = f"ppoflow-sha256-tree-v1 {chunk} {len(data)}\n".encode()
    return hashlib.sha256(head + leaves).hexdigest()


def all_digests(pieces: list[bytes], tmp_dir: str) -> dict[str, str]:
    """The digest of b"".join(pieces) by every entry point."""
    whole = b"".join(pieces)
    hasher = TreeHasher()
    for piece in pieces:
        hasher.update(piece)
    out = io.BytesIO()
    writer = HashingWriter(out)
    for piece in pieces:
        assert writer.write(memoryview(piece)) == len(piece)
    path = os.path.join(tmp_dir, "f.bin")
    with open(path, "wb") as handle:
        handle.write(whole)
    assert out.getvalue() == whole and writer.nbytes == hasher.nbytes == len(whole)
    assert digest_stream(io.BytesIO(whole))[1] == digest_file(path)[1] == len(whole)
    return {
        "tree_hasher": hasher.hexdigest(),
        "hashing_writer": writer.hexdigest(),
        "bytes": digest_bytes(whole),
        "stream": digest_stream(io.BytesIO(whole))[0],
        "file": digest_file(path)[0],
    }


@settings(max_examples=60, deadline=None)
@given(
    data=st.binary(max_size=300),
    cuts=st.lists(st.integers(0, 300), max_size=6),
    chunk=st.integers(1, 64),
)
def test_every_entry_point_matches_the_formula_for_any_split_and_chunk_size(data, cuts, chunk):
    import tempfile

    bounds = sorted({0, len(data), *(c for c in cuts if c <= len(data))})
    pieces = [data[a:b] for a, b in itertools.pairwise(bounds)]
    with pytest.MonkeyPatch.context() as patch, tempfile.TemporaryDirectory() as tmp:
        patch.setattr(fp, "CHUNK_BYTES", chunk)
        found = all_digests(pieces, tmp)
    assert set(found.values()) == {reference_digest(data, chunk)}, found


def test_real_chunk_size_over_several_chunks(tmp_path):
    data = np.random.default_rng(0).bytes(2 * CHUNK_BYTES + CHUNK_BYTES // 3)
    pieces = [data[:100], data[100 : CHUNK_BYTES + 7], data[CHUNK_BYTES + 7 :]]
    found = all_digests(pieces, str(tmp_path))
    assert set(found.values()) == {reference_digest(data, CHUNK_BYTES)}
    assert found["bytes"] != hashlib.sha256(data).hexdigest()  # a tree digest, not sha256sum


def test_empty_input_and_exact_chunk_multiples(tmp_path):
    assert set(all_digests([], str(tmp_path)).values()) == {reference_digest(b"", CHUNK_BYTES)}
    data = bytes(CHUNK_BYTES)
    assert set(all_digests([data], str(tmp_path)).values()) == {reference_digest(data, CHUNK_BYTES)}


def test_every_byte_position_and_the_chunk_order_count():
    chunk, data = 16, bytes(range(64))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(fp, "CHUNK_BYTES", chunk)
        base = digest_bytes(data)
        flipped = set()
        for i in range(len(data)):
            altered = bytearray(data)
            altered[i] ^= 0x01
            flipped.add(digest_bytes(altered))
        swapped = digest_bytes(data[16:32] + data[:16] + data[32:])
        longer = digest_bytes(data + b"\0")
    assert base not in flipped and len(flipped) == len(data)
    assert swapped != base and longer != base


def test_non_byte_buffers_are_hashed_as_their_raw_bytes():
    values = np.arange(1000, dtype=np.float32)
    assert digest_bytes(memoryview(values)) == digest_bytes(values.tobytes())


def _digest_in_child(data: bytes, queue) -> None:
    queue.put(digest_bytes(data))


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_hash_pool_works_in_a_forked_child():
    data = np.random.default_rng(1).bytes(CHUNK_BYTES + 5)
    expected = digest_bytes(data)  # the parent's pool now has running threads
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    child = ctx.Process(target=_digest_in_child, args=(data, queue))
    child.start()
    child.join(timeout=60)
    assert child.exitcode == 0
    assert queue.get(timeout=5) == expected
