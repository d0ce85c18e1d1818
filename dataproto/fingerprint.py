"""Digests for artifacts: the per-file digest (two algorithms) and the artifact's fingerprint.

Every artifact file gets a digest by one of two algorithms (``DIGESTS``); the manifest's file
table names it per file. ``blake3`` is the default (the artifact's fingerprint stays a sha256);
a manifest that names no digest was written with ``sha256_tree``.

**sha256_tree** (format version 2). A file's bytes are cut into chunks of ``CHUNK_BYTES`` (4 MiB;
the last chunk is shorter, an empty file has no chunk). Each chunk gets its own sha256, and

    file_digest = sha256( "ppoflow-sha256-tree-v1 " + CHUNK_BYTES + " " + size + "\\n"
                          + sha256(chunk_0) + sha256(chunk_1) + … )

with the sizes in decimal and the chunk digests as raw 32-byte values. This is still sha256 all
the way down, so a flipped byte anywhere changes its chunk's digest and the file digest, but the
chunks are independent, so a thread pool hashes them in parallel (hashlib releases the GIL on
large buffers) while the writer goes on writing. It differs from ``sha256sum`` of the file.

**blake3**: the plain 256-bit BLAKE3 hash of the file's bytes (what ``b3sum`` prints), computed by
the ``blake3`` package on up to :func:`hash_threads` threads, beside the writer. BLAKE3 is a
cryptographic hash and a Merkle tree by design; on this project's CPUs (AMD EPYC with SHA-NI and
AVX2) it hashes 2.2× faster per core than sha256, so a large save needs less CPU
(bench/README.md). The default; ``save_artifact(..., digest="sha256_tree")`` or
``ppoflow.artifact_digest=sha256_tree`` keeps sha256 all the way down.

**Content fingerprint** of an artifact, a sha256 whichever file digest is used:

    sha256( "ppoflow-fingerprint-v2\\n" + layout_json + "\\n"
            + Σ_f  f.name + " " + tag + f.digest + "\\n" )

over its files in sorted name order, where ``tag`` is empty for ``sha256_tree`` and ``"blake3:"``
for ``blake3``, and ``layout_json`` is the canonical JSON (sorted keys, no spaces) of what maps
files back to a DataProto (the schema and the file of every key). Stage, config and free
``extra`` fields are not part of it: the same content written by two stages, with the same
digest, has one fingerprint.
"""

from __future__ import annotations

import hashlib
import json
import mmap
import os
import threading
from collections.abc import Iterable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import IO, Any, Literal, get_args

CHUNK_BYTES = 4 << 20  # tree chunk size; part of the format (changing it changes every digest)
TREE_PREFIX = b"ppoflow-sha256-tree-v1"

Digest = Literal["sha256_tree", "blake3"]
DIGESTS: tuple[Digest, ...] = get_args(Digest)
DEFAULT_DIGEST: Digest = "blake3"
#: the digest of a manifest written before manifests named theirs (all were sha256_tree)
LEGACY_DIGEST: Digest = "sha256_tree"
_FINGERPRINT_TAG: dict[Digest, str] = {"sha256_tree": "", "blake3": "blake3:"}

Buffer = bytes | bytearray | memoryview


# --- the shared hashing pool ----------------------------------------------------------------

_pool: ThreadPoolExecutor | None = None
_pool_pid = -1
_pool_lock = threading.Lock()


