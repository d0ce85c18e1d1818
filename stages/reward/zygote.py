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

- driver → zygote, first: ``{"scorer": {name, module | path}, "sys_path": [...], "parent": pid,
  "limits": {"reserved_names": [...], "memory_mb": n | null, "no_network": bool,
  "calls_per_worker": n | null}, "output_fds": [out, err] | null}``; the zygote answers
  ``{"ready": pid, "wants_prompt": bool, "is_async": bool, "threads": n, "network": mode}``
  (mode: null, or how ``no_network`` is enforced: ``"namespace"`` / ``"audit-hook"``) or
  ``{"error": "<Type>: <message>"}`` and exits;
- ``{"op": "spawn", "release": [pid, ...]}`` with two file descriptors attached (the worker's
  end of its socket pair and its progress memfd): the zygote forks a worker on them, answers
  ``{"pid": pid}``, and reaps the released pids (killed workers) without waiting;
- ``{"op": "reap", "pid": pid}``: waits for that (dead) worker, answers ``{"code": exit code}``
  (negative: killed by that signal; null: not a child any more);
- end of file: every worker still alive is killed and reaped, then the zygote exits.

In each forked worker, before it serves (:class:`_WorkerSetup`): the parent-death signal is set
to SIGKILL (``prctl(PR_SET_PDEATHSIG)``), so a zygote killed from outside takes its workers with
it, even those inside a hung call; ``output_fds`` become its stdout and stderr (pipes the driver
reads under ``reward.worker_output_bytes``); ``RLIMIT_AS`` is set to its address space at the
fork plus ``memory_mb`` MiB (``reward.worker_memory_mb``; processes the scorer starts inherit
it); with ``no_network`` (the tool sandbox, ``stages.agent.sandbox``; reward scorers keep the
network) it has no network: :func:`unshare_network` moves the zygote (once, at start-up, so
every worker inherits it; a zygote whose import left threads running moves each worker instead)
into a user and network namespace, which holds only a loopback device that is down (a
connection fails with "Network is unreachable"), or, where the kernel refuses that (EPERM in some containers; the zygote probes it
once at start-up), :func:`refuse_network` installs an audit hook that raises ``PermissionError``
on every socket connect, bind, send-to and name lookup. The hook binds Python code only (a C
extension's own sockets pass), so the start-up reply says which of the two is in force.

No zygote outlives its driver. It leaves at its socket's end of file, and, should a process the
driver forked keep that socket open, when its parent is no longer the driver (it checks every
``PARENT_POLL_S``; a thread does the same while the scorer's import runs, so a hung import does
not keep it either). The zygote does not use the parent-death signal itself: that signal fires
when the *thread* that forked the process exits, and the driver starts (and restarts) the zygote
from whichever thread calls the pool — a Prefect task thread that ends would kill it. The
workers are forked by the zygote's main thread, which lives as long as the zygote.

A zygote stopped from outside (SIGSTOP) answers nothing until it is continued. The driver sees
it (state ``T`` in ``/proc``) before a spawn and every :data:`STOP_POLL_S` while it waits for an
answer, and raises :class:`ZygoteStopped` (a :class:`ZygoteGone`: the pool replaces it) instead
of waiting ``startup_timeout_s`` for it; :meth:`Zygote.close` kills a stopped zygote at once.

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
import resource
import select
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any, NoReturn

from stages.reward.custom import ScorerRef, is_async_scorer, wants_prompt
from stages.reward.worker import ProgressSlot, WorkerLimits, worker_main

STARTUP_KEY = "reward.startup_timeout_s"
PARENT_POLL_S = 0.5  # the zygote checks this often that its driver is still its parent
STOP_POLL_S = 0.5  # the driver, waiting for the zygote's answer, checks this often it is stopped
_STOPPED = "the reward zygote (pid {pid}) is stopped (SIGSTOP) and answers nothing"
_PR_SET_PDEATHSIG = 1  # prctl option (linux/prctl.h)
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


class ScorerProcessError(RuntimeError):
    """The scorer's process (the zygote) died during a call after one restart, or could not be
    restarted; one line naming it and the config key."""


class ZygoteGone(RuntimeError):
    """The zygote process exited (or stopped answering) after start-up."""


class ZygoteStopped(ZygoteGone):
    """The zygote process is stopped (SIGSTOP, from outside) while the driver needs it: it
    answers nothing until continued, so the driver counts it as gone (and kills it)."""


# --- the zygote process ---------------------------------------------------------------------


def _send(sock: socket.socket, message: dict[str, Any]) -> None:
    sock.send(json.dumps(message).encode())


def serve(sock: socket.socket, init: dict[str, Any]) -> None:
    """The zygote's body (module docstring): import the scorer, then fork workers on request."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the driver's; it closes us
    parent = init["parent"]
    try:
        with _parent_watch(parent):  # a driver that dies while the import hangs ends us too
            fn = ScorerRef(**init["scorer"]).resolve()
        setup = _WorkerSetup(init)
    except BaseException as exc:  # the scorer's own error, one line, to the driver
        _send(sock, {"error": f"{type(exc).__name__}: {exc}"})
        return
    info = {"ready": os.getpid(), "wants_prompt": wants_prompt(fn), "is_async": is_async_scorer(fn)}
    _send(sock, info | {"threads": threading.active_count(), "network": setup.network_mode})
    children: set[int] = set()
    released: set[int] = set()
    try:
        while True:
            if not _readable(sock, PARENT_POLL_S):
                if os.getppid() != parent:  # the driver died and a process it forked holds
                    return  # our socket open: no end of file will come
                continue
            data, fds, _, _ = socket.recv_fds(sock, _PACKET, 2)
            if not data:
                return
            request = json.loads(data)
            if request["op"] == "spawn":
                pid = _fork_worker(sock, fds, fn, setup)
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


@contextlib.contextmanager
def _parent_watch(parent: int) -> Iterator[None]:
    """While the body runs, a thread exits this process if ``parent`` is no longer its parent."""
    done = threading.Event()

    def watch() -> None:
        while not done.wait(PARENT_POLL_S):
            if os.getppid() != parent:
                os._exit(1)

    watcher = threading.Thread(target=watch, name="ppoflow-zygote-parent-watch", daemon=True)
    watcher.start()
    try:
        yield
    finally:
        done.set()
        watcher.join()  # gone before the first fork: workers are forked from one thread


class _WorkerSetup:
    """What the zygote does in each forked worker before it serves: die with the zygote, send
    its output to the driver's bounded pipes, cut its network (``no_network``), bound its memory
    (``reward.worker_memory_mb``)."""

    def __init__(self, init: dict[str, Any]) -> None:
        limits = init.get("limits") or {}
        self.limits = WorkerLimits(
            frozenset(limits.get("reserved_names", ())),
            limits.get("memory_mb"),
            bool(limits.get("no_network", False)),
            limits.get("calls_per_worker"),
        )
        self.output_fds: list[int] | None = init.get("output_fds")
        self.zygote = os.getpid()
        import ctypes  # before any fork: each worker finds it imported

        self._prctl = ctypes.CDLL(None, use_errno=True).prctl
        self.network_mode = _probe_network_mode() if self.limits.no_network else None
        # one namespace for every worker, made here once (about 6 ms a worker otherwise): a
        # process may only unshare a user namespace while it holds one thread
        self._network_cut = (
            self.network_mode == "namespace" and threading.active_count() == 1 and unshare_network()
        )

    def in_child(self) -> None:
        # the zygote forks from its main thread, so the parent-death signal fires at its exit
        self._prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != self.zygote:  # it died before the line above
            os._exit(1)
        if self.output_fds is not None:
            for fd, target in zip(self.output_fds, (1, 2)):
                os.dup2(fd, target)
                os.close(fd)
        if self.network_mode == "audit-hook" or (
            self.network_mode == "namespace" and not self._network_cut and not unshare_network()
        ):
            refuse_network()
        if self.limits.memory_mb is not None:
            _limit_memory(self.limits.memory_mb)


# --- no network (WorkerLimits.no_network) ---------------------------------------------------

_CLONE_NEWUSER, _CLONE_NEWNET = 0x10000000, 0x40000000  # linux/sched.h
#: audit events (``sys.addaudithook``) refused by :func:`refuse_network`
NETWORK_AUDIT_EVENTS = frozenset(
    {"socket.connect", "socket.bind", "socket.sendto", "socket.sendmsg", "socket.getaddrinfo"}
    | {"socket.gethostbyname", "socket.gethostbyaddr", "socket.getnameinfo"}
)
NETWORK_OFF_MESSAGE = "network is off in the tool sandbox"


def unshare_network() -> bool:
    """Move this process into a new user and network namespace; False if the kernel refuses.

    The process must hold one thread (a forked worker does). The new network namespace has only
    a loopback device, which is down, so every connection fails ("Network is unreachable"), the
    driver's loopback services included. The user namespace (which lets an unprivileged process
    make the network one) maps this process's uid and gid to themselves, so ``os.getuid()`` and
    file access are as before.
    """
    import ctypes

    uid, gid = os.getuid(), os.getgid()
    if ctypes.CDLL(None, use_errno=True).unshare(_CLONE_NEWUSER | _CLONE_NEWNET) != 0:
        return False
    with contextlib.suppress(OSError):  # unmapped ids read as 65534; nothing else changes
        for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1")):
            with open(f"/proc/self/{name}", "w") as file:
                file.write(text)
        with open("/proc/self/gid_map", "w") as file:
            file.write(f"{gid} {gid} 1")
    return True


def refuse_network() -> None:
    """Refuse, for the rest of this process's life, every Python-level socket connect, bind,
    send-to and name lookup (``PermissionError``; the hook cannot be removed)."""
    sys.addaudithook(_refuse_network_event)


def _refuse_network_event(event: str, args: tuple[Any, ...]) -> None:
    if event in NETWORK_AUDIT_EVENTS:
        raise PermissionError(NETWORK_OFF_MESSAGE)


def _probe_network_mode() -> str:
    """``"namespace"`` when a forked child may :func:`unshare_network`, else ``"audit-hook"``."""
    _flush_output()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            code = 0 if unshare_network() else 1
        finally:
            os._exit(code)
    return "namespace" if _exit_code(pid) == 0 else "audit-hook"


def _limit_memory(memory_mb: int) -> None:
    """``RLIMIT_AS`` = this process's address space now + ``memory_mb`` MiB (never raised)."""
    with open("/proc/self/status") as status:
        size_kib = next(int(line.split()[1]) for line in status if line.startswith("VmSize:"))
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    bound = size_kib * 1024 + memory_mb * (1 << 20)
    if soft != resource.RLIM_INFINITY:
        bound = min(bound, soft)
    if hard != resource.RLIM_INFINITY:
        bound = min(bound, hard)
    resource.setrlimit(resource.RLIMIT_AS, (bound, hard))


