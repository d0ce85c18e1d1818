"""A child process that ends when the process that started it ends, however that one ends.

The parent keeps the write end of a pipe open for as long as it wants the child and never writes
to it; the child inherits the read end and blocks on reading it in a daemon thread. The kernel
closes the parent's end when the parent exits, normally or not (``kill -9``, the OOM killer), so
the child's read returns end-of-file and the child ends: SIGTERM to itself, so that a server
shuts down as it does when it is stopped, then, if it is still there after
:data:`GRACE_S`, ``os._exit``.

Why a pipe and not ``prctl(PR_SET_PDEATHSIG)``: the death signal fires when the *thread* that
started the child ends, not the process, and it is Linux only; a pipe follows the process and
works wherever pipes do. The parent's end is not inheritable, so a sibling started with
``subprocess`` (``close_fds``) does not hold it open; a child forked without ``exec`` (a data
loader worker) does, until it exits.

Prefect's temporary server (flows/process/prefect_server.py) is started this way: its boot line
calls :func:`watch` before it imports uvicorn and Prefect, so a parent that dies while the server
is still starting is noticed too. Standard library only: it runs first in the child.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import MutableMapping

#: the environment variable that hands the child the number of its end of the pipe
LIFELINE_FD = "PPOFLOW_LIFELINE_FD"
#: how long the child waits for its own graceful stop before it exits outright
GRACE_S = 5.0


class Lifeline:
    """The parent's side: :meth:`child_env` and :meth:`pass_fds` for ``subprocess.Popen``, then
    :meth:`started` once the child runs (closes the child's end here); :meth:`cut` lets the
    child go (idempotent)."""

    def __init__(self) -> None:
        self._read, self._write = os.pipe()  # both non-inheritable (PEP 446)

    @property
    def pass_fds(self) -> tuple[int, ...]:
        return () if self._read < 0 else (self._read,)

    def child_env(self, env: MutableMapping[str, str]) -> dict[str, str]:
        """``env`` plus the variable that names the child's end."""
        return {**env, LIFELINE_FD: str(self._read)}

    def started(self) -> None:
        """The child holds its own copy of the read end now: close this process's."""
        if self._read >= 0:
            os.close(self._read)
            self._read = -1

    def cut(self) -> None:
        """Close both ends held here: the child sees end-of-file and ends."""
        self.started()
        if self._write >= 0:
            os.close(self._write)
            self._write = -1


def watch(environ: MutableMapping[str, str] = os.environ) -> bool:
    """In the child: end this process when the pipe named by :data:`LIFELINE_FD` reaches
    end-of-file (module docstring). The variable is removed, so this process's own children do
    not watch the same pipe. Returns whether a lifeline was found."""
    value = environ.pop(LIFELINE_FD, None)
    if value is None or not value.isdigit():
        return False
    fd = int(value)
    try:
        os.set_inheritable(fd, False)
    except OSError:
        return False  # not open: nothing to watch
    threading.Thread(target=_wait_for_end, args=(fd,), name="ppoflow-lifeline", daemon=True).start()
    return True


def _wait_for_end(fd: int) -> None:
    while True:
        try:
            if not os.read(fd, 1):
                break  # end-of-file: the parent's end is closed
        except InterruptedError:
            continue
        except OSError:
            break
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(GRACE_S)
    os._exit(1)


__all__ = ["GRACE_S", "LIFELINE_FD", "Lifeline", "watch"]
