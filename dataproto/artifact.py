"""DataProto artifacts: a safe (no pickle), memory-mapped, fingerprinted directory per batch.

Layout of an artifact directory (a local path or any fsspec URL such as ``memory://x`` or
``s3://bucket/run/step3/reward``)::

    manifest.json            format + version, schema, file digest name, file table (bytes and
                             digest per file), fingerprint, optional stage / stage_version /
                             config / extra
    tensors.safetensors      the batch layer (absent when batch is None); memory-mapped on read;
                             integer tensors in the narrowest lossless dtype (uint8 … int32,
                             dataproto/compact_dtypes.py: masks 1 byte a cell instead of 8),
                             listed in the manifest's ``batch.stored`` and cast back on read;
                             a padded 2-D tensor stored trimmed, each row from its first to its
                             last entry that is not the padding value (dataproto/trimmed_rows.py,
                             listed in ``batch.trimmed``), and padded again on read
    non_tensor_000.npy       a numeric / bool / fixed-width-string numpy array (no pickle)
    non_tensor_001.json      an object array, type-preserving JSON (dataproto/nontensor_codec.py)
    meta_info.json           meta_info, same JSON codec (numpy scalars become Python scalars)

Writes are atomic on a local disk: everything goes into a temp directory beside the target, then
one ``rename`` puts it under the final name (with ``overwrite=True`` an existing artifact is first
renamed aside and deleted afterwards). On other fsspec stores the files are written under a temp
prefix and then moved file by file with ``manifest.json`` last (an artifact being overwritten
loses its manifest first): a reader never finds a manifest whose files are missing, but a crash
during the moves can leave files without a manifest, which reads as "missing manifest". Files are
not fsync'ed: a crash can leave a renamed directory whose bytes never reached the disk, and the
fingerprint check on read catches that.

Every file is digested, while it is written and, on read, over a memory map of the file, by the
file digest named in the manifest's ``digest`` field (dataproto/fingerprint.py): ``blake3``
(default, about 2× less CPU per byte) or ``sha256_tree`` (sha256 of each 4 MiB chunk on a thread
pool, then sha256 over those). A manifest without the field is ``sha256_tree``. Reading verifies before use. ``verify="full"``
(default) hashes every file and checks the fingerprint. ``verify="lazy"`` hashes the small
non-tensor and meta files (they are read anyway), checks every file's size and the safetensors
header against the manifest's schema, and leaves the tensor bytes unhashed so a large batch opens
in O(metadata) time; a flipped byte inside tensor data is then found only by
:func:`verify_artifact` or a full load. Every problem raises :class:`ArtifactError` naming the
file.

Format version 4 (this one) stores padded rows trimmed and integer tensors narrow; versions 3
(narrow, not trimmed) and 2 (every tensor in its in-memory dtype) still load. A narrowed or
trimmed tensor is rebuilt in its in-memory dtype and shape on load, which reads its bytes; the
other tensors stay unread views until touched.

Loaded tensors are private (copy-on-write) views of the file: changing them never changes the
artifact, and replacing the artifact (``overwrite=True`` renames, never rewrites in place) leaves
them valid. Artifact files must never be truncated or rewritten in place by other tools while a
process has them mapped.
"""

from __future__ import annotations

import functools
import json
import os
import re
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch
from tensordict import TensorDict

from dataproto import nontensor_codec as codec
from dataproto.artifact_store import MANIFEST, Store
from dataproto.compact_dtypes import STORED_DTYPE_NAMES, narrow_tensors, widen_tensors
from dataproto.fingerprint import (
    DEFAULT_DIGEST,
    DIGESTS,
    LEGACY_DIGEST,
    Digest,
    HashingWriter,
    check_digest_name,
    content_fingerprint,
    digest_bytes,
)
from dataproto.schema import schema_of, schema_to_json, torch_dtype_name
from dataproto.tensor_file import (
    load_tensor_bytes,
    open_tensor_file,
    plain_tensor,
    write_tensor_file,
)
from dataproto.trimmed_rows import SPANS_SUFFIX, restore_rows, trim_tensors

FORMAT_NAME = "ppoflow-dataproto"
FORMAT_VERSION = 4  # 4: padded rows trimmed (dataproto/trimmed_rows.py); 3: integers narrow
#: the versions this ppoflow reads: 2 (per-file digests, tensors in their in-memory dtypes), 3, 4
READABLE_VERSIONS = (2, 3, 4)
TENSOR_FILE = "tensors.safetensors"
META_FILE = "meta_info.json"

