"""A checkpoint step's manifest: every file's role, path, size and BLAKE3 digest, checked on load.

``root/global_step_<N>/checkpoint_manifest.json`` (written by :func:`write_step_manifest`)::

    {"format": "ppoflow-checkpoint", "format_version": 1, "step": N, "digest": "blake3",
     "files": [{"role": "actor", "path": "actor/state/mp_rank_00_model_states.pt",
                "bytes": 123, "blake3": "<64 hex>"}, …]}

``path`` is relative to ``global_step_<N>`` and starts with its ``role`` directory (``actor``,
``critic``, ``data``); the files are sorted by path. The digest is the artifacts' file digest
(``dataproto.fingerprint.digest_file``, plain BLAKE3 of the bytes, what ``b3sum`` prints).
Names starting with ``.`` are not part of a checkpoint (``.actor.partial``, ``.tmp-*``: leftovers
of an interrupted write) and are neither listed nor checked.

The manifest is written after every role's files (and ``data/state.json``), by temp file,
fsync and rename, and before the tracker ``latest_checkpointed_iteration.txt``: a step without
a manifest was not saved completely (or predates manifests) and is never loaded.

:func:`verify_checkpoint` checks a step before anything reads it, in this order; the first
problem raises :class:`CheckpointIntegrityError`, one line naming the file and what was expected:

1. the manifest is present and readable, and records the step of its directory (a step
   directory renamed, or a manifest copied from another step, is refused);
2. every entry is a plain relative path inside the step directory (no ``..``, no absolute path,
   no hidden part, nothing that resolves outside through a link), under its role's directory;
3. each role asked for is listed; its files are present with the recorded sizes, and its
   directory holds no file the manifest does not list (missing, truncated, added files);
4. the JSON files at the top of a role directory (``client_state.json``, ``state.json``) are
   hashed and parsed, and a ``global_step`` or ``role`` they record must be the manifest's
   (a role directory moved in from another step is refused even when the sizes agree);
5. ``verify="full"`` (the default) hashes every other file and compares it with the manifest.

``verify="fast"`` stops after step 4: sizes of every file, digests of the small JSON files. A
flipped byte inside a weight or optimizer file is then not found (DeepSpeed's load may fail on
it, or not). Whatever the mode, the files are then read by ``torch.load(weights_only=True)``
(stages/engines/safe_load.py), so a file that passes here still cannot run code.

A checkpoint written before manifests existed is refused like a step whose save was
interrupted; if its files are trusted as they are, ``python -m stages.engines.checkpoint_manifest
ROOT/global_step_N`` records them (:func:`write_step_manifest` over its role directories).
"""

from __future__ import annotations

import json
import os
import re
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, Literal

from dataproto.artifact_store import naming_failed_writes
from dataproto.fingerprint import digest_file

STEP_MANIFEST = "checkpoint_manifest.json"
FORMAT_NAME = "ppoflow-checkpoint"
FORMAT_VERSION = 1
DIGEST = "blake3"
STEP_DIR = re.compile(r"global_step_(\d+)")
_HEX = re.compile(r"[0-9a-f]{64}")

CheckpointVerify = Literal["full", "fast"]
VERIFY_MODES: tuple[CheckpointVerify, ...] = ("full", "fast")


class CheckpointIntegrityError(ValueError):
    """A checkpoint that cannot be trusted: damaged, incomplete, moved or crafted; the message is
    one line naming the file and what was expected."""


@dataclass(frozen=True)
class VerifiedCheckpoint:
    """A step that :func:`verify_checkpoint` passed: which roles, how, and what it covered."""

    root: Path
    step: int
    roles: tuple[str, ...]
    verify: CheckpointVerify
    files: int  # files checked
    nbytes: int  # their bytes

    @property
    def directory(self) -> Path:
        return step_directory(self.root, self.step)


def step_directory(root: str | os.PathLike, step: int) -> Path:
    """``root/global_step_{step}``."""
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError(f"step must be an int ≥ 0, got {step!r}")
    return Path(root) / f"global_step_{step}"


