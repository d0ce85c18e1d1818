"""The command line's one line for a write that found the disk full, and how to go on.

Every writer of a run (artifacts ``dataproto/artifact_store.py``, journals and JSON records
``flows/runs/store.py``, engine checkpoints ``stages/engines/checkpoint.py``) writes to a temporary
name, removes it when a write fails, and raises the ``OSError`` naming the file it was writing.
:func:`explain_disk_full` (an explainer of ``flows/cli/error_lines.py``) finds that error in the
exception or its chain and says, in one line, which file, how much room is left where, and what
to run once there is room::

    no space left on device writing /runs/r/step_3/.rollout.tmp-…/tensors.safetensors (12 MiB
    free on /dev/sda1, mounted at /runs); free space, then continue with `ppoflow resume /runs/r`

The run directory comes from the path (an artifact or journal lies in it) or, for a checkpoint
under ``trainer.default_local_dir``, from the newest checkpoint's ``data/state.json``. A run
without a checkpoint yet cannot be resumed; the line then says to start the training again.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
from pathlib import Path

#: what each errno of DISK_FULL_ERRNOS means, and what makes room
_WHAT = {
    errno.ENOSPC: ("no space left on device", "free space"),
    errno.EDQUOT: ("disk quota exceeded", "free space or raise the quota"),
    errno.EFBIG: (
        "file too large (over the file-size limit `ulimit -f`, or the file system's largest file)",
        "raise the limit or free space",
    ),
}
_RUN_FILES = ("config.json", "run_info.json")  # flows/runs/store.py CONFIG_FILE, RUN_INFO_FILE


def explain_disk_full(err: BaseException) -> str | None:
    """One line for a write that found no room (module docstring); None for other errors.

    >>> explain_disk_full(ValueError("x")) is None
    True
    >>> line = explain_disk_full(OSError(errno.ENOSPC, "No space left on device", "/"))
    >>> line.startswith("no space left on device writing / (")
    True
    """
    failed = disk_full_error(err)
    if failed is None:
        return None
    what, remedy = _WHAT[failed.errno]
    path = None if failed.filename is None else os.fspath(failed.filename)
    where = f" writing {path}" if path else ""
    room = f" ({free_space(path)})" if path else ""
    return f"{what}{where}{room}; {remedy}, then {how_to_go_on(path)}"


def disk_full_error(err: BaseException) -> OSError | None:
    """The first ``OSError`` with an errno of ``DISK_FULL_ERRNOS`` in ``err``, its causes and
    contexts (a failure inside a flow can arrive wrapped), or None."""
    from dataproto.artifact_store import DISK_FULL_ERRNOS  # late: dataproto brings torch

    seen: set[int] = set()
    pending: list[BaseException | None] = [err]
    while pending:
        current = pending.pop(0)
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, OSError) and current.errno in DISK_FULL_ERRNOS:
            return current
        pending += [current.__cause__, current.__context__]
        pending += list(getattr(current, "exceptions", ()))  # an ExceptionGroup's members
    return None


def free_space(path: str) -> str:
    """``12 MiB free on /dev/sda1, mounted at /data``: the room left on the file system that
    holds ``path`` (its nearest existing folder)."""
    existing = Path(path)
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    try:
        free = shutil.disk_usage(existing).free
    except OSError:
        return "free space unknown"
    device, mount = mount_of(existing)
    on = f" on {device}, mounted at {mount}" if mount else ""
    return f"{human_bytes(free)} free{on}"


def mount_of(path: Path) -> tuple[str | None, str | None]:
    """(device, mount point) of the mount holding ``path``, from ``/proc/self/mounts`` (the
    longest mount point above it); (None, None) where that file is unreadable."""
    try:
        lines = Path("/proc/self/mounts").read_text().splitlines()
    except OSError:
        return None, None
    target = os.path.realpath(path)
    best: tuple[str | None, str | None] = (None, None)
    for line in lines:
        fields = line.split()
        if len(fields) < 2:
            continue
        device, mount = (_unescape(field) for field in fields[:2])
        inside = target == mount or target.startswith(mount.rstrip("/") + "/")
        if inside and len(mount) >= len(best[1] or ""):
            best = (device, mount)
    return best


def _unescape(field: str) -> str:
    r"""``/proc/self/mounts`` writes space, tab, newline and ``\`` as octal escapes."""
    for code, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        field = field.replace(code, char)
    return field


def human_bytes(count: int) -> str:
    """``count`` bytes in binary units, three significant figures at most.

    >>> human_bytes(0), human_bytes(1536), human_bytes(12 * 2**20), human_bytes(5 * 2**40)
    ('0 B', '1.5 KiB', '12 MiB', '5 TiB')
    """
    size, unit = float(count), "B"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            break
        size /= 1024
    return f"{size:.3g} {unit}"


def how_to_go_on(path: str | None) -> str:
    """``continue with `ppoflow resume RUN``` when the run ``path`` belongs to has a checkpoint
    to resume from, else what to do instead."""
    run, resumable = run_of(path) if path else (None, None)
    if resumable is False:
        return "train again: the run has no checkpoint to resume from yet"
    if run is None:
        return "continue with `ppoflow resume RUN_DIR` (the run directory ppoflow train printed)"
    return f"continue with `ppoflow resume {run}`"


def run_of(path: str) -> tuple[str | None, bool | None]:
    """(the run directory ``path`` belongs to, whether it has a checkpoint), None where unknown.

    The run is a folder above ``path`` holding the run's files; for a checkpoint file
    (``…/global_step_N/…``, or the tracker beside those) it is the run that the newest checkpoint
    there names."""
    from stages.engines.checkpoint import LATEST_FILE  # late: torch, loaded by any training

    for folder in Path(path).parents:
        if all((folder / name).is_file() for name in _RUN_FILES):
            return str(folder), has_checkpoint(folder)
        if folder.name.startswith("global_step_"):
            return _checkpoint_writer(folder.parent)
        if (folder / LATEST_FILE).is_file():
            return _checkpoint_writer(folder)
    return None, None


def _checkpoint_writer(root: Path) -> tuple[str | None, bool | None]:
    """(the ``run_dir`` the newest checkpoint under ``root`` records, whether there is one)."""
    from flows.runs.checkpoints import DATA_ROLE, STATE_FILE, checkpoint_run
    from stages.engines.checkpoint import read_latest_step

    try:
        step = read_latest_step(root)
        if step is None:
            return None, False
        state = json.loads((root / f"global_step_{step}" / DATA_ROLE / STATE_FILE).read_text())
        return checkpoint_run(state)["run_dir"], True
    except (OSError, ValueError, TypeError, AttributeError):
        return None, None


def has_checkpoint(run: Path) -> bool | None:
    """Whether the run's ``trainer.default_local_dir`` (from its ``config.json``, relative to
    the working directory it started in) has a latest-checkpoint tracker; None if unknown."""
    from stages.engines.checkpoint import read_latest_step

    try:
        config = json.loads((run / "config.json").read_text())
        info = json.loads((run / "run_info.json").read_text())
        root = Path(info.get("working_dir") or ".") / config["trainer"]["default_local_dir"]
        return read_latest_step(root) is not None
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


__all__ = ["disk_full_error", "explain_disk_full", "free_space", "human_bytes"]