Verify = Literal["full", "lazy"]


class ArtifactError(ValueError):
    """An artifact that cannot be written or trusted; the message names the file or key."""


class ArtifactTypeError(ArtifactError, TypeError):
    """A value that cannot be stored without pickle; raised at write time, nothing is written."""


@dataclass(frozen=True)
class ArtifactRef:
    """A small handle on a written artifact (what a Prefect task caches instead of tensors).

    Attributes:
        path: the artifact's location: an absolute path for a plain local path, else the URL.
        fingerprint: sha256 content fingerprint (dataproto/fingerprint.py).
        rows: number of rows (``len(data)``).
        nbytes: bytes of the data files (manifest excluded).
    """

    path: str
    fingerprint: str
    rows: int
    nbytes: int


# --- writing --------------------------------------------------------------------------------


def _row_count(data: Any) -> int:
    if data.batch is not None:
        return int(data.batch.batch_size[0])
    first = next(iter((data.non_tensor_batch or {}).values()), None)
    return 0 if first is None else len(first)


def _prepare_tensors(data: Any) -> dict[str, Any] | None:
    batch = data.batch
    if batch is None:
        return None
    if len(batch.batch_size) != 1:
        raise ArtifactError(
            f"batch has batch_size {list(batch.batch_size)}; artifacts store one batch dim (rows)"
        )
    try:
        return {str(name): plain_tensor(str(name), value) for name, value in batch.items()}
    except TypeError as err:
        raise ArtifactTypeError(str(err)) from None


def _encode_non_tensor(data: Any) -> list[tuple[str, str, bytes]]:
    """[(key, file name, bytes)] for every non-tensor array, in the dict's order."""
    out = []
    for i, (key, array) in enumerate((data.non_tensor_batch or {}).items()):
        if not isinstance(array, np.ndarray):
            raise ArtifactTypeError(
                f"non_tensor_batch[{key!r}] is a {type(array).__name__}, expected np.ndarray"
            )
        try:
            if array.dtype == object:
                out.append((key, f"non_tensor_{i:03d}.json", codec.encode_object_array(key, array)))
            else:
                out.append((key, f"non_tensor_{i:03d}.npy", codec.encode_numeric_array(key, array)))
        except TypeError as err:
            raise ArtifactTypeError(str(err)) from None
    return out


def _json_field(value: Any, field: str) -> Any:
    """A manifest field as plain JSON data (tuples become lists)."""
    try:
        return json.loads(json.dumps(value, allow_nan=False))
    except (TypeError, ValueError) as err:
        raise ArtifactTypeError(f"manifest field {field!r} is not plain JSON: {err}") from None


def _layout(manifest: dict[str, Any]) -> dict[str, Any]:
    """The manifest fields that map files to keys; part of the fingerprint."""
    keys = ("format_version", "rows", "batch", "non_tensor", "meta_file", "schema")
    return {key: manifest[key] for key in keys}


