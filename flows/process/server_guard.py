"""A run stops at once, with one line, when Prefect's temporary server dies or stops answering.

``ppoflow train`` / ``ppoflow resume`` start Prefect's temporary server themselves
(flows/process/prefect_server.py). Left alone, a run whose server is gone goes on until its next
call to the server's API, which Prefect's client retries with a growing back-off (about a minute
in all), then fails with ``ConnectError: [Errno 111] Connection refused``, a line that names
neither Prefect nor how to go on; meanwhile every task run's events wait for a connection
several seconds each, and at exit Prefect tries to deliver each of them before the process
ends (minutes). A server that is stopped (SIGSTOP) but not dead holds every call for the client's
request timeout, retried.

:class:`ServerGuard`, around the flow run, watches the server's process and its health check
from a thread of its own:

* the server is lost when its process ends (seen at once through a pidfd where Linux has one,
  else within :data:`POLL_S`), or when it has not answered its health check for
  ``PPOFLOW_PREFECT_SERVER_TIMEOUT_S`` seconds (:data:`TIMEOUT_VAR`, default
  :data:`DEFAULT_TIMEOUT_S`, counted from the first probe that got no answer, one probe every
  :data:`PROBE_S`); a server that stopped answering is killed;
* the guard then sets the flow run's settings to no client retries and no log records sent to
  the server, so that every later call fails at once instead of waiting, and sends
  :data:`SIGNAL` to the main thread, whose handler raises :class:`ServerLost` there: the run
  unwinds as it does for a stop signal (its ``finally`` closes the engines, the reward workers
  and the MLflow run, which ends ``FAILED``; a checkpoint being written is finished first,
  flows/process/stop_signals.py ``signals_deferred``);
* the command line prints one line (:func:`lost_line`: what happened to the server, the
  checkpoint that is kept and the ``ppoflow resume RUN`` command) and ends the process with
  :func:`exit_without_prefect`, which runs the exit handlers but not Prefect's deliveries to
  the server that is gone.

Why stop, and not start the server again on its port: Prefect's client would go on after a new
server came up within its retries, but the events sent meanwhile are lost (the flow run's record
would have holes), a call that the old server had carried out but not answered is sent again
(a state change proposed twice may be refused), and a server killed by the OOM killer would be
started again into the same memory pressure. A stopped run resumes exactly
(``ppoflow resume``, docs/reliability.md's kill -9 matrix): every step's artifacts and journal are
written before it counts as done, and checkpoints are renamed into place.

:data:`SIGNAL` is SIGURG, whose default action is to be ignored: one sent from outside while the
guard is on is ignored as before (the handler raises only once the guard has seen a loss).
"""

from __future__ import annotations

import atexit
import contextlib
import http.client
import logging
import os
import select
import signal
import sys
import threading
import time
from types import FrameType
from typing import Any

#: the variable that bounds how long a run waits for a server that does not answer
TIMEOUT_VAR = "PPOFLOW_PREFECT_SERVER_TIMEOUT_S"
#: its default: the bound ppoflow gives the server's start (flows/process/service_waits.py), far
#: above the milliseconds a health check takes, also on a 2-core machine busy with other work
DEFAULT_TIMEOUT_S = 120.0
#: seconds between two health probes of a server that answers
PROBE_S = 2.0
#: seconds between two looks at the process where there is no pidfd
POLL_S = 0.5
#: what the guard sends the main thread on a loss (module docstring); held during a checkpoint
#: (flows/process/stop_signals.py ``DEFERRED_SIGNALS``)
SIGNAL = signal.SIGURG
#: seconds between two sends of :data:`SIGNAL` until the main thread has raised: one that lands
#: after the main thread released the GIL but before its blocking call began is taken by
#: Python's handler without waking that call, which would then run to its end
RESEND_S = 0.5


#: the losses the guards of this process saw (what :func:`server_lost` reports)
_losses: list[str] = []


def server_lost() -> str | None:
    """What happened to the temporary server a guard of this process watched, once it was
    lost; None before (or without a guard). The run's own warnings about calls to the server
    that failed since are the loss's consequences, which the run's one line says already."""
    return _losses[0] if _losses else None


class TimeoutSettingError(ValueError):
    """:data:`TIMEOUT_VAR` holds something that is not a number of seconds above 0."""


def explain_timeout_setting(err: BaseException) -> str | None:
    """The command line's line for a bad :data:`TIMEOUT_VAR` (its message names the variable
    and what would be right); None for other errors (flows/cli/error_lines.py)."""
    return str(err) if isinstance(err, TimeoutSettingError) else None


class ServerLost(BaseException):
    """Raised in the main thread when the guarded server died or stopped answering.

    A ``BaseException`` like ``KeyboardInterrupt``, so that no ``except Exception`` of a stage
    or a library takes it for an error of its own and goes on.
    """


