"""Stage cache records: plain JSON naming one ArtifactRef, read only after ppoflow has checked them.

A stage task (flows/stage_task.py) is a Prefect task whose cached value is an
:class:`~dataproto.artifact.ArtifactRef`. Prefect keeps a *cache record* per cache key (its key
storage) and the value apart from it (its result storage); for a local run::

    RUN/cache/<key>        the cache record, Prefect's result metadata:
                           {"storage_key": "/abs/RUN/cache/refs/<key>", "expiration": null,
                            "serializer": {"type": "ppoflow-artifact-ref"},
                            "prefect_version": "3.9.1", "storage_block_id": null}
    RUN/cache/refs/<key>   the value, the reference as JSON:
                           {"fingerprint": "<64 hex>", "nbytes": 4096, "path": "step_1/reward",
                            "rows": 8}

``path`` is the artifact's name relative to the run directory; a record holds nothing else.

Why configuring a serializer is not enough (Prefect 3.9: ``prefect/results.py``,
``prefect/_internal/result_records.py``). Prefect decodes a stored value with the serializer
that the stored *metadata* names (``ResultRecord.deserialize`` and
``deserialize_from_result_and_metadata`` call ``metadata.serializer.loads``), not with the one
the task configures, and it decodes already to test whether a key exists (``ResultStore.exists``,
the cache lookup). A planted record declaring ``{"type": "pickle"}`` is unpickled on the next
lookup whatever the task configures; one declaring ``"json"`` reaches
``prefect_json_object_decoder``, which imports and validates any class that a ``"__class__"``
entry names; and merely validating a declared serializer imports the modules its fields name
(``picklelib``, ``jsonlib``, ``object_decoder``).

So a stage task is configured through Prefect's documented options (:func:`task_options`), with
nothing patched (the checking storage is the cache policy's key storage because a block given as
``result_storage`` must be saved on a Prefect server first; key storage need not be):

* ``result_serializer``: :class:`ArtifactRefSerializer`, an ArtifactRef to and from JSON with
  the standard-library parser (no object hook, no import by name);
* ``cache_policy``'s ``key_storage``: :class:`CacheRecordStorage`, a ``LocalFileSystem`` whose
  ``read_path`` (the only way Prefect reads a record, for ``exists`` and ``read`` alike) checks
  the record *and* the reference it points to with the standard-library parser
  (:meth:`CacheRecordStorage.read_record`), then hands Prefect metadata re-encoded from the
  checked values: ppoflow's serializer and the reference's own path, never the file's bytes. So
  the serializer Prefect decodes the value with is always ppoflow's. A record that fails raises
  :class:`CacheRecordError` before Prefect parses anything; Prefect's lookup takes it as "no
  record". Record writes are atomic (temp file + ``os.replace``), the reference is written first;
* ``result_storage``: ``RUN/cache/refs`` (Prefect's plain local storage; a write killed half
  way leaves a truncated reference, which the check refuses).

A refused record (another serializer, a pickle, garbled or truncated JSON, fields ppoflow never
writes, a missing or damaged reference) is a cache miss, never an error and never decoded:
``run_stage`` asks :func:`record_problem` first, logs one warning naming the file, recomputes the
stage with the cache refreshed (which replaces the record) and journals the reason. Records of
earlier ppoflow versions (a cloudpickled ArtifactRef in Prefect's single-file format at
``RUN/cache/<key>``) are refused the same way: ``serializer 'pickle' is not ppoflow's JSON
record``.

Prefect also stores a failed task's exception, under a random key that no lookup uses;
:class:`ArtifactRefSerializer` writes it as ``{"error": type, "message": str}`` and never reads
it back. Left out: a task-run state fetched from a Prefect server and resolved with
``State.result()`` is read by Prefect's own reader, not this one; ppoflow never does that.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any, ClassVar

from prefect.cache_policies import CacheKeyFnPolicy
from prefect.filesystems import LocalFileSystem
from prefect.results import ResultRecordMetadata
from prefect.serializers import Serializer
from pydantic import Field

from dataproto.artifact import ArtifactRef

RECORD_SERIALIZER = "ppoflow-artifact-ref"  # the serializer ``type`` every record declares
REFS_DIR = "refs"  # <cache_dir>/refs/<key>: the references (Prefect's result storage)
REF_FIELDS = ("fingerprint", "nbytes", "path", "rows")  # an ArtifactRef's fields, sorted
METADATA_FIELDS = ("expiration", "prefect_version", "serializer", "storage_block_id", "storage_key")
MAX_RECORD_BYTES = 1 << 16  # a record or reference is a few hundred bytes; far larger is neither
_FINGERPRINT = re.compile(r"[0-9a-f]{64}")


class CacheRecordError(ValueError):
    """A cache record ppoflow will not read; the message names the file and what is wrong."""


# --- the reference as JSON ---------------------------------------------------------------------


def encode_ref(ref: ArtifactRef) -> bytes:
    """An ArtifactRef as JSON (sorted keys).

    >>> encode_ref(ArtifactRef("step_1/reward", "ab" * 4, 8, 4096))
    b'{"fingerprint": "abababab", "nbytes": 4096, "path": "step_1/reward", "rows": 8}'
    """
    return json.dumps(asdict(ref), sort_keys=True).encode()


def decode_ref(data: Any) -> ArtifactRef:
    """The ArtifactRef that decoded JSON ``data`` holds: exactly :data:`REF_FIELDS`, each typed.

    >>> data = {"path": "step_1/reward", "fingerprint": "ab" * 32, "rows": 8, "nbytes": 9}
    >>> decode_ref(data) == ArtifactRef("step_1/reward", "ab" * 32, 8, 9)
    True

    Raises:
        ValueError: anything else, naming what differs.
    """
    if not isinstance(data, dict) or sorted(data) != list(REF_FIELDS):
        got = sorted(data) if isinstance(data, dict) else f"a JSON {type(data).__name__}"
        raise ValueError(f"not an artifact reference: expected keys {list(REF_FIELDS)}, got {got}")
    path, fingerprint = data["path"], data["fingerprint"]
    if not isinstance(path, str) or not path or "\x00" in path:
        raise ValueError(f"the reference's path {path!r} is not an artifact name")
    if not isinstance(fingerprint, str) or not _FINGERPRINT.fullmatch(fingerprint):
        raise ValueError(f"the reference's fingerprint {fingerprint!r} is not 64 lowercase hex")
    for name in ("rows", "nbytes"):
        if type(data[name]) is not int or data[name] < 0:
            raise ValueError(f"the reference's {name} {data[name]!r} is not a count (int >= 0)")
    return ArtifactRef(path, fingerprint, data["rows"], data["nbytes"])


class ArtifactRefSerializer(Serializer):
    """Prefect serializer of stage results: an ArtifactRef to and from plain JSON, nothing else.

    A failed task's exception (Prefect stores one under a random key) becomes
    ``{"error": type name, "message": str(exc)}``; :meth:`loads` refuses it.
    """

    type: str = Field(default=RECORD_SERIALIZER, frozen=True)

    def dumps(self, obj: ArtifactRef | BaseException) -> bytes:
        if isinstance(obj, ArtifactRef):
            return encode_ref(obj)
        if isinstance(obj, BaseException):
            return json.dumps({"error": type(obj).__name__, "message": str(obj)}).encode()
        raise TypeError(
            f"a stage task returns an ArtifactRef; got {type(obj).__name__}, which a cache "
            "record cannot hold"
        )

    def loads(self, blob: bytes) -> ArtifactRef:
        return decode_ref(json.loads(blob))


# --- checking a record -------------------------------------------------------------------------


def _declared_serializer(record: dict[str, Any]) -> Any:
    """The serializer a record declares: at the top (ppoflow's records, Prefect 2's
    ``PersistedResultBlob``) or under ``metadata`` (Prefect 3's single-file result record, the
    format of earlier ppoflow versions)."""
    metadata = record.get("metadata")
    return metadata.get("serializer") if isinstance(metadata, dict) else record.get("serializer")


def _serializer_problem(declared: Any) -> str | None:
    if declared == {"type": RECORD_SERIALIZER}:
        return None
    kind = declared.get("type") if isinstance(declared, dict) else None
    if kind == RECORD_SERIALIZER:
        extra = sorted(set(declared) - {"type"})
        return f"serializer {RECORD_SERIALIZER!r} with fields ppoflow never writes {extra}"
    if kind is None:
        return "it declares no serializer; it is not ppoflow's JSON record"
    return f"serializer {kind!r} is not ppoflow's JSON record"


def metadata_problem(record: Any) -> str | None:
    """What keeps parsed JSON ``record`` from being a cache record ppoflow wrote, or None.

    >>> metadata_problem({"serializer": {"type": "ppoflow-artifact-ref"}, "expiration": None})
    >>> metadata_problem({"metadata": {"serializer": {"type": "pickle"}}, "result": "gAS..."})
    "serializer 'pickle' is not ppoflow's JSON record"
    """
    if not isinstance(record, dict):
        return f"a JSON {type(record).__name__}, not a cache record"
    problem = _serializer_problem(_declared_serializer(record))
    if problem is not None:
        return problem
    unknown = sorted(set(record) - set(METADATA_FIELDS))
    if unknown:
        return f"fields ppoflow never writes {unknown}"
    unused = {name: record.get(name) for name in ("expiration", "storage_block_id")}
    if any(value is not None for value in unused.values()):
        return f"values ppoflow never writes {unused} (both are null)"
    return None


def read_json(file: Path, what: str) -> Any:
    """The JSON in ``file`` (at most :data:`MAX_RECORD_BYTES`), parsed by the standard library.

    Raises:
        CacheRecordError: not a file, too large, not JSON, garbled or truncated (``what`` named).
    """
    if not file.is_file():
        raise CacheRecordError(f"{what} {file}: missing or not a file")
    with open(file, "rb") as stream:
        content = stream.read(MAX_RECORD_BYTES + 1)
    if len(content) > MAX_RECORD_BYTES:
        raise CacheRecordError(
            f"{what} {file}: over {MAX_RECORD_BYTES} bytes, far larger than ppoflow writes"
        )
    try:
        return json.loads(content)
    except (ValueError, RecursionError) as err:  # JSONDecodeError, UnicodeDecodeError, nesting
        raise CacheRecordError(
            f"{what} {file}: not JSON, or garbled or truncated ({err})"
        ) from None


# --- the storage Prefect reads records through -------------------------------------------------


class CacheRecordStorage(LocalFileSystem):
    """Prefect key storage for stage cache records (module docstring); ``basepath`` is the cache
    directory, the references are in its ``refs/``.

    Reads hand Prefect only records that :meth:`read_record` accepts, re-encoded; writes are
    atomic.
    """

    _block_type_name: ClassVar[str] = "ppoflow Cache Records"

    def _file(self, name: str) -> Path:
        try:
            return self._resolve_path(name)
        except ValueError as err:  # a name or a symlink leading out of the cache directory
            raise CacheRecordError(f"cache record {name}: {err}") from None

    def read_record(self, key: str) -> tuple[Path, ArtifactRef] | None:
        """The reference file and the reference the record of ``key`` names; None when there is
        no record. The record's own ``storage_key`` is ignored: the reference is ``refs/<key>``.

        Raises:
            CacheRecordError: ``cache record <file>: <what is wrong>``; nothing was decoded.
        """
        record_file = self._file(key)
        if not record_file.exists():
            return None
        problem = metadata_problem(read_json(record_file, "cache record"))
        if problem is not None:
            raise CacheRecordError(f"cache record {record_file}: {problem}")
        ref_file = self._file(f"{REFS_DIR}/{key}")
        try:
            return ref_file, decode_ref(read_json(ref_file, "its reference"))
        except CacheRecordError as err:
            raise CacheRecordError(f"cache record {record_file}: {err}") from None
        except ValueError as err:
            raise CacheRecordError(f"cache record {record_file}: {ref_file}: {err}") from None

    def read_path(self, path: str, _sync: bool | None = None) -> bytes:
        """Prefect's read of a record (``ResultStore.exists`` and ``read``): the checked record,
        re-encoded. (``_sync`` is the flag Prefect passes on its synchronous calls; unused.)"""
        found = self.read_record(path)
        if found is None:
            raise ValueError(f"Path {self._file(path)} does not exist.")  # Prefect's "no record"
        ref_file, _ = found
        serializer = ArtifactRefSerializer()
        return ResultRecordMetadata(storage_key=str(ref_file), serializer=serializer).dump_bytes()

    async def aread_path(self, path: str) -> bytes:
        return self.read_path(path)

    def write_path(self, path: str, content: bytes, _sync: bool | None = None) -> str:
        """Write ``content`` to ``path`` atomically (a temp file beside it, then a rename)."""
        file = self._file(path)
        file.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=file.parent, prefix=f".{file.name}.tmp-")
        try:
            with os.fdopen(fd, "wb") as stream:
                stream.write(content)
            os.replace(tmp, file)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return str(file)

    async def awrite_path(self, path: str, content: bytes) -> str:
        return self.write_path(path, content)


def task_options(
    cache_dir: str | os.PathLike, key_fn: Callable[[Any, dict[str, Any]], str]
) -> dict[str, Any]:
    """The ``task(...)`` options that keep a stage's cache records in ``cache_dir``: the cache
    policy (``key_fn`` computes the key; records in :class:`CacheRecordStorage`), the result
    storage (``refs/``) and :class:`ArtifactRefSerializer`."""
    storage = CacheRecordStorage(basepath=str(cache_dir))
    return {
        "cache_policy": CacheKeyFnPolicy(cache_key_fn=key_fn, key_storage=storage),
        "persist_result": True,
        "result_storage": Path(cache_dir) / REFS_DIR,
        "result_serializer": ArtifactRefSerializer(),
    }


def record_problem(cache_dir: str | os.PathLike, key: str) -> str | None:
    """Why the cache record of ``key`` in ``cache_dir`` is refused, or None (none, or a good one).

    >>> import tempfile; cache = tempfile.mkdtemp()
    >>> _ = Path(cache, "k").write_text('{"metadata": {"serializer": {"type": "pickle"}}}')
    >>> record_problem(cache, "k").endswith("k: serializer 'pickle' is not ppoflow's JSON record")
    True
    >>> record_problem(cache, "absent") is None
    True
    """
    try:
        CacheRecordStorage(basepath=str(cache_dir)).read_record(key)
    except CacheRecordError as err:
        return str(err)
    return None


def has_record(cache_dir: str | os.PathLike, key: str) -> bool:
    """Whether ``cache_dir`` holds a cache record of ``key`` (good or not: :func:`record_problem`
    tells which)."""
    return Path(cache_dir, key).is_file()


def delete_record(cache_dir: str | os.PathLike, key: str) -> None:
    """Remove the cache record of ``key`` and its reference (``refs/<key>``), if there; the
    record first, so a process killed between the two leaves a reference nothing points to,
    never a record without its reference."""
    for name in (key, f"{REFS_DIR}/{key}"):
        Path(cache_dir, name).unlink(missing_ok=True)