def save_artifact(
    data: Any,
    path: str | os.PathLike,
    *,
    stage: str | None = None,
    stage_version: str | None = None,
    config: Any = None,
    extra: Any = None,
    overwrite: bool = False,
    digest: Digest = DEFAULT_DIGEST,
    narrow: bool = True,
    trim: bool = True,
    write_in: Callable[[Callable[[], None]], Any] | None = None,
) -> ArtifactRef:
    """Write ``data`` (a DataProto) as an artifact directory at ``path`` (local or fsspec URL).

    Everything is validated and encoded before anything is written, so an unstorable value
    raises :class:`ArtifactTypeError` (naming key, row and type) and leaves no files.

    Args:
        stage, stage_version, config, extra: recorded in the manifest (not in the fingerprint);
            ``config`` and ``extra`` must be plain JSON data.
        overwrite: replace an existing artifact at ``path``; otherwise an existing path is an error.
        digest: the file digest, ``"sha256_tree"`` or ``"blake3"`` (dataproto/fingerprint.py).
        narrow: store integer tensors in their narrowest lossless dtype
            (dataproto/compact_dtypes.py); False writes every tensor in its in-memory dtype
            (as format version 2 did), which keeps a lazy load from reading integer tensors.
        trim: store padded 2-D tensors trimmed (dataproto/trimmed_rows.py); False stores every
            tensor dense (as format version 3 did).
        write_in: run the file writes elsewhere: the fingerprint is computed in memory (every
            file's bytes digested, nothing written), then ``write_in(write)`` is called with the
            function that writes the files, as atomically as a plain save, and returns at once
            (a background writer's submit). ``data``'s tensors must stay unchanged until
            ``write`` has run. Without it the files are written (and digested) here.

    Returns:
        An :class:`ArtifactRef` (path, fingerprint, rows, nbytes); a plain local path is made
        absolute, a URL is kept as given.
    """
    store = Store(os.fspath(path))
    check_digest_name(digest)
    tensors, narrowed, trimmed = _prepare_tensors(data), {}, {}
    keys = None if tensors is None else list(tensors)
    if tensors is not None and trim:
        tensors, trimmed = trim_tensors(tensors)
    if tensors is not None and narrow:
        tensors, narrowed = narrow_tensors(tensors)
    non_tensor = _encode_non_tensor(data)
    try:
        meta_bytes = codec.encode_meta_info(data.meta_info if data.meta_info is not None else {})
    except TypeError as err:
        raise ArtifactTypeError(str(err)) from None
    manifest = {
        "format": FORMAT_NAME,
        "format_version": FORMAT_VERSION,
        "rows": _row_count(data),
        "batch": None
        if tensors is None
        else {
            "file": TENSOR_FILE,
            "rows": int(data.batch.batch_size[0]),
            "keys": keys,
            "stored": {name: torch_dtype_name(dtype) for name, dtype in narrowed.items()},
            "trimmed": trimmed,
        },
        "non_tensor": [{"key": key, "file": name} for key, name, _ in non_tensor],
        "meta_file": META_FILE,
        "schema": schema_to_json(schema_of(data)),
        "digest": digest,
        "stage": stage,
        "stage_version": stage_version,
        "config": _json_field(config, "config"),
        "extra": _json_field(extra, "extra"),
    }
    if store.exists() and not overwrite:
        raise ArtifactError(f"{store.url}: already exists; pass overwrite=True to replace it")
    files = [(name, payload) for _, name, payload in non_tensor] + [(META_FILE, meta_bytes)]
    if write_in is None:
        _write_all(store, manifest, tensors, files, overwrite)
    else:
        _sign(manifest, _digest_in_memory(manifest["digest"], tensors, files))
        write_in(functools.partial(_write_all, store, manifest, tensors, files, overwrite))
    return ArtifactRef(
        store.ref_path(), manifest["fingerprint"], manifest["rows"], manifest["nbytes"]
    )


class _Discard:
    """A binary sink that keeps nothing (the tensor file's bytes digested, not written)."""

    def write(self, data: Any) -> int:
        return len(data)


def _digest_in_memory(
    digest: Digest, tensors: dict[str, Any] | None, files: list[tuple[str, bytes]]
) -> dict[str, dict[str, Any]]:
    """The file table (bytes and digest of each file) of what :func:`_write_all` will write."""
    table: dict[str, dict[str, Any]] = {}
    if tensors is not None:
        hasher = HashingWriter(_Discard(), digest)
        write_tensor_file(tensors, hasher)
        table[TENSOR_FILE] = {"bytes": hasher.nbytes, digest: hasher.hexdigest()}
    for name, payload in files:
        table[name] = {"bytes": len(payload), digest: digest_bytes(payload, digest)}
    return table


def _sign(manifest: dict[str, Any], table: dict[str, dict[str, Any]]) -> None:
    """Fill in the manifest's file table, total bytes and fingerprint."""
    digest = manifest["digest"]
    manifest["files"] = table
    manifest["nbytes"] = sum(entry["bytes"] for entry in table.values())
    manifest["fingerprint"] = content_fingerprint(
        {name: entry[digest] for name, entry in table.items()}, _layout(manifest), digest
    )