def _fork_worker(sock: socket.socket, fds: list[int], fn: Any, setup: _WorkerSetup) -> int:
    _flush_output()  # nothing buffered here may be written again by the child
    pid = os.fork()
    if pid == 0:
        _run_worker(sock, fds, fn, setup)
    for fd in fds:
        os.close(fd)
    return pid


def _flush_output() -> None:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()


def _run_worker(sock: socket.socket, fds: list[int], fn: Any, setup: _WorkerSetup) -> NoReturn:
    """A forked worker: serve on the received socket and progress memfd, then exit."""
    code = 0
    try:
        sock.close()
        setup.in_child()
        conn_fd, progress_fd = fds
        progress = ProgressSlot(mmap.mmap(progress_fd, ProgressSlot.SIZE))
        os.close(progress_fd)
        worker_main(socket.socket(fileno=conn_fd), fn, progress, setup.limits)
    except BaseException:
        with contextlib.suppress(BaseException):
            traceback.print_exc()
        code = 1
    finally:
        _flush_output()
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
    network_isolation: str | None = None  # how WorkerLimits.no_network is enforced, or None


@dataclass
class SpawnedWorker:
    """A forked worker as the driver holds it: its socket, its progress slot and its pid."""

    sock: socket.socket
    progress: ProgressSlot
    pid: int