def hash_threads() -> int:
    """Threads that hash chunks: one per CPU this process may run on (at most 16)."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cpus = os.cpu_count() or 1
    return max(1, min(16, cpus))


def _hash_pool() -> ThreadPoolExecutor:
    """The process-wide hashing pool, made anew in a forked child (its threads did not survive)."""
    global _pool, _pool_pid
    with _pool_lock:
        if _pool is None or _pool_pid != os.getpid():
            _pool = ThreadPoolExecutor(hash_threads(), thread_name_prefix="ppoflow-sha256")
            _pool_pid = os.getpid()
        return _pool


_queue: ThreadPoolExecutor | None = None
_queue_pid = -1


def _blake3_queue() -> ThreadPoolExecutor:
    """One background thread that runs blake3 updates in the order given (blake3 spreads each
    large update over its own threads); made anew in a forked child like the pool."""
    global _queue, _queue_pid
    with _pool_lock:
        if _queue is None or _queue_pid != os.getpid():
            _queue = ThreadPoolExecutor(1, thread_name_prefix="ppoflow-blake3")
            _queue_pid = os.getpid()
        return _queue


def check_digest_name(digest: str) -> Digest:
    """``digest`` if it names a file digest of this module.

    Raises:
        ValueError: naming the value and the choices.
    """
    if digest not in DIGESTS:
        raise ValueError(f"file digest {digest!r} is unknown; choose one of {list(DIGESTS)}")
    return digest  # type: ignore[return-value]


def _new_blake3() -> Any:
    try:
        import blake3
    except ImportError:
        raise ImportError(
            "the blake3 file digest needs the 'blake3' package (pip install blake3); or use "
            "digest='sha256_tree'"
        ) from None
    return blake3.blake3(max_threads=hash_threads())


def _sha256_pieces(pieces: list[Buffer]) -> bytes:
    digest = hashlib.sha256()
    for piece in pieces:
        digest.update(piece)
    return digest.digest()


def _tree_hexdigest(leaves: Iterable[bytes], size: int) -> str:
    digest = hashlib.sha256(b"%s %d %d\n" % (TREE_PREFIX, CHUNK_BYTES, size))
    for leaf in leaves:
        digest.update(leaf)
    return digest.hexdigest()


# --- digests of buffers, streams and files --------------------------------------------------


class TreeHasher:
    """Incremental file digest (module docstring): ``update`` with the bytes in order.

    Every completed chunk goes to the hashing pool at once, so hashing runs beside the caller.
    The buffers are not copied: the caller must keep each one unchanged until :meth:`hexdigest`
    returns. Chunks may span several ``update`` calls.

    >>> h = TreeHasher()
    >>> h.update(b"ab"); h.update(b"c")
    >>> h.nbytes, h.hexdigest() == digest_bytes(b"abc", "sha256_tree")
    (3, True)
    """

    def __init__(self) -> None:
        self._leaves: list[Future[bytes]] = []  # one per completed chunk, in order
        self._pieces: list[Buffer] = []  # the open (incomplete) chunk
        self._open_bytes = 0
        self.nbytes = 0

    def update(self, data: Buffer) -> None:
        view = memoryview(data).cast("B")  # slicing a view never copies
        start, size = 0, len(view)
        while start < size:
            take = min(CHUNK_BYTES - self._open_bytes, size - start)
            self._pieces.append(view[start : start + take])
            self._open_bytes += take
            start += take
            if self._open_bytes == CHUNK_BYTES:
                self._leaves.append(_hash_pool().submit(_sha256_pieces, self._pieces))
                self._pieces, self._open_bytes = [], 0
        self.nbytes += size

    def hexdigest(self) -> str:
        """The file digest of everything given so far; waits for the pending chunks."""
        leaves = [leaf.result() for leaf in self._leaves]
        if self._pieces:  # the short last chunk, hashed here
            leaves.append(_sha256_pieces(self._pieces))
        return _tree_hexdigest(leaves, self.nbytes)


class Blake3Hasher:
    """Incremental blake3 file digest with :class:`TreeHasher`'s interface.

    A large ``update`` (or any update while others are pending) is queued on one background
    thread, in order, so hashing runs beside the caller; blake3 spreads it over its own threads.
    The buffers are not copied: the caller must keep each one unchanged until :meth:`hexdigest`
    returns.

    >>> h = Blake3Hasher()
    >>> h.update(b"ab"); h.update(b"c")
    >>> h.nbytes, h.hexdigest() == digest_bytes(b"abc", "blake3")
    (3, True)
    """

    def __init__(self) -> None:
        self._hasher = _new_blake3()
        self._pending: list[Future[Any]] = []
        self.nbytes = 0

    def update(self, data: Buffer) -> None:
        view = memoryview(data).cast("B")
        if self._pending or len(view) >= CHUNK_BYTES:
            self._pending.append(_blake3_queue().submit(self._hasher.update, view))
        else:  # small and nothing queued: cheaper inline, and still in order
            self._hasher.update(view)
        self.nbytes += len(view)

    def hexdigest(self) -> str:
        """The digest of everything given so far; waits for the queued updates."""
        for update in self._pending:
            update.result()
        return self._hasher.hexdigest()


def new_hasher(digest: Digest = DEFAULT_DIGEST) -> TreeHasher | Blake3Hasher:
    """An incremental hasher for the file digest named ``digest`` (module docstring)."""
    return Blake3Hasher() if check_digest_name(digest) == "blake3" else TreeHasher()


def digest_bytes(data: Buffer, digest: Digest = DEFAULT_DIGEST) -> str:
    """File digest ``digest`` (module docstring) of a buffer, hashed in parallel.

    >>> digest_bytes(b"") == digest_bytes(bytearray())
    True
    >>> digest_bytes(b"abc") == digest_bytes(b"abd")
    False
    >>> digest_bytes(b"abc", "sha256_tree") == digest_bytes(b"abc")
    False
    """
    hasher = new_hasher(digest)
    hasher.update(data)
    return hasher.hexdigest()


def digest_stream(stream: IO[bytes], digest: Digest = DEFAULT_DIGEST) -> tuple[str, int]:
    """(file digest, byte count) of everything left in a binary stream, read chunk by chunk.

    At most two chunks per hashing thread are held in memory at once.

    >>> import io
    >>> digest_stream(io.BytesIO(b"abc")) == (digest_bytes(b"abc"), 3)
    True
    >>> digest_stream(io.BytesIO(b"abc"), "blake3") == (digest_bytes(b"abc", "blake3"), 3)
    True
    """
    if check_digest_name(digest) == "blake3":
        hasher, size = _new_blake3(), 0
        while chunk := stream.read(CHUNK_BYTES):
            hasher.update(chunk)
            size += len(chunk)
        return hasher.hexdigest(), size
    pool, limit = _hash_pool(), 2 * hash_threads()
    leaves: list[Future[bytes]] = []
    size, done = 0, 0
    while chunk := stream.read(CHUNK_BYTES):
        leaves.append(pool.submit(_sha256_pieces, [chunk]))
        size += len(chunk)
        if len(leaves) - done >= limit:  # bound the chunks in flight
            leaves[done].result()
            done += 1
    return _tree_hexdigest((leaf.result() for leaf in leaves), size), size


def _sha256_mapped(mapped: mmap.mmap, start: int, stop: int) -> bytes:
    with memoryview(mapped) as whole, whole[start:stop] as piece:
        return hashlib.sha256(piece).digest()


def digest_file(path: str, digest: Digest = DEFAULT_DIGEST) -> tuple[str, int]:
    """(file digest, byte count) of a local file: memory-mapped, hashed in parallel.

    Mapping instead of reading avoids copying the bytes out of the page cache. Like the tensor
    views of a load, this assumes the file is not truncated meanwhile (artifact.py's contract).
    """
    if check_digest_name(digest) == "blake3":
        size = os.path.getsize(path)
        hasher = _new_blake3()
        if size:  # blake3 maps the file itself; an empty file cannot be mapped
            hasher.update_mmap(path)
        return hasher.hexdigest(), size
    with open(path, "rb") as handle:
        size = os.fstat(handle.fileno()).st_size
        if size == 0:
            return _tree_hexdigest([], 0), 0
        with mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
            pool = _hash_pool()
            leaves = [
                pool.submit(_sha256_mapped, mapped, start, min(start + CHUNK_BYTES, size))
                for start in range(0, size, CHUNK_BYTES)
            ]
            wait(leaves)  # every view of the map is released before it closes, even on error
            digest = _tree_hexdigest([leaf.result() for leaf in leaves], size)
    return digest, size


class HashingWriter:
    """Wraps a binary file: every ``write`` also feeds the hasher of file digest ``digest``.

    Bytes are hashed in the background while the caller goes on writing (file writes also
    release the GIL), so a large save costs about max(write, hash / threads) instead of their sum.
    The caller must keep each buffer unchanged until :meth:`hexdigest` returns.

    >>> import io
    >>> w = HashingWriter(io.BytesIO())
    >>> w.write(b"abc")
    3
    >>> w.nbytes, w.hexdigest() == digest_bytes(b"abc")
    (3, True)
    """

    def __init__(self, raw: IO[bytes], digest: Digest = DEFAULT_DIGEST) -> None:
        self._raw = raw
        self._hasher = new_hasher(digest)

    @property
    def nbytes(self) -> int:
        return self._hasher.nbytes

    def write(self, data: Buffer) -> int:
        self._hasher.update(data)  # hand the chunks to the pool first, then write beside them
        self._raw.write(data)
        return len(data)

    def hexdigest(self) -> str:
        return self._hasher.hexdigest()


# --- the artifact fingerprint ---------------------------------------------------------------


def canonical_json(value: Any) -> str:
    """Deterministic JSON text (sorted keys, no whitespace) used inside fingerprints.

    >>> canonical_json({"b": [1, 2], "a": None})
    '{"a":null,"b":[1,2]}'
    """
    return json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=False)


def content_fingerprint(
    file_digests: Mapping[str, str], layout: Any, digest: Digest = DEFAULT_DIGEST
) -> str:
    """The artifact fingerprint (formula in the module docstring).

    Args:
        file_digests: file name (relative to the artifact dir) → hex file digest of its bytes.
        layout: JSON-ready description of how the files map to keys (schema + file table).
        digest: the file digest the hex values are (its tag goes into the fingerprint).

    >>> a = content_fingerprint({"x.npy": "00", "m.json": "11"}, {"rows": 2})
    >>> a == content_fingerprint({"m.json": "11", "x.npy": "00"}, {"rows": 2})
    True
    >>> a == content_fingerprint({"x.npy": "01", "m.json": "11"}, {"rows": 2})
    False
    >>> a == content_fingerprint({"x.npy": "00", "m.json": "11"}, {"rows": 2}, "sha256_tree")
    False
    """
    tag = _FINGERPRINT_TAG[check_digest_name(digest)]
    fingerprint = hashlib.sha256()
    fingerprint.update(b"ppoflow-fingerprint-v2\n")
    fingerprint.update(canonical_json(layout).encode())
    fingerprint.update(b"\n")
    for name in sorted(file_digests):
        fingerprint.update(f"{name} {tag}{file_digests[name]}\n".encode())
    return fingerprint.hexdigest()