def _write_all(
    store: Store,
    manifest: dict[str, Any],
    tensors: dict[str, Any] | None,
    files: list[tuple[str, bytes]],
    overwrite: bool,
) -> None:
    """Write every file into a temp dir, then commit. A manifest without a file table yet gets
    it from the bytes as they are written (digested on the way); a signed one is written as is."""
    temp = store.temp_root()
    digest = manifest["digest"]
    signed = "fingerprint" in manifest
    table: dict[str, dict[str, Any]] = {}
    try:
        store.make_dir(temp)
        if tensors is not None:
            with store.open_write(temp, TENSOR_FILE) as raw:
                writer = raw if signed else HashingWriter(raw, digest)
                write_tensor_file(tensors, writer)
                if not signed:
                    table[TENSOR_FILE] = {"bytes": writer.nbytes, digest: writer.hexdigest()}
        for name, payload in files:
            with store.open_write(temp, name) as handle:
                handle.write(payload)
        if not signed:
            table.update(_digest_in_memory(digest, None, files))
            _sign(manifest, table)
        with store.open_write(temp, MANIFEST) as handle:
            handle.write(json.dumps(manifest, indent=1, allow_nan=False).encode())
        store.commit(temp, list(manifest["files"]), overwrite)
    except BaseException:
        with suppress(OSError):  # cleanup only; the original error propagates
            store.remove(temp)
        raise


# --- reading --------------------------------------------------------------------------------

_SAFE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")  # no "/", no "..", no hidden files
_REQUIRED = ("files", "fingerprint", "rows", "batch", "non_tensor", "meta_file", "schema")