def configured_timeout_s(environ: dict[str, str] | None = None) -> float:
    """The bound of :data:`TIMEOUT_VAR`, default :data:`DEFAULT_TIMEOUT_S`.

    Raises:
        TimeoutSettingError: the value is not a positive number (one line naming the variable).

    >>> configured_timeout_s({}), configured_timeout_s({TIMEOUT_VAR: "30"})
    (120.0, 30.0)
    """
    environ = os.environ if environ is None else environ
    text = environ.get(TIMEOUT_VAR, "").strip()
    if not text:
        return DEFAULT_TIMEOUT_S
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value > 0 or value == float("inf"):
        raise TimeoutSettingError(
            f"{TIMEOUT_VAR}={text!r} is not a number of seconds above 0: export the seconds a "
            f"run waits for Prefect's temporary server to answer (default {DEFAULT_TIMEOUT_S:g})"
        )
    return value


def _exit_text(code: int) -> str:
    """``exited with status -9 (killed by SIGKILL)`` for a process's return code."""
    if code >= 0:
        return f"exited with status {code}"
    try:
        name = signal.Signals(-code).name
    except ValueError:
        name = f"signal {-code}"
    return f"exited with status {code} (killed by {name})"


class ServerGuard:
    """Watches a :class:`~flows.process.prefect_server.TemporaryServer` while a run uses it
    (module docstring); a context manager, entered in the main thread around the flow run.

    Args:
        server: the server; None makes a guard that watches nothing.
        timeout_s: how long the server may go without answering (default
            :func:`configured_timeout_s`).
        probe_s: seconds between two health probes.
    """

    def __init__(
        self, server: Any, timeout_s: float | None = None, probe_s: float = PROBE_S
    ) -> None:
        self.server = server
        if timeout_s is None:
            timeout_s = DEFAULT_TIMEOUT_S if server is None else configured_timeout_s()
        self.timeout_s = timeout_s
        self.probe_s = probe_s
        #: what happened to the server, once it happened (e.g. ``exited with status -9 (SIGKILL)``)
        self.lost: str | None = None
        #: whether the loss was that it stopped answering (the line then names the bound)
        self.silent = False
        self._process: Any = None
        self._pid: int | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._main = threading.main_thread().ident
        self._previous: Any = None  # the signal's handler before this guard's, when it has one
        self._armed = False  # whether a loss raises in the main thread (once)
        self._exited: _ExitWatch | None = None

    def __enter__(self) -> ServerGuard:
        process = getattr(self.server, "process", None)
        if process is None:  # no server, or one that is not a process of ours
            return self
        self._process = process
        self._pid = process.pid
        self._exited = _ExitWatch(process)
        if threading.current_thread() is threading.main_thread():
            self._previous = (signal.signal(SIGNAL, self._on_signal),)
            self._armed = True
        self._thread = threading.Thread(
            target=self._watch, name="ppoflow-prefect-server-guard", daemon=True
        )
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._armed = False
        if self._previous is not None:
            signal.signal(SIGNAL, self._previous[0])
            self._previous = None
        if self._exited is not None:
            self._exited.wake()
        if self._thread is not None:  # a probe in flight ends by its own timeout, unheeded
            self._thread.join(timeout=0.5)

    def settled(self) -> str | None:
        """:attr:`lost`, after a last look at the process: an error that came out of the run
        before the watching thread saw the server end is still put down to the server."""
        process = self._process
        if self.lost is None and process is not None:
            code = process.poll()
            if code is not None:
                self.lost = _exit_text(code)
        return self.lost

    # --- the watching thread ---------------------------------------------------------------

    def _watch(self) -> None:
        process, exited = self._process, self._exited
        try:
            silent_since: float | None = None
            next_probe = time.monotonic() + self.probe_s
            while not self._stop.is_set():
                if exited.wait(max(0.0, next_probe - time.monotonic())):
                    if self._stop.is_set():
                        return
                    self._lose(_exit_text(process.wait()))
                    return
                if self._stop.is_set():
                    return
                asked = time.monotonic()
                remaining = self.timeout_s - (0 if silent_since is None else asked - silent_since)
                if self._healthy(min(10.0, max(0.5, remaining))):
                    silent_since = None
                else:
                    silent_since = asked if silent_since is None else silent_since
                    if time.monotonic() - silent_since >= self.timeout_s and process.poll() is None:
                        if self._stop.is_set():
                            return
                        self.silent = True
                        process.kill()  # so that no call waits on it any longer
                        self._lose(
                            f"did not answer its health check for {self.timeout_s:g} s "
                            f"({TIMEOUT_VAR}) and was killed"
                        )
                        return
                next_probe = time.monotonic() + self.probe_s
        finally:
            exited.close()

    def _healthy(self, timeout: float) -> bool:
        connection = http.client.HTTPConnection("127.0.0.1", self.server.port, timeout=timeout)
        try:
            connection.request("GET", "/api/health")
            return connection.getresponse().status == 200
        except (OSError, http.client.HTTPException):
            return False
        finally:
            connection.close()

    def _lose(self, what: str) -> None:
        """Record the loss, make the flow run's later calls to the server fail at once, and
        interrupt the main thread (module docstring), again every :data:`RESEND_S` until it
        has raised."""
        self.lost = what
        _losses.append(what)
        settings = getattr(self.server, "client_settings", None)
        try:  # Prefect reads these at every call and record, from the flow run's settings
            settings.client.max_retries = 0
            settings.logging.to_api.enabled = False
        except Exception:  # no flow run yet, or a Prefect whose settings cannot change
            pass
        logging.getLogger(__name__).debug("Prefect's temporary server %s", what)
        while self._armed and self._main is not None:
            with contextlib.suppress(OSError, ValueError):
                signal.pthread_kill(self._main, SIGNAL)
            if self._stop.wait(RESEND_S):
                return

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if self._armed and self.lost is not None:
            self._armed = False  # once: the unwinding is not interrupted again
            raise ServerLost(self.lost)


