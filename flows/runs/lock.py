"""One training writes a run directory at a time: an exclusive lock on ``<run_dir>/.lock``.

:class:`RunLock` takes ``fcntl.flock(LOCK_EX | LOCK_NB)`` on the file and writes who holds it
(pid, host, start time, command) into it. The operating system drops the lock when the holder
exits, however it exits (kill -9 included), so a lock never outlives its training and a resume
after a crash never has to clear one. A second training into the same directory fails at once,
before it writes anything there, with one line naming the holder::

    run directory /runs/r is in use by another training (pid 4242 on node-1, since
    2026-12-01 17:02:11 UTC: ppoflow train …); wait for it to end or pass another --run-dir

A run directory given as a URL (an fsspec store) has no lock: :func:`lock_run_dir` returns None
and the caller says so. :func:`lock_held` tells ``ppoflow runs`` whether a run is being trained
now, so a killed run reads as failed at once.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

LOCK_FILE = ".lock"


class RunDirInUse(RuntimeError):
    """Another process holds the run directory's lock."""


class RunLock:
    """The held lock of one local run directory; :meth:`release` is idempotent."""

    def __init__(self, run_dir: str | os.PathLike) -> None:
        self.path = Path(run_dir) / LOCK_FILE
        self.path.parent.mkdir(parents=True, exist_ok=True)
        handle = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        if not _take(handle):
            holder = _holder(handle)
            os.close(handle)
            raise RunDirInUse(
                f"run directory {self.path.parent} is in use by another training ({holder}); "
                "wait for it to end or pass another --run-dir"
            ) from None
        self._handle: int | None = handle
        os.ftruncate(handle, 0)
        os.pwrite(handle, json.dumps(_me()).encode(), 0)

    @property
    def held(self) -> bool:
        return self._handle is not None

    def release(self) -> None:
        if self._handle is None:
            return
        handle, self._handle = self._handle, None
        os.ftruncate(handle, 0)
        fcntl.flock(handle, fcntl.LOCK_UN)
        os.close(handle)


def _take(handle: int, patience_s: float = 0.5) -> bool:
    """Take the exclusive lock; while the file names no holder (a :func:`lock_held` probe,
    or a holder between its flock and its write) keep trying for ``patience_s``."""
    deadline = time.monotonic() + patience_s
    while True:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if os.fstat(handle).st_size > 0 or time.monotonic() > deadline:
                return False
            time.sleep(0.01)


def lock_held(run_dir: str | os.PathLike) -> bool | None:
    """Whether a training holds the run directory's lock now; None when the directory has no
    lock file (a run from before locks, or never started). The probe takes a shared lock for a
    moment, which a starting training waits out (:class:`RunLock`)."""
    path = Path(run_dir) / LOCK_FILE
    try:
        handle = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        fcntl.flock(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(handle)  # closing drops the probe's lock
    return False


def lock_run_dir(root: str, is_local: bool) -> RunLock | None:
    """The lock of a local run directory (:class:`RunDirInUse` when held elsewhere); None for
    a URL, which cannot be locked."""
    return RunLock(root) if is_local else None


def _me() -> dict[str, object]:
    return {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "since": datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S UTC"),
        "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]])[:200],
    }


def _holder(handle: int) -> str:
    """Who holds the lock, from what the holder wrote (``unknown holder`` if unreadable)."""
    try:
        data = json.loads(os.pread(handle, 4096, 0) or b"{}")
        return f"pid {data['pid']} on {data['host']}, since {data['since']}: {data['command']}"
    except (OSError, ValueError, KeyError, TypeError):
        return "unknown holder"


__all__ = ["LOCK_FILE", "RunDirInUse", "RunLock", "lock_held", "lock_run_dir"]
