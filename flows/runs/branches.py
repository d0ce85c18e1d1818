"""A run's re-run branches, found without writing into the run.

A re-run branch (``ppoflow rerun``, flows/rerun.py) is a run directory whose ``rerun.json``
names its parent (``parent_run_dir``) and the step it re-ran. Its journal names the parent's
artifacts of that step (the stages it reused), so the parent's artifact retention
(flows/runs/retention.py) keeps that step. ``ppoflow rerun`` only reads the parent — a parent on
a read-only disk can be branched — so the parent holds no list of its branches. They are found
(:func:`find_branches`) from three places:

1. **beside the run**: every folder next to the run directory whose ``rerun.json`` names the run.
   The default branch directory (``<RUN>-rerun-step<K>-<stage>-<time>``) is there, so such a
   branch is found even on another machine;
2. **the branch index of this machine** (:func:`index_dir`: ``$PREFECT_HOME/ppoflow-branches``,
   beside the cache records of remote runs, flows/runs/store.py): for each branch it makes,
   ``ppoflow rerun`` writes ``<index>/<run key>/<branch key>.json`` (``{"run_dir", "parent_run_dir",
   "step"}``) for its parent and for every run that parent branched from (:func:`note_branch`;
   the key is a digest of the resolved path), so a branch put anywhere with ``--run-dir`` is
   found, and a branch of a branch protects the step in the runs further up too;
3. **notes in the run**: ``<run>/branches/<id>.json``, which ppoflow rerun wrote into the parent
   before it only read it; still read, so such runs keep what their notes protect.

A noted branch counts while its directory still holds a ``rerun.json`` (a deleted branch
protects nothing) naming the parent the note names (a directory reused for another run's branch
protects nothing either); a branch found beside the run counts when its ``rerun.json`` names the
run. Paths are compared resolved (``os.path.realpath``), so a run reached through a symbolic
link is the same run. An unreadable note (in the index or in the run) is a ``ValueError`` naming
it: what it protects is unknown, and retention pauses rather than guess.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from contextlib import suppress
from pathlib import Path
from typing import Any

import fsspec

RERUN_FILE = "rerun.json"  # a re-run branch's parent, step, stages and overrides (flows/rerun.py)
NOTES_DIR = "branches"  # <run>/branches/<id>.json: notes older ppoflow versions wrote into a run
INDEX_DIR = "ppoflow-branches"  # under $PREFECT_HOME: this machine's branch index
#: how far :func:`parent_chain` follows ``rerun.json`` files (a guard against a cycle)
MAX_CHAIN = 64


def same_run(a: str, b: str) -> bool:
    """Whether two run directory names are the same run: equal, or the same local directory
    once symbolic links are resolved.

    >>> same_run("/r/../r/run", "/r/run"), same_run("s3://b/x", "s3://b/x/")
    (True, True)
    """
    if a.rstrip("/") == b.rstrip("/"):
        return True
    if "://" in a or "://" in b:
        return False
    return os.path.realpath(a) == os.path.realpath(b)


def run_key(root: str) -> str:
    """The index folder name of a run: a digest of its resolved path (its URL when remote)."""
    name = root if "://" in root else os.path.realpath(root)
    return hashlib.sha256(name.encode()).hexdigest()[:16]


def index_dir() -> Path:
    """This machine's branch index (module docstring): ``$PREFECT_HOME/ppoflow-branches``
    (``~/.prefect/ppoflow-branches`` without ``PREFECT_HOME``)."""
    base = Path(os.environ.get("PREFECT_HOME") or Path.home() / ".prefect")
    return base / INDEX_DIR


def read_rerun_info(root: str) -> dict[str, Any] | None:
    """``<root>/rerun.json`` as a dict; None when there is none.

    Raises:
        ValueError: it is not valid JSON or not an object (named).
    """
    fs, path = fsspec.core.url_to_fs(root)
    target = f"{path.rstrip('/')}/{RERUN_FILE}"
    if not fs.isfile(target):
        return None
    try:
        data = json.loads(fs.cat_file(target))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(
            f"{root.rstrip('/')}/{RERUN_FILE}: the {RERUN_FILE} is not valid JSON ({err}): the "
            "file is truncated or damaged"
        ) from None
    if not isinstance(data, dict):
        raise ValueError(
            f"{root.rstrip('/')}/{RERUN_FILE} holds a {type(data).__name__}; expected an object "
            "as ppoflow rerun writes it"
        )
    return data


def parent_chain(root: str) -> list[str]:
    """The run directories ``root`` branched from, nearest first (from their ``rerun.json``).

    A directory whose ``rerun.json`` names no existing parent ends the chain (a branch copied
    away from its parent).

    Raises:
        ValueError: a ``rerun.json`` on the way is damaged (named).
    """
    chain: list[str] = []
    current = root
    while len(chain) < MAX_CHAIN:
        info = read_rerun_info(current)
        parent = str((info or {}).get("parent_run_dir") or "")
        if not parent or parent in chain or same_run(parent, root):
            break
        chain.append(parent)
        current = parent
    return chain


# --- the index ---------------------------------------------------------------------------------


def note_branch(branch_root: str, step: int, runs: list[str]) -> list[Path]:
    """Write the index note of ``branch_root`` (which re-ran step ``step``) for each run of
    ``runs`` (its parent, then the runs that parent branched from); returns the notes written.
    Each note is written atomically (temp file, then rename).

    Raises:
        OSError: the index cannot be written (the caller decides what that means).
    """
    written: list[Path] = []
    for run in runs:
        folder = index_dir() / run_key(run)
        folder.mkdir(parents=True, exist_ok=True)
        target = folder / f"{run_key(branch_root)}.json"
        data = {"run_dir": branch_root, "parent_run_dir": runs[0], "step": int(step)}
        handle, temp = tempfile.mkstemp(dir=folder, prefix=f".tmp-{target.name}-")
        try:
            with os.fdopen(handle, "w", encoding="utf-8") as out:
                json.dump(data, out)
            os.replace(temp, target)
        except BaseException:
            with suppress(FileNotFoundError):
                os.remove(temp)
            raise
        written.append(target)
    return written


def remove_notes(notes: list[Path]) -> None:
    """Remove index notes :func:`note_branch` wrote (a re-run that failed leaves none)."""
    for note in notes:
        with suppress(FileNotFoundError):
            note.unlink()


def _read_note(fs: Any, path: str) -> tuple[str, int, str | None]:
    """(the branch directory, the step, the branch's parent when the note names it) of one
    note, in the index or in a run."""
    try:
        data = json.loads(fs.cat_file(path))
        parent = data.get("parent_run_dir")
        return str(data["run_dir"]), int(data["step"]), None if parent is None else str(parent)
    except (ValueError, KeyError, TypeError, AttributeError) as err:
        raise ValueError(
            f'{path}: unreadable branch note ({err}); expected {{"run_dir": …, "step": K}}, as '
            "ppoflow rerun writes it"
        ) from None


def _notes(fs: Any, folder: str) -> list[tuple[str, int, str | None]]:
    if not fs.isdir(folder):
        return []
    return [
        _read_note(fs, entry)
        for entry in sorted(fs.ls(folder, detail=False))
        if entry.endswith(".json") and not entry.rsplit("/", 1)[-1].startswith(".")
    ]


def _still_the_branch(branch: str, parent: str | None) -> bool:
    """Whether the noted ``branch`` still is that branch: it holds a ``rerun.json`` which,
    when the note names the branch's ``parent`` and the file is readable, names that parent
    too (else the directory was deleted, or now holds another run's branch)."""
    try:
        info = read_rerun_info(branch)
    except ValueError:
        return True  # a branch with a damaged rerun.json: keep what the note protects
    except OSError:
        return False
    if info is None:
        return False
    named = info.get("parent_run_dir")
    return parent is None or not named or same_run(str(named), parent)


def _beside(root: str) -> dict[str, int]:
    """Branches in the folder that holds ``root`` whose ``rerun.json`` names ``root``."""
    if "://" in root:
        return {}
    here = Path(os.path.abspath(root))
    found: dict[str, int] = {}
    try:
        siblings = sorted(here.parent.iterdir())
    except OSError:
        return {}
    for sibling in siblings:
        if sibling.name.startswith(".") or not (sibling / RERUN_FILE).is_file():
            continue
        try:
            info = read_rerun_info(str(sibling)) or {}
            parent, step = info.get("parent_run_dir"), int(info["step"])
        except (ValueError, KeyError, TypeError, OSError):
            continue  # not attributable to any run: another run's damaged branch
        if parent and same_run(str(parent), root) and not same_run(str(sibling), root):
            found[str(sibling)] = step
    return found


def find_branches(root: str) -> dict[str, int]:
    """Branch run directory → the step it re-ran, for every branch of the run at ``root``
    (module docstring): beside it, in this machine's index, in the run's own notes. A branch
    found twice (under two names of one directory) is listed once.

    Raises:
        ValueError: a note is unreadable (named), so what it protects is unknown.
    """
    found = _beside(root)
    fs, path = fsspec.core.url_to_fs(root)
    noted = [
        *_notes(fsspec.filesystem("file"), str(index_dir() / run_key(root))),
        *_notes(fs, f"{path.rstrip('/')}/{NOTES_DIR}"),
    ]
    for branch, step, parent in noted:
        if any(same_run(branch, known) for known in found):
            continue
        if _still_the_branch(branch, parent):
            found[branch] = step
    return found


__all__ = [
    "find_branches",
    "index_dir",
    "note_branch",
    "parent_chain",
    "read_rerun_info",
    "remove_notes",
    "run_key",
    "same_run",
]