def _read_manifest(store: Store) -> dict[str, Any]:
    where = store.where(MANIFEST)
    if store.size(MANIFEST) is None:
        raise ArtifactError(f"{where}: missing manifest (not an artifact, or an interrupted write)")
    try:
        manifest = json.loads(store.read(MANIFEST))
    except (ValueError, UnicodeDecodeError) as err:
        raise ArtifactError(f"{where}: unreadable manifest ({err})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT_NAME:
        got = manifest.get("format") if isinstance(manifest, dict) else type(manifest).__name__
        raise ArtifactError(f"{where}: format {got!r}, expected {FORMAT_NAME!r}")
    if manifest.get("format_version") not in READABLE_VERSIONS:
        raise ArtifactError(
            f"{where}: format version {manifest.get('format_version')!r}; this ppoflow reads "
            f"versions {READABLE_VERSIONS[0]}-{READABLE_VERSIONS[-1]} (re-create the artifact "
            "with this version)"
        )
    missing = [key for key in _REQUIRED if key not in manifest]
    if missing:
        raise ArtifactError(f"{where}: manifest lacks fields {missing}")
    digest = manifest.setdefault("digest", LEGACY_DIGEST)  # written before the field existed
    if digest not in DIGESTS:
        raise ArtifactError(
            f"{where}: file digest {digest!r} is unknown; this ppoflow reads {list(DIGESTS)}"
        )
    return manifest


def read_manifest(path: str | os.PathLike) -> dict[str, Any]:
    """The manifest of the artifact at ``path``, after checking its format name and version."""
    return _read_manifest(Store(os.fspath(path)))


def artifact_ref(path: str | os.PathLike) -> ArtifactRef:
    """The :class:`ArtifactRef` of an existing artifact, from its manifest (no hashing)."""
    store = Store(os.fspath(path))
    manifest = _read_manifest(store)
    return ArtifactRef(
        store.ref_path(), manifest["fingerprint"], manifest["rows"], manifest["nbytes"]
    )


def _referenced_files(manifest: dict[str, Any]) -> list[str]:
    names = [entry["file"] for entry in manifest["non_tensor"]] + [manifest["meta_file"]]
    return names if manifest["batch"] is None else [manifest["batch"]["file"], *names]


def _check_file_table(store: Store, manifest: dict[str, Any]) -> None:
    """Every referenced file is listed, present and of the recorded size; fingerprint consistent."""
    table, digest = manifest["files"], manifest["digest"]
    for name, entry in table.items():
        if not _SAFE_NAME.fullmatch(name):
            raise ArtifactError(
                f"{store.where(MANIFEST)}: file name {name!r} is not a plain file name"
            )
        if not isinstance(entry, dict) or set(entry) != {"bytes", digest}:
            raise ArtifactError(
                f"{store.where(MANIFEST)}: file entry {name!r} is {entry!r}; expected "
                f"{{'bytes': int, {digest!r}: hex str}}"
            )
    for name in _referenced_files(manifest):
        if name not in table:
            raise ArtifactError(f"{store.where(MANIFEST)}: file {name!r} is used but not listed")
    for name, entry in table.items():
        size = store.size(name)
        if size is None:
            raise ArtifactError(f"{store.where(name)}: missing file (listed in {MANIFEST})")
        if size != entry["bytes"]:
            raise ArtifactError(
                f"{store.where(name)}: {size} bytes, {MANIFEST} says {entry['bytes']} "
                "(truncated or altered)"
            )
    digests = {name: entry[digest] for name, entry in table.items()}
    if content_fingerprint(digests, _layout(manifest), digest) != manifest["fingerprint"]:
        raise ArtifactError(
            f"{store.where(MANIFEST)}: the fingerprint does not match the manifest's file table and "
            "schema (the manifest was altered)"
        )


def _check_digest(store: Store, name: str, found: str, manifest: dict[str, Any]) -> None:
    expected = manifest["files"][name][manifest["digest"]]
    if found != expected:
        raise ArtifactError(
            f"{store.where(name)}: {manifest['digest']} digest {found[:16]}… differs from "
            f"{MANIFEST}'s {expected[:16]}… (the file was altered)"
        )


def _read_checked(store: Store, name: str, manifest: dict[str, Any]) -> bytes:
    raw = store.read(name)
    _check_digest(store, name, digest_bytes(raw, manifest["digest"]), manifest)
    return raw


def _expected_tensors(
    manifest: dict[str, Any], where: str = MANIFEST
) -> dict[str, tuple[str, tuple[int, ...]]]:
    """file tensor name → (dtype in the file, shape): the schema's, with the narrowed entries'
    stored dtype; a trimmed key is its values (count,) and its spans (rows, 2)."""
    batch = manifest["batch"] or {}
    stored, trimmed = batch.get("stored") or {}, _trimmed_keys(manifest, where)
    keys = set(batch.get("keys") or ())
    if not isinstance(stored, dict):
        raise ArtifactError(f"{where}: batch.stored is {stored!r}; expected key → stored dtype")
    entries = keys | {name + SPANS_SUFFIX for name in trimmed}
    for name, dtype in stored.items():
        if name not in entries or dtype not in STORED_DTYPE_NAMES:
            raise ArtifactError(
                f"{where}: batch.stored names {name!r} as {dtype!r}; expected batch keys stored "
                f"as one of {sorted(STORED_DTYPE_NAMES)}"
            )
    expected = {}
    for rec in manifest["schema"]:
        if rec["layer"] != "batch":
            continue
        name, shape = rec["name"], tuple(rec["shape"])
        expected[name] = (stored.get(name, rec["dtype"]), shape)
        if name in trimmed:
            spans = name + SPANS_SUFFIX
            expected[name] = (stored.get(name, rec["dtype"]), (trimmed[name]["count"],))
            expected[spans] = (stored.get(spans, "int64"), (shape[0], 2))
    return expected


def _trimmed_keys(manifest: dict[str, Any], where: str) -> dict[str, dict[str, int]]:
    """The manifest's ``batch.trimmed`` (absent before format 4), checked: 2-D batch keys, each
    with an integer fill and a count within its rows × columns."""
    trimmed = (manifest["batch"] or {}).get("trimmed") or {}
    shapes = {rec["name"]: rec["shape"] for rec in manifest["schema"] if rec["layer"] == "batch"}
    if not isinstance(trimmed, dict):
        raise ArtifactError(f"{where}: batch.trimmed is {trimmed!r}; expected key → fill, count")
    for name, info in trimmed.items():
        shape = shapes.get(name)
        ok = (
            isinstance(shape, list)
            and len(shape) == 2
            and isinstance(info, dict)
            and type(info.get("fill")) is int
            and type(info.get("count")) is int
            and 0 <= info["count"] <= shape[0] * shape[1]
        )
        if not ok:
            raise ArtifactError(
                f"{where}: batch.trimmed[{name!r}] is {info!r}; expected a 2-D batch key with "
                "an integer fill and a count of at most rows × columns"
            )
    return trimmed


def _memory_dtypes(manifest: dict[str, Any], where: str) -> dict[str, torch.dtype]:
    """name → the in-memory dtype the schema records for each batch key."""
    dtypes = {}
    for rec in manifest["schema"]:
        if rec["layer"] == "batch":
            dtype = getattr(torch, str(rec["dtype"]), None)
            if not isinstance(dtype, torch.dtype):
                raise ArtifactError(f"{where}: schema dtype {rec['dtype']!r} is not a torch dtype")
            dtypes[rec["name"]] = dtype
    return dtypes


def _load_tensors(store: Store, manifest: dict[str, Any], verify: Verify) -> TensorDict | None:
    info = manifest["batch"]
    if info is None:
        return None
    name, expected = info["file"], _expected_tensors(manifest, store.where(MANIFEST))
    try:
        if store.is_local:
            if verify == "full":
                _check_digest(store, name, store.hash_file(name, manifest["digest"]), manifest)
            tensors = open_tensor_file(store.path(name), store.where(name), expected)
        else:  # remote: the bytes are read anyway, so always hash them
            raw = _read_checked(store, name, manifest)
            tensors = load_tensor_bytes(raw, store.where(name), expected)
    except ArtifactError:
        raise
    except ValueError as err:
        raise ArtifactError(str(err)) from None
    where = store.where(MANIFEST)
    trimmed = _trimmed_keys(manifest, where)
    dtypes = _memory_dtypes(manifest, where)
    dtypes.update({name + SPANS_SUFFIX: torch.int64 for name in trimmed})
    tensors = widen_tensors(tensors, dtypes)
    shapes = {
        rec["name"]: tuple(rec["shape"]) for rec in manifest["schema"] if rec["layer"] == "batch"
    }
    for name, trim in trimmed.items():
        try:
            tensors[name] = restore_rows(
                tensors[name], tensors.pop(name + SPANS_SUFFIX), trim["fill"], shapes[name]
            )
        except ValueError as err:
            raise ArtifactError(f"{store.where(info['file'])}: {name!r}: {err}") from None
    return TensorDict({key: tensors[key] for key in info["keys"]}, batch_size=[info["rows"]])


def _load_non_tensor(store: Store, manifest: dict[str, Any]) -> dict[str, np.ndarray]:
    out = {}
    for entry in manifest["non_tensor"]:
        key, name = entry["key"], entry["file"]
        raw = _read_checked(store, name, manifest)
        try:
            if name.endswith(".json"):
                out[key] = codec.decode_object_array(raw)
            else:
                out[key] = codec.decode_numeric_array(raw)
        except (ValueError, KeyError, TypeError) as err:
            raise ArtifactError(
                f"{store.where(name)}: cannot decode non_tensor_batch[{key!r}] ({err})"
            ) from None
    return out


def _load_meta(store: Store, manifest: dict[str, Any]) -> dict[str, Any]:
    name = manifest["meta_file"]
    raw = _read_checked(store, name, manifest)
    try:
        return codec.decode_meta_info(raw)
    except (ValueError, KeyError, TypeError) as err:
        raise ArtifactError(f"{store.where(name)}: cannot decode meta_info ({err})") from None


def load_artifact(path: str | os.PathLike, *, verify: Verify = "full") -> Any:
    """Read the artifact at ``path`` back into a DataProto, verifying it first.

    Args:
        verify: ``"full"`` hashes every file before use; ``"lazy"`` checks sizes, the manifest, the
            small files' hashes and the tensor header, and memory-maps the tensors unhashed
            (module docstring). Remote (non-local) stores always hash, since bytes are read anyway.

    Raises:
        ArtifactError: naming the file that is missing, truncated, altered or of another version.
    """
    if verify not in ("full", "lazy"):
        raise ValueError(f"verify={verify!r}; expected 'full' or 'lazy'")
    from dataproto.protocol import DataProto  # late: protocol's save/load delegate to this module

    store = Store(os.fspath(path))
    manifest = _read_manifest(store)
    _check_file_table(store, manifest)
    batch = _load_tensors(store, manifest, verify)
    non_tensor = _load_non_tensor(store, manifest)
    meta_info = _load_meta(store, manifest)
    return DataProto(batch=batch, non_tensor_batch=non_tensor, meta_info=meta_info)


def verify_artifact(path: str | os.PathLike) -> None:
    """Hash every file of the artifact at ``path`` and check the fingerprint and tensor header.

    Raises:
        ArtifactError: naming the first file found missing, truncated or altered.
    """
    store = Store(os.fspath(path))
    manifest = _read_manifest(store)
    _check_file_table(store, manifest)
    for name in manifest["files"]:
        if name != (manifest["batch"] or {}).get("file"):
            _check_digest(store, name, store.hash_file(name, manifest["digest"]), manifest)
    _load_tensors(store, manifest, "full")