def fsync_dir(path: Path) -> None:
    """fsync a directory, so a rename in it survives a crash."""
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


# --- writing ------------------------------------------------------------------------------------


def role_files(step_dir: Path, role: str) -> list[str]:
    """The checkpoint files of ``role`` (paths relative to ``step_dir``, sorted), hidden names
    skipped.

    Raises:
        CheckpointIntegrityError: a symbolic link or other non-regular file (a checkpoint holds
            plain files only).
    """
    found = []
    for here, dirs, names in os.walk(step_dir / role):
        links = [name for name in dirs if Path(here, name).is_symlink()]  # os.walk won't enter
        dirs[:] = [name for name in dirs if not name.startswith(".") and name not in links]
        for name in [*links, *names]:
            path = Path(here, name)
            if name.startswith("."):
                continue
            if path.is_symlink() or not path.is_file():
                raise CheckpointIntegrityError(
                    f"checkpoint {path}: not a plain file (a link or device); a checkpoint "
                    "holds plain files and directories only"
                )
            found.append(path.relative_to(step_dir).as_posix())
    return sorted(found)


def write_step_manifest(root: str | os.PathLike, step: int, roles: list[str]) -> Path:
    """Hash every file of ``roles`` under ``root/global_step_<step>`` and write the manifest
    (module docstring) atomically; returns its path."""
    step_dir = step_directory(root, step)
    entries = []
    for role in roles:
        for relative in role_files(step_dir, role):
            digest, size = digest_file(os.fspath(step_dir / relative), DIGEST)
            entries.append({"role": role, "path": relative, "bytes": size, DIGEST: digest})
    manifest = {
        "format": FORMAT_NAME,
        "format_version": FORMAT_VERSION,
        "step": step,
        "digest": DIGEST,
        "files": sorted(entries, key=lambda entry: entry["path"]),
    }
    handle, temp = tempfile.mkstemp(dir=step_dir, prefix=".tmp-")
    try:  # a full disk leaves no temp file behind and names the file it could not write
        with naming_failed_writes(temp), os.fdopen(handle, "w", encoding="utf-8") as out:
            json.dump(manifest, out, indent=1)
            out.flush()
            os.fsync(out.fileno())
        os.replace(temp, step_dir / STEP_MANIFEST)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise
    fsync_dir(step_dir)
    return step_dir / STEP_MANIFEST


def remove_step_manifest(root: str | os.PathLike, step: int) -> None:
    """Delete a step's manifest before its files are written again (an interrupted re-save then
    reads as incomplete, never as the old manifest over new files)."""
    (step_directory(root, step) / STEP_MANIFEST).unlink(missing_ok=True)


# --- verifying ----------------------------------------------------------------------------------


def verify_checkpoint(
    root: str | os.PathLike,
    step: int,
    roles: tuple[str, ...] | list[str] | None = None,
    verify: CheckpointVerify = "full",
) -> VerifiedCheckpoint:
    """Check step ``step`` under ``root`` against its manifest (module docstring) for ``roles``
    (None: every role the manifest lists).

    Raises:
        CheckpointIntegrityError: the first problem, naming the file and what was expected.
        ValueError: ``verify`` is not a mode of :data:`VERIFY_MODES`.
    """
    if verify not in VERIFY_MODES:
        raise ValueError(
            f"checkpoint verify mode {verify!r} is unknown; choose one of {VERIFY_MODES}"
        )
    step_dir = step_directory(root, step)
    manifest = read_step_manifest(step_dir, step)
    by_role = _entries_by_role(step_dir, manifest)
    wanted = tuple(by_role) if roles is None else tuple(roles)
    checked = []
    for role in wanted:
        entries = by_role.get(role)
        if not entries:
            raise CheckpointIntegrityError(
                f"checkpoint {step_dir / role}: {STEP_MANIFEST} lists no {role} files (the "
                f"checkpoint of step {step} was saved without a {role})"
            )
        _check_listing(step_dir, role, entries)
        checked += entries
    records = [entry for entry in checked if _is_record(entry)]
    for entry in records:
        _check_record(step_dir, entry, step)
    if verify == "full":
        for entry in checked:
            if not _is_record(entry):
                _check_digest(step_dir, entry)
    return VerifiedCheckpoint(
        Path(root), step, wanted, verify, len(checked), sum(e["bytes"] for e in checked)
    )


