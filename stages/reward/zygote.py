"""The scorer's fork server ("zygote"): one process that imports the scorer once, then forks
scorer workers from itself in about a millisecond each.

Why: a worker that times out is killed, and its replacement must not cost a Python start-up
plus the scorer's import (and, with ``multiprocessing``'s spawn / forkserver, a re-run of the
driver's ``__main__`` — the ``ppoflow`` entry script, which imports torch and Prefect: about 5 s
and 600 MB per worker). The zygote is started with ``sys.executable -c`` and a boot line that
imports only this module (standard library), :mod:`stages.reward.worker` and the scorer's own
module; workers are ``os.fork()`` children of it, so they hold exactly that and share its pages.

The scorer is imported in the zygote, never in the driver, under ``startup_timeout_s``: a file
whose import hangs is one :class:`ScorerStartupError` line naming the file and the config key
(``reward.startup_timeout_s``), and a file that fails to import, or lacks the function, is one
line with the scorer's own error.

Protocol on a ``SOCK_SEQPACKET`` socket pair (one JSON message per packet):

- driver → zygote, first: ``{"scorer": {name, module | path}, "sys_path": [...]}``; the zygote
  answers ``{"ready": pid, "wants_prompt": bool, "is_async": bool, "threads": n}`` or
  ``{"error": "<Type>: <message>"}`` and exits;
- ``{"op": "spawn", "release": [pid, ...]}`` with two file descriptors attached (the worker's
  end of its socket pair and its progress memfd): the zygote forks a worker on them, answers
  ``{"pid": pid}``, and reaps the released pids (killed workers) without waiting;
- ``{"op": "reap", "pid": pid}``: waits for that (dead) worker, answers ``{"code": exit code}``
  (negative: killed by that signal; null: not a child any more);
- end of file: every worker still alive is killed and reaped, then the zygote exits.

A worker stays a zombie until the driver releases or reaps it, so its pid cannot be reused
while the driver may still kill it. A scorer module that starts threads at import is reported
(``threads`` > 1): forking such a process can copy a lock held by another thread, and a worker
that deadlocks on it is then killed by the per-sample timeout like any hung call.
"""

from __future__ import annotations

import contextlib
import json
import mmap
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Iterable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any, NoReturn

from stages.reward.custom import ScorerRef, is_async_scorer, wants_prompt
from stages.reward.worker import ProgressSlot, worker_main

STARTUP_KEY = "reward.startup_timeout_s"
_PACKET = 1 << 20
_BOOT = (
    "import json, socket, sys\n"
    "sock = socket.socket(fileno=int(sys.argv[1]))\n"
    "init = json.loads(sock.recv(1 << 20))\n"
    "sys.path[:] = init['sys_path']\n"
    "from stages.reward.zygote import serve\n"
    "serve(sock, init)\n"
)


class ScorerStartupError(RuntimeError):
    """The scorer could not be made ready: its import hung, failed, or its process died."""


class ZygoteGone(RuntimeError):
    """The zygote process exited (or stopped answering) after start-up."""


# --- the zygote process ---------------------------------------------------------------------


def _send(sock: socket.socket, message: dict[str, Any]) -> None:
    sock.send(json.dumps(message).encode())


