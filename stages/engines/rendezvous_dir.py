"""The temp directory a single rank's file-store rendezvous lives in, and the sweep of those a
killed process left behind.

A process that is its own world (``deepspeed_setup.ensure_process_group`` without a launcher)
meets through a ``torch.distributed.FileStore`` in a fresh ``ppoflow-pg-*`` directory under the
temp dir. The directory is removed when the process exits normally; a process killed outright
(SIGKILL, the OOM killer) cannot remove it. So each directory holds an ``owner`` file that its
process keeps open and exclusively ``flock``-ed until it ends — the kernel drops the lock however
the process ends — and the next single rank to start removes every such directory whose lock it
can take. A lock is per open file, so it is seen across processes and PID namespaces alike; a
directory younger than :data:`GRACE_S` is left alone (its creator may be between creating the
file and locking it), and one without an ``owner`` file (an older ppoflow's) is not touched.
It is the probe ``flows/runs/lock.py`` makes on a run directory's lock, kept here because
``stages`` does not import ``flows``.
"""

from __future__ import annotations

import atexit
import fcntl
import shutil
import tempfile
import time
from pathlib import Path
from typing import IO

#: the directories' name prefix under the temp dir
PREFIX = "ppoflow-pg-"
#: the file whose lock marks a directory's process as alive
OWNER = "owner"
#: seconds a new directory is left alone, whatever its lock (creation → lock takes microseconds)
GRACE_S = 60.0

_held: list[IO[str]] = []  # the owner files this process holds open (and locked) until it ends


def rendezvous_dir(temp_dir: Path | None = None) -> Path:
    """A fresh directory for this process's file store, locked as its own until the process
    ends and removed at a normal exit; first removes the abandoned ones (:func:`remove_abandoned`).
    ``temp_dir``: where (default: the temp dir, ``TMPDIR``)."""
    parent = Path(temp_dir or tempfile.gettempdir())
    remove_abandoned(parent)
    path = Path(tempfile.mkdtemp(prefix=PREFIX, dir=parent))
    owner = open(path / OWNER, "w")  # noqa: SIM115 - held open: the lock lasts as long as the process
    fcntl.flock(owner, fcntl.LOCK_EX)
    _held.append(owner)
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path


def remove_abandoned(parent: Path, now: float | None = None) -> list[Path]:
    """Remove the ``ppoflow-pg-*`` directories under ``parent`` that no live process holds: an
    ``owner`` file whose lock can be taken, in a directory older than :data:`GRACE_S`. Returns
    the directories removed; one that vanishes or cannot be read meanwhile is skipped."""
    now = time.time() if now is None else now
    removed = []
    for path in parent.glob(PREFIX + "*"):
        try:
            if now - path.stat().st_mtime < GRACE_S:
                continue
            with open(path / OWNER) as owner:
                fcntl.flock(owner, fcntl.LOCK_EX | fcntl.LOCK_NB)  # raises while a process holds it
                shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
        except OSError:  # held (BlockingIOError), no owner file, gone, not ours to read
            continue
    return removed