def read_step_manifest(step_dir: Path, step: int) -> dict[str, Any]:
    """The manifest of ``step_dir``, its format and step checked (module docstring, 1)."""
    path = step_dir / STEP_MANIFEST
    if not step_dir.is_dir():
        raise CheckpointIntegrityError(f"checkpoint {step_dir}: no such directory")
    if not path.is_file():
        raise CheckpointIntegrityError(
            f"checkpoint {step_dir}: no {STEP_MANIFEST}, so its files cannot be checked (its "
            "save was interrupted before the manifest, or it was written before ppoflow recorded "
            "checkpoint digests); resume from another checkpoint, or if you trust its files as "
            f"they are, record them with `python -m stages.engines.checkpoint_manifest {step_dir}`"
        )
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as err:
        raise CheckpointIntegrityError(f"checkpoint {path}: unreadable manifest ({err})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT_NAME:
        got = manifest.get("format") if isinstance(manifest, dict) else type(manifest).__name__
        raise CheckpointIntegrityError(
            f"checkpoint {path}: format {got!r}, expected {FORMAT_NAME!r}"
        )
    if manifest.get("format_version") != FORMAT_VERSION or manifest.get("digest") != DIGEST:
        raise CheckpointIntegrityError(
            f"checkpoint {path}: format version {manifest.get('format_version')!r} with digest "
            f"{manifest.get('digest')!r}; this ppoflow reads version {FORMAT_VERSION} with {DIGEST!r}"
        )
    if manifest.get("step") != step or not isinstance(manifest.get("files"), list):
        raise CheckpointIntegrityError(
            f"checkpoint {path}: records step {manifest.get('step')!r}, but it is the manifest of "
            f"{step_dir.name} (a step directory renamed, or a manifest copied from another step)"
        )
    return manifest


def _entries_by_role(step_dir: Path, manifest: dict[str, Any]) -> dict[str, list[dict]]:
    """The manifest's entries grouped by role, each entry's shape and path checked (2)."""
    by_role: dict[str, list[dict]] = {}
    where = step_dir / STEP_MANIFEST
    for entry in manifest["files"]:
        if not isinstance(entry, dict) or set(entry) != {"role", "path", "bytes", DIGEST}:
            raise CheckpointIntegrityError(
                f"checkpoint {where}: file entry {entry!r}; expected {{'role': str, 'path': str, "
                f"'bytes': int, {DIGEST!r}: 64 hex digits}}"
            )
        role, path, size = entry["role"], entry["path"], entry["bytes"]
        parts = PurePosixPath(path).parts if isinstance(path, str) else ()
        if (
            len(parts) < 2
            or PurePosixPath(path).is_absolute()
            or "\\" in path
            or any(part in ("", ".", "..") or part.startswith(".") for part in parts)
            or not (step_dir / path).resolve().is_relative_to(step_dir.resolve())
        ):
            raise CheckpointIntegrityError(
                f"checkpoint {where}: path {path!r} is not a plain relative path inside "
                f"{step_dir} (a manifest naming files outside the checkpoint is refused)"
            )
        if role != parts[0]:
            raise CheckpointIntegrityError(
                f"checkpoint {where}: {path!r} is recorded as role {role!r}; it lies in the "
                f"{parts[0]!r} directory"
            )
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise CheckpointIntegrityError(f"checkpoint {where}: {path!r} has size {size!r}")
        if not isinstance(entry[DIGEST], str) or not _HEX.fullmatch(entry[DIGEST]):
            raise CheckpointIntegrityError(
                f"checkpoint {where}: {path!r} has digest {entry[DIGEST]!r}; expected 64 hex digits"
            )
        by_role.setdefault(role, []).append(entry)
    return by_role


def _check_listing(step_dir: Path, role: str, entries: list[dict]) -> None:
    """Every listed file of ``role`` present with its size, and nothing else there (3)."""
    for entry in entries:
        path = step_dir / entry["path"]
        if not path.is_file():
            raise CheckpointIntegrityError(
                f"checkpoint {path}: missing (listed in {STEP_MANIFEST}, {entry['bytes']} bytes)"
            )
        size = path.stat().st_size
        if size != entry["bytes"]:
            raise CheckpointIntegrityError(
                f"checkpoint {path}: {size} bytes, {STEP_MANIFEST} says {entry['bytes']} "
                "(truncated or altered)"
            )
    listed = {entry["path"] for entry in entries}
    for relative in role_files(step_dir, role):
        if relative not in listed:
            raise CheckpointIntegrityError(
                f"checkpoint {step_dir / relative}: not listed in {STEP_MANIFEST} (a file added "
                "after the save); remove it or resume from another checkpoint"
            )


def _is_record(entry: dict) -> bool:
    """A JSON file at the top of its role directory: read on every check (4)."""
    parts = PurePosixPath(entry["path"]).parts
    return len(parts) == 2 and parts[1].endswith(".json")


def _check_record(step_dir: Path, entry: dict, step: int) -> None:
    """The step and role a record holds, then its digest (4)."""
    path = step_dir / entry["path"]
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as err:
        _check_digest(step_dir, entry)  # damaged since the save: say so
        raise CheckpointIntegrityError(f"checkpoint {path}: unreadable JSON ({err})") from None
    if isinstance(record, dict) and record.get("global_step", step) != step:
        raise CheckpointIntegrityError(
            f"checkpoint {path}: records step {record['global_step']!r}, but {STEP_MANIFEST} is "
            f"step {step}'s (a role directory moved in from another step)"
        )
    if isinstance(record, dict) and record.get("role", entry["role"]) != entry["role"]:
        raise CheckpointIntegrityError(
            f"checkpoint {path}: records role {record['role']!r}, but lies in the "
            f"{entry['role']!r} directory (role directories swapped)"
        )
    _check_digest(step_dir, entry)


def _check_digest(step_dir: Path, entry: dict) -> None:
    path = step_dir / entry["path"]
    found, size = digest_file(os.fspath(path), DIGEST)
    if size != entry["bytes"] or found != entry[DIGEST]:
        raise CheckpointIntegrityError(
            f"checkpoint {path}: BLAKE3 digest {found[:16]}… differs from the manifest's "
            f"{entry[DIGEST][:16]}… (file altered or damaged); restore it or resume from "
            "another checkpoint"
        )


def seal_legacy_checkpoint(step_dir: str | os.PathLike) -> Path:
    """Write the manifest of a ``…/global_step_<N>`` directory that has none, over every role
    directory in it (for a checkpoint written before manifests existed, whose files are trusted
    as they are). Returns the manifest's path.

    Raises:
        ValueError: not a ``global_step_<N>`` directory, or it has a manifest already.
    """
    step_dir = Path(step_dir)
    match = STEP_DIR.fullmatch(step_dir.name)
    if match is None or not step_dir.is_dir():
        raise ValueError(f"{step_dir} is not a …/global_step_<N> checkpoint directory")
    if (step_dir / STEP_MANIFEST).exists():
        raise ValueError(f"{step_dir} has a {STEP_MANIFEST} already; it is checked on load")
    roles = sorted(p.name for p in step_dir.iterdir() if p.is_dir() and not p.name.startswith("."))
    return write_step_manifest(step_dir.parent, int(match.group(1)), roles)


if __name__ == "__main__":  # python -m stages.engines.checkpoint_manifest ROOT/global_step_N …
    try:
        for argument in sys.argv[1:]:
            print(seal_legacy_checkpoint(argument))
    except (ValueError, CheckpointIntegrityError) as err:
        sys.exit(f"error: {err}")