def serve(sock: socket.socket, init: dict[str, Any]) -> None:
    """The zygote's body (module docstring): import the scorer, then fork workers on request."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the driver's; it closes us
    try:
        fn = ScorerRef(**init["scorer"]).resolve()
    except BaseException as exc:  # the scorer's own error, one line, to the driver
        _send(sock, {"error": f"{type(exc).__name__}: {exc}"})
        return
    info = {"ready": os.getpid(), "wants_prompt": wants_prompt(fn), "is_async": is_async_scorer(fn)}
    _send(sock, info | {"threads": threading.active_count()})
    children: set[int] = set()
    released: set[int] = set()
    try:
        while True:
            data, fds, _, _ = socket.recv_fds(sock, _PACKET, 2)
            if not data:
                return
            request = json.loads(data)
            if request["op"] == "spawn":
                pid = _fork_worker(sock, fds, fn)
                children.add(pid)
                _send(sock, {"pid": pid})
                released.update(request["release"])
                released -= _reap(released, block=False)
                children -= set(request["release"])
            elif request["op"] == "reap":
                pid = request["pid"]
                children.discard(pid)
                _send(sock, {"code": _exit_code(pid)})
    finally:
        for pid in children:
            _kill(pid)
        _reap(children | released, block=True)


def _fork_worker(sock: socket.socket, fds: list[int], fn: Any) -> int:
    pid = os.fork()
    if pid == 0:
        _run_worker(sock, fds, fn)
    for fd in fds:
        os.close(fd)
    return pid


def _run_worker(sock: socket.socket, fds: list[int], fn: Any) -> NoReturn:
    """A forked worker: serve on the received socket and progress memfd, then exit."""
    code = 0
    try:
        sock.close()
        conn_fd, progress_fd = fds
        progress = ProgressSlot(mmap.mmap(progress_fd, ProgressSlot.SIZE))
        os.close(progress_fd)
        worker_main(Connection(conn_fd), fn, progress)
    except BaseException:
        traceback.print_exc()
        code = 1
    finally:
        os._exit(code)


def _kill(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def _exit_code(pid: int) -> int | None:
    try:
        _, status = os.waitpid(pid, 0)
    except ChildProcessError:
        return None
    return os.waitstatus_to_exitcode(status)


def _reap(pids: Iterable[int], *, block: bool) -> set[int]:
    """Reap those of ``pids`` that exited (all of them with ``block``); returns the reaped."""
    reaped = set()
    for pid in list(pids):
        try:
            done, _ = os.waitpid(pid, 0 if block else os.WNOHANG)
        except ChildProcessError:
            done = pid
        if done:
            reaped.add(pid)
    return reaped


# --- the driver's handle --------------------------------------------------------------------


@dataclass(frozen=True)
class ScorerInfo:
    """What the zygote found out about the scorer while importing it."""

    wants_prompt: bool
    is_async: bool
    threads: int


@dataclass
class SpawnedWorker:
    """A forked worker as the driver holds it: its socket, its progress slot and its pid."""

    conn: Connection
    progress: ProgressSlot
    pid: int


class Zygote:
    """Starts the zygote for ``scorer`` and waits, up to ``startup_timeout_s``, for its import.

    Raises:
        ScorerStartupError: the import did not finish in time (the process is killed), raised,
            or the process died; one line naming the scorer and, for a hang, the config key.
    """

    def __init__(self, scorer: ScorerRef, startup_timeout_s: float) -> None:
        self.scorer = scorer
        self.startup_timeout_s = startup_timeout_s
        self._sock, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        with theirs:
            self.process = subprocess.Popen(
                [sys.executable, "-c", _BOOT, str(theirs.fileno())],
                pass_fds=(theirs.fileno(),),
                stdin=subprocess.DEVNULL,
            )
        self._released: list[int] = []
        try:
            self.info = self._start()
        except BaseException:
            self.process.kill()  # a hung import never reads its socket: do not wait for it
            self.close()
            raise

    def _start(self) -> ScorerInfo:
        init = {"scorer": _ref_fields(self.scorer), "sys_path": list(sys.path)}
        _send(self._sock, init)
        try:
            reply = self._reply(self.startup_timeout_s)
        except TimeoutError:
            raise ScorerStartupError(
                f"reward scorer {self.scorer.label} did not finish importing within "
                f"{self.startup_timeout_s:g} s ({STARTUP_KEY}); its import hangs or is slower "
                f"than that: fix the file, or raise {STARTUP_KEY}"
            ) from None
        except ZygoteGone:
            code = self.process.wait(5.0)
            raise ScorerStartupError(
                f"reward scorer {self.scorer.label}: its process exited with code {code} while "
                "importing it (see its output above)"
            ) from None
        if "error" in reply:
            raise ScorerStartupError(
                f"reward scorer {self.scorer.label} could not be loaded: {reply['error']}"
            )
        return ScorerInfo(reply["wants_prompt"], reply["is_async"], reply["threads"])

    def _reply(self, timeout_s: float) -> dict[str, Any]:
        """The zygote's next message; ``TimeoutError`` after ``timeout_s``, ``ZygoteGone`` at EOF."""
        deadline = time.monotonic() + timeout_s
        while True:
            ready, _, _ = select.select([self._sock], [], [], max(deadline - time.monotonic(), 0))
            if ready:
                break
            if time.monotonic() >= deadline:
                raise TimeoutError(f"the reward zygote did not answer within {timeout_s:g} s")
        try:
            data = self._sock.recv(_PACKET)
        except OSError as exc:
            raise ZygoteGone(f"the reward zygote's socket failed: {exc}") from None
        if not data:
            raise ZygoteGone("the reward zygote exited")
        return json.loads(data)

    def spawn(self) -> SpawnedWorker:
        """Fork a worker (about a millisecond); also releases the pids given to :meth:`release`."""
        ours, theirs = socket.socketpair()
        memfd = os.memfd_create("ppoflow-reward-progress")
        try:
            os.ftruncate(memfd, ProgressSlot.SIZE)
            progress = ProgressSlot(mmap.mmap(memfd, ProgressSlot.SIZE))
            request = json.dumps({"op": "spawn", "release": self._released}).encode()
            try:
                socket.send_fds(self._sock, [request], [theirs.fileno(), memfd])
            except OSError as exc:
                raise ZygoteGone(f"the reward zygote cannot be reached: {exc}") from None
            self._released = []
            reply = self._reply_or_gone()
        finally:
            theirs.close()
            os.close(memfd)
        return SpawnedWorker(Connection(ours.detach()), progress, reply["pid"])

    def release(self, pid: int) -> None:
        """Let the zygote reap ``pid`` (a worker the driver killed) at the next spawn."""
        self._released.append(pid)

    def reap(self, pid: int) -> int | None:
        """Exit code of the dead worker ``pid`` (negative: the signal that killed it)."""
        try:
            _send(self._sock, {"op": "reap", "pid": pid})
        except OSError as exc:
            raise ZygoteGone(f"the reward zygote cannot be reached: {exc}") from None
        return self._reply_or_gone()["code"]

    def _reply_or_gone(self) -> dict[str, Any]:
        try:
            return self._reply(self.startup_timeout_s)
        except TimeoutError as exc:
            raise ZygoteGone(str(exc)) from None

    def close(self) -> None:
        """Close the socket (the zygote kills and reaps its workers, then exits); wait for it."""
        self._sock.close()
        try:
            self.process.wait(5.0)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def _ref_fields(scorer: ScorerRef) -> dict[str, Any]:
    return {"name": scorer.name, "module": scorer.module, "path": scorer.path}