class _ExitWatch:
    """Waits for a process to end — on its pidfd where there is one, else by polling — or for
    :meth:`wake`."""

    def __init__(self, process: Any) -> None:
        self.process = process
        self._woken = threading.Event()
        self._lock = threading.Lock()  # wake() from another thread, close() from the watcher
        self._poll: select.poll | None = None
        self._fds: list[int] = []
        try:
            pidfd = os.pidfd_open(process.pid)
        except (AttributeError, OSError):
            return
        self._fds = [pidfd, *os.pipe()]  # the pidfd, then the pipe that wake() writes to
        self._poll = select.poll()
        self._poll.register(self._fds[0], select.POLLIN)
        self._poll.register(self._fds[1], select.POLLIN)

    def wait(self, seconds: float) -> bool:
        """Whether the process ended within ``seconds`` (False at once after :meth:`wake`)."""
        if self._poll is not None:
            ready = {fd for fd, _ in self._poll.poll(seconds * 1000)}
            return self._fds[0] in ready
        deadline = time.monotonic() + seconds
        while not self._woken.is_set():
            if self.process.poll() is not None:
                return True
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            self._woken.wait(min(POLL_S, left))
        return False

    def wake(self) -> None:
        with self._lock:
            self._woken.set()
            if self._fds:
                os.write(self._fds[2], b"x")

    def close(self) -> None:
        with self._lock:
            for fd in self._fds:
                os.close(fd)
            self._fds = []
            self._poll = None


def lost_line(guard: ServerGuard, run_dir: str, checkpoint_step: int | None) -> str:
    """The one line of a run stopped by its server's loss: the server, what happened to it, what
    is kept, how to go on (and, when it stopped answering, how to wait longer).

    >>> guard = ServerGuard(None, timeout_s=120)
    >>> guard.lost, guard._pid = "exited with status -9 (killed by SIGKILL)", 4242
    >>> line = lost_line(guard, "/runs/r", 3)
    >>> line.startswith("Prefect's temporary server (pid 4242) exited with status -9 (killed by")
    True
    >>> line.endswith("the checkpoint of step 3 is kept; continue with `ppoflow resume /runs/r`")
    True
    """
    line = (
        f"Prefect's temporary server (pid {guard._pid}) {guard.lost} during the run; "
        "the run stopped"
    )
    if checkpoint_step is None:
        line += " before the first checkpoint (trainer.save_freq): nothing to resume, train again"
    else:
        line += (
            f": the checkpoint of step {checkpoint_step} is kept; "
            f"continue with `ppoflow resume {run_dir}`"
        )
    if guard.silent:
        line += f" (on a loaded machine export a larger {TIMEOUT_VAR})"
    return line


def exit_without_prefect(code: int) -> None:
    """End the process with ``code`` after the exit handlers, without Prefect's last deliveries.

    At exit, Prefect's services deliver what they still hold (each task run's events, the log
    records) to the server, retrying each: with the server gone that takes minutes. They wait in
    ``threading``'s exit hooks, which ``os._exit`` skips; the ``atexit`` handlers (the temporary
    server's stop, the MLflow process, the rendezvous directory) run first, then logging's
    final flush of every handler but Prefect's API log handler (whose flush waits for the
    delivery of its records). CPython's ``atexit._run_exitfuncs`` and ``logging._handlerList``
    are what the interpreter's own exit uses.
    """
    try:
        from prefect.logging.handlers import APILogHandler
    except ImportError:
        APILogHandler = ()  # an isinstance of nothing
    try:
        atexit.unregister(logging.shutdown)
        atexit._run_exitfuncs()
        handlers = [
            ref for ref in list(logging._handlerList) if not isinstance(ref(), APILogHandler)
        ]
        logging.shutdown(handlers)
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):
                stream.flush()
        os._exit(code)


__all__ = [
    "DEFAULT_TIMEOUT_S",
    "PROBE_S",
    "SIGNAL",
    "TIMEOUT_VAR",
    "ServerGuard",
    "ServerLost",
    "TimeoutSettingError",
    "configured_timeout_s",
    "exit_without_prefect",
    "explain_timeout_setting",
    "lost_line",
    "server_lost",
]
