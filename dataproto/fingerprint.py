"""sha256 helpers for artifacts: per-file digests and the artifact's content fingerprint.

The content fingerprint of an artifact is

    sha256( "ppoflow-fingerprint-v1\\n" + layout_json + "\\n" + Σ_f  f.name + " " + f.sha256 + "\\n" )

over its files in sorted name order, where ``layout_json`` is the canonical JSON (sorted keys, no
spaces) of what maps files back to a DataProto (the schema and the file of every key). Stage,
config and free ``extra`` fields are not part of it: the same content written by two stages has
one fingerprint.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import IO, Any

CHUNK_BYTES = 8 << 20  # 8 MiB reads when hashing a file
BACKGROUND_HASH_BYTES = 1 << 20  # writes from 1 MiB up are hashed on a background thread


def sha256_bytes(data: bytes | memoryview) -> str:
    """Hex sha256 of a buffer.

    >>> sha256_bytes(b"")[:16]
    'e3b0c44298fc1c14'
    """
    return hashlib.sha256(data).hexdigest()


def sha256_stream(stream: IO[bytes], chunk_bytes: int = CHUNK_BYTES) -> tuple[str, int]:
    """(hex sha256, byte count) of everything left in a binary stream, read in chunks.

    >>> import io
    >>> sha256_stream(io.BytesIO(b"abc"))[1]
    3
    """
    digest = hashlib.sha256()
    size = 0
    while chunk := stream.read(chunk_bytes):
        digest.update(chunk)
        size += len(chunk)
    return digest.hexdigest(), size


class HashingWriter:
    """Wraps a binary file: every ``write`` also feeds a sha256 and a byte counter.

    Updates of large buffers (≥ 1 MiB) run on one background thread, in write order, while the
    caller goes on writing (hashlib and file writes both release the GIL on large buffers), so a
    large save costs about max(write, hash) instead of their sum. The caller must keep each buffer unchanged until
    :meth:`hexdigest` returns, which waits for the pending updates.

    >>> import io
    >>> with HashingWriter(io.BytesIO()) as w:
    ...     w.write(b"abc")
    ...     w.nbytes, w.hexdigest() == sha256_bytes(b"abc")
    3
    (3, True)
    """

    def __init__(self, raw: IO[bytes]) -> None:
        self._raw = raw
        self._digest = hashlib.sha256()
        self._pool: ThreadPoolExecutor | None = None  # started on the first large write
        self._pending: list[Future] = []
        self.nbytes = 0

    def write(self, data: bytes | memoryview) -> int:
        if len(data) >= BACKGROUND_HASH_BYTES:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sha256")
            self._pending.append(self._pool.submit(self._digest.update, data))
        else:  # small buffers: hash inline, after the pending large ones (keeps the order)
            self._drain()
            self._digest.update(data)
        self._raw.write(data)
        self.nbytes += len(data)
        return len(data)

    def _drain(self) -> None:
        for future in self._pending:
            future.result()  # re-raises a hashing error
        self._pending.clear()

    def hexdigest(self) -> str:
        self._drain()
        return self._digest.hexdigest()

    def __enter__(self) -> HashingWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)


def canonical_json(value: Any) -> str:
    """Deterministic JSON text (sorted keys, no whitespace) used inside fingerprints.

    >>> canonical_json({"b": [1, 2], "a": None})
    '{"a":null,"b":[1,2]}'
    """
    return json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=False)


def content_fingerprint(file_digests: Mapping[str, str], layout: Any) -> str:
    """The artifact fingerprint (formula in the module docstring).

    Args:
        file_digests: file name (relative to the artifact dir) → hex sha256 of its bytes.
        layout: JSON-ready description of how the files map to keys (schema + file table).

    >>> a = content_fingerprint({"x.npy": "00", "m.json": "11"}, {"rows": 2})
    >>> a == content_fingerprint({"m.json": "11", "x.npy": "00"}, {"rows": 2})
    True
    >>> a == content_fingerprint({"x.npy": "01", "m.json": "11"}, {"rows": 2})
    False
    """
    digest = hashlib.sha256()
    digest.update(b"ppoflow-fingerprint-v1\n")
    digest.update(canonical_json(layout).encode())
    digest.update(b"\n")
    for line in _digest_lines(file_digests):
        digest.update(line.encode())
    return digest.hexdigest()


def _digest_lines(file_digests: Mapping[str, str]) -> Iterable[str]:
    for name in sorted(file_digests):
        yield f"{name} {file_digests[name]}\n"