class Zygote:
    """Starts the zygote for ``scorer`` and waits, up to ``startup_timeout_s``, for its import.

    ``limits`` go to every worker (``reward.worker_memory_mb``, the extra names refused);
    ``output_fds`` (write ends of two pipes) become each worker's stdout and stderr, which the
    driver reads under ``reward.worker_output_bytes``; None: the driver's own.

    Raises:
        ScorerStartupError: the import did not finish in time (the process is killed), raised,
            or the process died; one line naming the scorer and, for a hang, the config key.
    """

    def __init__(
        self,
        scorer: ScorerRef,
        startup_timeout_s: float,
        *,
        limits: WorkerLimits | None = None,
        output_fds: tuple[int, int] | None = None,
    ) -> None:
        self.scorer = scorer
        self.startup_timeout_s = startup_timeout_s
        self.limits = limits or WorkerLimits()
        self.output_fds = output_fds
        self._sock, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        with theirs:
            self.process = subprocess.Popen(
                [sys.executable, "-c", _BOOT, str(theirs.fileno())],
                pass_fds=(theirs.fileno(), *(output_fds or ())),
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
        init = {
            "scorer": _ref_fields(self.scorer),
            "sys_path": list(sys.path),
            "parent": os.getpid(),
            "limits": {
                "reserved_names": sorted(self.limits.reserved_names),
                "memory_mb": self.limits.memory_mb,
                "no_network": self.limits.no_network,
                "calls_per_worker": self.limits.calls_per_worker,
            },
            "output_fds": list(self.output_fds) if self.output_fds else None,
        }
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
        return ScorerInfo(
            reply["wants_prompt"], reply["is_async"], reply["threads"], reply.get("network")
        )

    def _reply(self, timeout_s: float, watch_stop: bool = False) -> dict[str, Any]:
        """The zygote's next message; ``TimeoutError`` after ``timeout_s``, ``ZygoteGone`` at EOF;
        with ``watch_stop``, :class:`ZygoteStopped` as soon as the zygote is seen stopped (looked
        at every :data:`STOP_POLL_S`)."""
        deadline = time.monotonic() + timeout_s
        while True:
            wait_s = max(deadline - time.monotonic(), 0)
            if _readable(self._sock, min(wait_s, STOP_POLL_S) if watch_stop else wait_s):
                break
            if time.monotonic() >= deadline:
                raise TimeoutError(f"the reward zygote did not answer within {timeout_s:g} s")
            if watch_stop and self.stopped():
                raise ZygoteStopped(_STOPPED.format(pid=self.process.pid))
        try:
            data = self._sock.recv(_PACKET)
        except OSError as exc:
            raise ZygoteGone(f"the reward zygote's socket failed: {exc}") from None
        if not data:
            raise ZygoteGone("the reward zygote exited")
        return json.loads(data)

    def spawn(self) -> SpawnedWorker:
        """Fork a worker (about a millisecond); also releases the pids given to :meth:`release`."""
        if self.stopped():  # it would never answer: the caller replaces it (and kills it)
            raise ZygoteStopped(_STOPPED.format(pid=self.process.pid))
        ours, theirs = socket.socketpair()
        memfd = os.memfd_create("ppoflow-reward-progress")
        progress = None
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
        except BaseException:
            ours.close()
            if progress is not None:
                progress.close()
            raise
        finally:
            theirs.close()
            os.close(memfd)
        return SpawnedWorker(ours, progress, reply["pid"])

    def fileno(self) -> int:
        """The driver's end of the zygote's socket: readable between requests only at its exit."""
        return self._sock.fileno()

    def gone(self) -> bool:
        """Whether the zygote has exited (its socket is at end of file); never blocks."""
        if self._sock.fileno() < 0:
            return True
        if not _readable(self._sock, 0):
            return False
        try:
            return not self._sock.recv(_PACKET, socket.MSG_PEEK)
        except OSError:
            return True

    def stopped(self) -> bool:
        """Whether the zygote is stopped (SIGSTOP or SIGTSTP: state ``T`` in ``/proc``)."""
        return is_stopped(self.process.pid)

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
            return self._reply(self.startup_timeout_s, watch_stop=True)
        except TimeoutError as exc:
            raise ZygoteGone(str(exc)) from None

    def close(self) -> None:
        """Close the socket (the zygote kills and reaps its workers, then exits); wait for it.
        A stopped zygote, which would not read the end of file, is killed at once (its workers
        die with it: parent-death signal)."""
        self._sock.close()
        if self.stopped():
            self.process.kill()
        try:
            self.process.wait(5.0)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def is_stopped(pid: int) -> bool:
    """Whether process ``pid`` is stopped by a signal (state ``T`` in ``/proc/PID/stat``; a
    tracer's stop, ``t``, is not counted); False when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as stat_file:
            stat = stat_file.read()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] == "T"


def _readable(sock: socket.socket, timeout_s: float) -> bool:
    """Whether ``sock`` has data or an end of file within ``timeout_s`` (``poll``, not
    ``select``: the driver's descriptors, which the zygote inherits by number, may pass 1024)."""
    poller = select.poll()
    poller.register(sock, select.POLLIN)
    return bool(poller.poll(timeout_s * 1000))


def _ref_fields(scorer: ScorerRef) -> dict[str, Any]:
    return {"name": scorer.name, "module": scorer.module, "path": scorer.path}
