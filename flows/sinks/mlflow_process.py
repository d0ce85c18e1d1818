"""The ``mlflow`` metric sink in a process of its own: the training process never imports MLflow.

:meth:`MLflowProcessSink.start` launches ``python -c "…serve(R, W, PARENT)"``, which imports
MLflow, builds a deferred :class:`~flows.sinks.mlflow_logger.MLflowLogger` (its run is created at
the first call) and opens its store; a store that does not exist yet is created at the first call
instead, so a run whose start fails leaves no new store (:func:`builds_ahead`). The training flow
starts it when the run starts opening, before the model is read (``opens_ahead`` in
stages/metrics/sinks.py), so that set-up — MLflow's imports and its SQLite store — runs on
another core beside the model, data and engines
phases; and each step's ``log_batch`` then runs there too, not on the training process's
interpreter lock.

:class:`MLflowProcessSink` has the metric-sink methods (flows/sinks/contract.py ``MetricSink``).
Each call is one request and one reply over a pair of pipes (pickled,
``multiprocessing.connection`` framing), in order under a lock, and it returns when the logger's
method has returned in the other process: ``log_metrics`` returning still means the step's
metrics are in the store, or queued there: by the logger's outage handling, or held for
``metrics_interval_s`` (``ppoflow.mlflow_metrics_interval_s``) to go with the next steps' in one
``log_batch`` (flows/sinks/mlflow_logger.py), which the process sends when they are due even when
no call comes (or here, while a replacement process starts: below). A reply carries

* the method's result, or the exception it raised, raised again here (one that does not survive
  pickling becomes :class:`MLflowProcessError` with its type and message); the other process's
  traceback is added as a note;
* the logger's run id, which ``run_id`` here follows (None while an outage delays the run);
* the log records that ppoflow's modules (``flows.*``) made during the call, handed to the same
  loggers here, so the logger's warnings (an outage, a plot not made) reach the console and the
  run's log as before. MLflow's own log lines and output go to the process's stderr, which it
  inherits (the run's log file while the run starts);
* whether the logger exists yet, whether it holds nothing unsent (``MLflowLogger.settled``) or
  only the latest calls' held metrics (``MLflowLogger.held_calls``), and what a logger in a new
  process needs to go on with its run (``MLflowLogger.handover``).

The config reaches the other process as plain JSON data (flows/jsonable.py). The process ignores
SIGINT and SIGTERM (Ctrl-C, or a stop sent to the whole process group, reaches it too: the
training process stops the run first, then closes this sink with the run's status).

Faults of the process itself (docs/reliability.md):

* **A deadline on every call.** This side writes and reads the pipes without blocking, against a
  deadline: ``call_timeout_s`` (``ppoflow.mlflow_call_timeout_s``) for each call, and the larger
  of that and :data:`START_TIMEOUT_S` for a process's first answer, which waits for MLflow's
  import and its store, and for the call that builds its logger when that was left to the first
  call (a new store: MLflow's migrations, which a kill would leave half-made). A process that
  misses it (stopped, hung) is killed (SIGKILL) and counts as dead; so no call waits longer than
  its deadline for a process that does not answer.
* **A dead process is replaced.** When the process has ended (its reply pipe closes, or a
  request finds it gone) or was killed at a deadline, a new one is launched at once with the
  same settings, and the call returns None without waiting for it: the call stays queued here,
  with every call since the last reply that said the store held everything (the call in flight
  when it died and, during an outage, each call the dead logger had queued). The next call, or
  :meth:`~MLflowProcessSink.close`, which waits, first hands the new process the run
  (``MLflowLogger.take_over``: the same MLflow run, its tags, the steps a continued run held),
  sends the queued calls again, then its own. Metrics carry the timestamp this side gave them, so
  a step that had reached the store before the death is the same point when sent again, which
  MLflow's store keeps once: the run ends with every step once, as an uninterrupted run's, and
  with the status ``close`` gives it (FINISHED, FAILED, KILLED). Each replacement is one warning.
* **Bounded.** A sink replaces its process at most ``max_restarts`` times (:data:`MAX_RESTARTS`).
  The next loss raises :class:`MLflowProcessGone` (a :class:`~flows.sinks.contract.SinkGaveUp`)
  after the metrics of the calls still queued here were appended to
  ``<run_dir>/mlflow_pending.jsonl`` (flows/sinks/pending.py); its one line names the process,
  how it ended and what was saved where, and the fan-out retires the sink with it, saving that
  step's and each later step's metrics to the same file (flows/sinks/fanout.py). At the run's
  end :meth:`~MLflowProcessSink.close` makes one last attempt: a new process takes over the run,
  is sent the pending file's values (their steps and timestamps kept, so a value the store held
  already is the same point) and ends the run with the training's status; the file is then
  removed. If that process is lost too, the file is left whole and the MLflow run stays
  ``RUNNING``, as after a ``kill -9`` of the whole training; one line says which.
* **No second run.** Each sink gives its processes one ``creation_token``: a process that
  created the MLflow run and died before it answered leaves a run tagged with it, which the
  replacement's logger finds and goes on with (flows/sinks/mlflow_logger.py).
* **No orphan.** The process ends when its request pipe closes: after
  :meth:`~MLflowProcessSink.close`, or when the training process dies (``kill -9``), which leaves
  the MLflow run as a killed in-process logger would. A thread in it also ends it once the
  training process is gone (its parent process id changes), for when a process forked from the
  training process still holds the pipe's other end.
"""

from __future__ import annotations

import atexit
import logging
import os
import pickle
import select
import signal
import struct
import subprocess
import sys
import threading
import time
import traceback
import uuid
from collections import deque
from collections.abc import Callable, Mapping
from contextlib import suppress
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from flows.process.start_up_gc import pause as pause_collector
from flows.process.start_up_gc import resume as resume_collector
from flows.sinks.contract import SinkGaveUp
from flows.sinks.pending import append_pending, pending_file, read_pending

log = logging.getLogger(__name__)

#: the directory that holds the ``flows`` package, first on the process's import path
SOURCE_ROOT = str(Path(__file__).resolve().parents[2])
#: how long :meth:`MLflowProcessSink.close` waits for the process to end after its last reply
EXIT_WAIT_S = 10.0
#: the default deadline of one call (``ppoflow.mlflow_call_timeout_s`` sets it for a run)
CALL_TIMEOUT_S = 120.0
#: the deadline of a process's first answer when it is longer than the call's: MLflow's imports
#: and its store's start run on a low-priority thread, beside the training process's start-up
START_TIMEOUT_S = 600.0
#: how many times a sink replaces a process that died or missed a deadline before it gives up
MAX_RESTARTS = 3
#: how often the process checks that the training process (its parent) still runs
PARENT_POLL_S = 1.0
#: the loggers whose records the process hands back (the logger, the plots, the store)
RELAYED_LOGGER = "flows"
#: how much nicer the process's start (MLflow's imports, its store) runs: Linux then gives it
#: about a tenth of a core while the training process's start keeps both busy, and all the CPU
#: left idle. Not an idle scheduling class: on a machine loaded by others that one would starve it
#: for minutes (seen: a 2-step training behind one busy process per core took 14 min), and an
#: unprivileged process cannot raise its priority again once the training process waits for it
NICENESS = 10
#: the config key of the call deadline, named in the messages
TIMEOUT_KEY = "ppoflow.mlflow_call_timeout_s"


class MLflowProcessError(RuntimeError):
    """The MLflow process ended, or raised an error that could not be sent back as it was."""


class MLflowProcessGone(MLflowProcessError, SinkGaveUp):
    """The MLflow process was lost once more than the sink's restarts allow: the sink has stopped
    for good, and the message says what was saved where (module docstring)."""


@dataclass
class Reply:
    """What the process answers to one request (module docstring)."""

    run_id: str | None
    tracking_uri: str | None
    result: Any = None
    error: bytes | None = None  # the pickled exception
    error_text: str | None = None  # "TypeName: message", for when it does not unpickle
    error_traceback: str | None = None
    records: list[dict[str, Any]] = field(default_factory=list)
    settled: bool = True  # the logger holds nothing the store lacks
    #: else: the latest calls it holds for the metrics interval, all before them in the store
    held: int = 0
    state: dict[str, Any] | None = None  # MLflowLogger.handover(), when it changed
    built: bool = True  # the logger exists (else the next call builds it, and maybe the store)


#: one call as sent: (method, args)
Call = tuple[str, tuple[Any, ...]]


@dataclass(frozen=True)
class _Limit:
    """A deadline (``time.monotonic``) and the bound it comes from, in words."""

    until: float
    bound: str


class _Lost(Exception):
    """The process is of no more use: it ended, or it missed a deadline and was killed."""

    def __init__(self, how: str) -> None:
        super().__init__(how)
        self.how = how


class MLflowProcessSink:
    """The ``mlflow`` sink, its :class:`~flows.sinks.mlflow_logger.MLflowLogger` in another process.

    Args of :meth:`start`: those of ``MLflowLogger`` (``project``: the experiment, ``experiment``:
    the run name, ``run_dir``, ``tracking_uri``, ``system_metrics_interval_s``), the logger deferred; ``output``; and the fault
    handling's bounds (module docstring): ``call_timeout_s``, ``start_timeout_s`` (the first
    answer of each process; at least ``call_timeout_s``), ``max_restarts``.
    """

    def __init__(
        self,
        child: _Process,
        tracking_uri: str | None,
        settings: Mapping[str, Any],
        *,
        call_timeout_s: float = CALL_TIMEOUT_S,
        start_timeout_s: float = START_TIMEOUT_S,
        max_restarts: int = MAX_RESTARTS,
    ) -> None:
        self._child = child
        self._settings = dict(settings)  # what each process is sent first
        self.tracking_uri = tracking_uri
        self.run_id: str | None = None
        self.call_timeout_s = float(call_timeout_s)
        self.start_timeout_s = max(float(start_timeout_s), self.call_timeout_s)
        self.max_restarts = int(max_restarts)
        self.restarts = 0  # processes launched to replace a lost one
        self._lock = threading.Lock()
        self._opened: bool | None = None  # None: the start reply is not read yet
        self._start_reply: Reply | None = None
        self._closed = False
        self._gone: MLflowProcessGone | None = None
        # the calls since the store last held everything, in order; the first _delivered of them
        # were sent to this process, and _awaiting has one entry per unanswered request (True:
        # one of those calls; False: a take_over)
        self._unsettled: list[Call] = []
        self._delivered = 0
        self._awaiting: deque[bool] = deque()
        self._state: dict[str, Any] | None = None  # the logger's last handover()
        self._handing_over = False  # a replacement that is not given the run yet
        self._built = False  # the process's logger exists (its start reply or a later one)

    @classmethod
    def start(
        cls,
        project: str,
        experiment: str,
        *,
        run_dir: str | os.PathLike | None,
        tracking_uri: str | None,
        output: str | None = None,
        call_timeout_s: float = CALL_TIMEOUT_S,
        start_timeout_s: float = START_TIMEOUT_S,
        max_restarts: int = MAX_RESTARTS,
        system_metrics_interval_s: float | None = None,
        metrics_interval_s: float = 0.0,
    ) -> MLflowProcessSink:
        """Hand the logger's settings to the process :func:`start_ahead` started (else to a new
        one); returns at once. ``output``: a file the process sends its stdout and stderr to
        (MLflow's and alembic's lines; the run's log while the run starts), None = leave them."""
        run_path = None if run_dir is None else str(run_dir)
        logger = {
            "project": project,
            "experiment": experiment,
            "tracking_uri": tracking_uri,
            "system_metrics_interval_s": system_metrics_interval_s,
            "metrics_interval_s": metrics_interval_s,
        }
        token = uuid.uuid4().hex  # one per sink: its replacement processes share it
        settings = {
            "logger": {**logger, "run_dir": run_path, "creation_token": token},
            "output": output,
        }
        sink = cls(
            _ahead.pop() if _ahead else _Process.launch(),
            tracking_uri,
            settings,
            call_timeout_s=call_timeout_s,
            start_timeout_s=start_timeout_s,
            max_restarts=max_restarts,
        )
        sink._send_settings()
        return sink

    @property
    def popen(self) -> subprocess.Popen:
        """The MLflow process (the current one, after a replacement)."""
        return self._child.popen

    @property
    def pid(self) -> int:
        return self._child.popen.pid

    # --- the metric-sink methods ---

    def continue_run(self, resumed: Any) -> None:
        self._call("continue_run", resumed)

    def set_tags(self, tags: Mapping[str, str]) -> None:
        self._call("set_tags", dict(tags))

    def log_params(self, config: Any) -> None:
        from flows.jsonable import jsonable

        self._call("log_params", jsonable(config, "config"))

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        values = {key: float(value) for key, value in metrics.items()}
        self._call("log_metrics", values, int(step), int(time.time() * 1000))

    def log_table(self, rows: list[Mapping[str, Any]], artifact_file: str) -> None:
        self._call("log_table", [dict(row) for row in rows], artifact_file)

    def log_dict(self, data: Any, artifact_file: str) -> None:
        self._call("log_dict", data, artifact_file)

    def log_text(self, text: str, artifact_file: str) -> None:
        self._call("log_text", text, artifact_file)

    def log_plots(self, history: list[Mapping[str, float]]) -> Any:
        """The plots report; None when the process was lost and the plots wait for the next."""
        return self._call("log_plots", [dict(metrics) for metrics in history])

    def close(self, status: str = "FINISHED") -> None:
        """End the run with ``status`` (the logger's ``close``; a lost process is replaced first,
        and this waits for the calls sent again) and the process. A process that never started
        its logger is only waited for; a sink that gave up only ends."""
        if self._closed:
            return
        try:
            with self._lock:
                if self._gone is None:
                    self._deliver(("close", (status,)), closing=True)
                else:
                    self._last_attempt(status)
        finally:
            self._closed = True
            self._child.end()

    def _last_attempt(self, status: str) -> None:
        """A sink that gave up: one more process takes over the run, gets the pending file's
        values and ends the run with ``status`` (module docstring). The file is set aside while
        they are sent, removed once the run is ended (what the logger could not store then is
        in a new pending file), and put back if the process is lost too."""
        run_dir = self._settings["logger"]["run_dir"]
        if run_dir is None:
            return
        path = pending_file(run_dir, "mlflow")
        aside = path.with_name(path.name + ".sending")
        if path.exists():
            os.replace(path, aside)
        rows = read_pending(aside)
        self._child.kill()
        try:
            child = _Process.launch()
        except OSError as err:
            self._restore_pending(aside, path)
            log.warning("MLflow: no process could be launched to end run %s: %s", self.run_id, err)
            return
        self._unsettled, self._gone = [], None
        self.max_restarts = self.restarts  # the next loss gives up at once
        self._adopt(child)
        try:
            if rows:
                self._deliver(("log_pending", ([list(row) for row in rows],)), closing=False)
            self._deliver(("close", (status,)), closing=True)
            if not self._opened:
                raise MLflowProcessError("its logger did not start")
        except Exception as gone:  # lost again (MLflowProcessGone), or the store refused it
            self._restore_pending(aside, path)
            log.warning(
                "MLflow: the last attempt to end run %s %s failed: %s; it stays RUNNING and %s "
                "keeps the %d values it was to send",
                self.run_id or "(none)",
                status,
                gone,
                path,
                len(rows),
            )
            return
        aside.unlink(missing_ok=True)
        log.warning(
            "MLflow: run %s ended %s by a last process%s",
            self.run_id,
            status,
            f", which stored the {len(rows)} values saved to {path}" if rows else "",
        )

    @staticmethod
    def _restore_pending(aside: Path, path: Path) -> None:
        """Put the set-aside rows back in front of any the failed attempt appended."""
        if not aside.exists():
            return
        if path.exists():
            aside.write_text(aside.read_text() + path.read_text())
        os.replace(aside, path)

    # --- requests ---

    def _call(self, method: str, *args: Any) -> Any:
        if self._closed:
            raise MLflowProcessError(f"the MLflow sink is closed; {method} was not sent")
        with self._lock:
            if self._gone is not None:
                raise MLflowProcessGone(f"{method} was not sent: {self._gone}")
            return self._deliver((method, args), closing=False)

    def _deliver(self, call: Call, closing: bool) -> Any:
        """Send ``call`` once the process is ready, and take its reply. A lost process is
        replaced (:meth:`_replace`); the call then waits for the new one, queued, and None is
        returned, except in ``close``, which goes on until it is answered."""
        queued = False
        while True:
            try:
                if not self._ready(raise_error=not closing, current=call):
                    return None  # closing a logger that never started
                if not queued:
                    self._unsettled.append(call)
                    queued = True
                return self._exchange(call)
            except _Lost as lost:
                if not queued:
                    self._unsettled.append(call)
                    queued = True
                self._replace(lost, call)
                if not closing:
                    return None

    def _ready(self, raise_error: bool, current: Call) -> bool:
        """The process answered its start, holds the run (a replacement: ``take_over``) and was
        sent every queued call before ``current``; whether its logger started
        (:meth:`_await_start`)."""
        if self._child.broken:
            raise _Lost("was cut off in the middle of a message by an exception here")
        while self._awaiting:  # the reply to a call that an exception (a stop signal) cut short
            self._quietly(self._take_next, self._limit(), "an earlier call")
        if not self._await_start(raise_error):
            return False
        if self._handing_over:
            if self._state is not None:
                limit = self._limit()
                self._send(("take_over", (self._state,)), False, limit, "take_over")
                self._quietly(self._take_next, limit, "take_over")
            self._handing_over = False
        while self._delivered < len(self._unsettled):
            call = self._unsettled[self._delivered]
            if call is current:  # queued when its process was lost; the caller sends it
                break
            self._quietly(self._exchange, call)
        return True

    def _quietly(self, work: Callable[..., Any], *args: Any) -> None:
        """``work(*args)``, an error the logger raised dropped: a call sent again (or one whose
        caller an exception took away) raised it here when it was first made, and the logger keeps
        it queued, so it comes back with the next."""
        try:
            work(*args)
        except _Lost:
            raise
        except Exception as err:
            log.debug("MLflow: a call sent again raised %s", err)

    def _limit(self, start: bool = False) -> _Limit:
        """The deadline of a call; ``start``: of a process's first answer, or of the call that
        builds its logger (which creates a new store: MLflow's migrations, not to be cut off)."""
        if start or not self._built:
            return _Limit(time.monotonic() + self.start_timeout_s, f"{self.start_timeout_s:g} s")
        bound = f"{self.call_timeout_s:g} s ({TIMEOUT_KEY})"
        return _Limit(time.monotonic() + self.call_timeout_s, bound)

    def _exchange(self, call: Call) -> Any:
        """Send ``call`` (the next undelivered one) and take its reply, within one deadline."""
        limit = self._limit()
        self._send(call, True, limit, call[0])
        return self._take_next(limit, call[0])

    def _take_next(self, limit: _Limit, what: str) -> Any:
        return self._take(self._receive(limit, what))

    def _send(self, request: Any, counted: bool, limit: _Limit, what: str) -> None:
        self._io(lambda until: self._child.send(request, until), limit, what)
        if counted:
            self._delivered += 1
        self._awaiting.append(counted)

    def _receive(self, limit: _Limit, what: str) -> Reply:
        """The next reply; the calls it says the store holds leave the queue."""
        reply = self._io(self._child.receive, limit, what)
        self._awaiting.popleft()
        self._built = reply.built
        if reply.settled or reply.held:  # all but the last `held` answered calls are stored
            done = max(0, self._delivered - sum(self._awaiting) - reply.held)
            del self._unsettled[:done]
            self._delivered -= done
        if reply.state is not None:
            self._state = reply.state
        return reply

    def _io(self, work: Callable[[float], Any], limit: _Limit, what: str) -> Any:
        """``work(deadline)`` on the pipes; a process that is gone, or does not answer in time
        (then killed), raises :class:`_Lost`."""
        try:
            return work(limit.until)
        except _Deadline:
            self._child.kill()
            raise _Lost(f"did not answer {what} within {limit.bound}, so it was killed") from None
        except (EOFError, OSError):
            status = self._child.exit_status()
            raise _Lost(f"ended with exit status {status} before answering {what}") from None

    def _await_start(self, raise_error: bool) -> bool:
        """Read the process's start reply once; whether the logger started. When it did not,
        raise why (``raise_error``) or return False (closing: the error was raised at the first
        call, or the run failed to open for another reason, which it must not mask)."""
        if self._opened is None:
            reply = self._io(self._child.receive, self._limit(start=True), "its start")
            self._start_reply = reply
            self._built = reply.built
            self._opened = reply.error is None and reply.error_text is None
            if self._opened:
                self._take(reply)
        if not self._opened and raise_error:
            self._take(self._start_reply)  # raises the logger's error
        return bool(self._opened)

    def _send_settings(self) -> None:
        """The process's first message; a process already gone is found by the start reply."""
        with suppress(_Lost):
            send = lambda until: self._child.send(self._settings, until)  # noqa: E731
            self._io(send, self._limit(start=True), "its settings")

    def _take(self, reply: Reply) -> Any:
        """Relay the reply's log records (once), follow its run id; its result, or raise its
        error."""
        records, reply.records = reply.records, []
        for data in records:
            record = logging.makeLogRecord(data)
            handler = logging.getLogger(record.name)
            if handler.isEnabledFor(record.levelno):
                handler.handle(record)
        self.run_id = reply.run_id or self.run_id
        self.tracking_uri = reply.tracking_uri or self.tracking_uri
        if reply.error is None and reply.error_text is None:
            return reply.result
        raise _error_from(reply)

    # --- a lost process ---

    def _replace(self, lost: _Lost, call: Call) -> None:
        """Kill what is left of the process and launch a new one that will go on with the run
        (module docstring); past ``max_restarts``, give up (:meth:`_give_up`)."""
        old = self._child.popen.pid
        self._child.kill()
        if self.restarts >= self.max_restarts:
            raise self._give_up(old, lost, call)
        try:
            child = _Process.launch()
        except OSError as err:
            launch = f"; a new one could not be launched: {err}"
            raise self._give_up(old, lost, call, launch) from err
        self.restarts += 1
        self._adopt(child)
        log.warning(
            "MLflow: the process logging run %s (pid %d) %s; a new one (pid %d, restart %d of at "
            "most %d) continues the run and is sent again the %d call(s) the store may lack",
            self.run_id or "(not created yet)",
            old,
            lost.how,
            child.popen.pid,
            self.restarts,
            self.max_restarts,
            len(self._unsettled),
        )

    def _adopt(self, child: _Process) -> None:
        """Make ``child`` this sink's process: nothing read from it or sent to it yet, the run to
        be handed over (``take_over``) before the queued calls, its settings sent."""
        self._child = child
        self._opened, self._start_reply, self._built = None, None, False
        self._delivered = 0
        self._awaiting.clear()
        self._handing_over = True
        self._send_settings()

    def _give_up(self, pid: int, lost: _Lost, call: Call, launch: str = "") -> MLflowProcessGone:
        """Save the metrics of the queued calls (but ``call``'s: the fan-out saves a failing
        step's) to the pending file, and the error that says so."""
        metrics = [c for c in self._unsettled if c[0] == "log_metrics" and c is not call]
        others = sum(1 for c in self._unsettled if c[0] != "log_metrics" and c is not call)
        values = [
            (key, value, step, ts)
            for _, (batch, step, ts) in metrics
            for key, value in batch.items()
        ]
        run_dir = self._settings["logger"]["run_dir"]
        if not values:
            saved = "it had no metrics left to store"
        elif run_dir is None:
            saved = f"{len(values)} metric values it had not stored are lost (no run_dir)"
        else:
            path = pending_file(run_dir, "mlflow")
            append_pending(path, values)
            steps = steps_text(sorted({step for _, (_, step, _) in metrics}))
            saved = f"{len(values)} metric values of {steps} it had not stored are saved to {path}"
        if others:
            saved += f"; {others} other call(s) (tags, params, artifacts) were not sent"
        self._unsettled.clear()
        self._delivered = 0
        self._awaiting.clear()
        self._gone = MLflowProcessGone(
            f"the MLflow process (pid {pid}) {lost.how}{launch}, with {self.restarts} of "
            f"{self.max_restarts} restarts used: the sink stops until the run's end, when one "
            f"more process ends MLflow run {self.run_id or '(none)'}; {saved}"
        )
        return self._gone


def steps_text(steps: list[int]) -> str:
    """``steps`` (sorted) in words, runs of consecutive steps as ranges.

    >>> steps_text([3]), steps_text([2, 3, 4, 7])
    ('step 3', 'steps 2–4, 7')
    """
    runs: list[list[int]] = []
    for step in steps:
        if runs and step == runs[-1][-1] + 1:
            runs[-1].append(step)
        else:
            runs.append([step])
    parts = [str(run[0]) if len(run) == 1 else f"{run[0]}–{run[-1]}" for run in runs]
    return f"step {parts[0]}" if len(steps) == 1 else "steps " + ", ".join(parts)


class _Deadline(Exception):
    """A pipe was not ready before its deadline."""


@dataclass
class _Process:
    """A launched MLflow process and this side's ends of its pipes, read and written without
    blocking against a deadline, in ``multiprocessing.connection``'s framing (the process uses
    ``Connection``)."""

    popen: subprocess.Popen
    request_fd: int
    reply_fd: int
    ended: bool = False
    broken: bool = False  # a message was cut off half-way: the framing is lost

    @classmethod
    def launch(cls) -> _Process:
        """``python -c "…serve(R, W, PARENT)"`` with this process's ``flows`` first on its path."""
        request_read, request_write = os.pipe()
        reply_read, reply_write = os.pipe()
        path = os.environ.get("PYTHONPATH")
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [SOURCE_ROOT, path]))}
        code = (
            "from flows.sinks.mlflow_process import serve; "
            f"serve({request_read}, {reply_write}, {os.getpid()})"
        )
        try:
            popen = subprocess.Popen(
                [sys.executable, "-c", code], pass_fds=(request_read, reply_write), env=env
            )
        except BaseException:
            for fd in (request_read, request_write, reply_read, reply_write):
                os.close(fd)
            raise
        os.close(request_read)
        os.close(reply_write)
        os.set_blocking(request_write, False)
        os.set_blocking(reply_read, False)
        return cls(popen, request_write, reply_read)

    def send(self, request: Any, deadline: float) -> None:
        data = pickle.dumps(request)
        size = len(data)
        header = struct.pack("!i", size) if size <= 0x7FFFFFFF else struct.pack("!iQ", -1, size)
        view = memoryview(header + data)
        try:
            while view:
                _wait_for(self.request_fd, select.POLLOUT, deadline)
                try:
                    view = view[os.write(self.request_fd, view) :]
                except BlockingIOError:
                    continue
        except BaseException:
            self.broken = self.broken or 0 < len(view) < len(header) + size
            raise

    def receive(self, deadline: float) -> Any:
        data = bytearray()
        try:
            (size,) = struct.unpack("!i", self._read(data, 4, deadline))
            if size == -1:
                (size,) = struct.unpack("!Q", self._read(data, 12, deadline)[4:])
            header = len(data)
            return pickle.loads(self._read(data, header + size, deadline)[header:])
        except BaseException:
            self.broken = self.broken or bool(data)
            raise

    def _read(self, data: bytearray, size: int, deadline: float) -> bytes:
        """``data`` read on to ``size`` bytes."""
        while len(data) < size:
            _wait_for(self.reply_fd, select.POLLIN, deadline)
            try:
                chunk = os.read(self.reply_fd, min(size - len(data), 1 << 20))
            except BlockingIOError:
                continue
            if not chunk:
                raise EOFError("the MLflow process closed its reply pipe")
            data += chunk
        return bytes(data)

    def exit_status(self) -> int | None:
        """The exit status of a process whose pipe broke (killed if it has not ended within
        :data:`EXIT_WAIT_S`: None)."""
        try:
            return self.popen.wait(timeout=EXIT_WAIT_S)
        except subprocess.TimeoutExpired:
            self.kill()
            return None

    def kill(self) -> None:
        """SIGKILL (a stopped process too) and :meth:`end`."""
        with suppress(ProcessLookupError):
            if self.popen.poll() is None:
                self.popen.kill()
        self.end()

    def end(self) -> None:
        """Close the pipes (the process ends on their end) and reap it."""
        if not self.ended:
            self.ended = True
            for fd in (self.request_fd, self.reply_fd):
                with suppress(OSError):
                    os.close(fd)
        try:
            self.popen.wait(timeout=EXIT_WAIT_S)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait()


def _wait_for(fd: int, event: int, deadline: float) -> None:
    """Until ``fd`` is ready for ``event`` (or hung up, which the read or write then reports);
    :class:`_Deadline` when ``deadline`` (``time.monotonic``) passes first."""
    poller = select.poll()
    poller.register(fd, event)
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise _Deadline
        if poller.poll(max(1, int(remaining * 1000) + 1)):
            return


#: the process :func:`start_ahead` launched, until a sink takes it
_ahead: list[_Process] = []


def start_ahead() -> None:
    """Launch the MLflow process now, before this process imports anything heavy: it imports
    MLflow meanwhile on a low-priority thread (:func:`_run_at_low_priority`), and the run's
    ``mlflow`` sink takes it over (:meth:`MLflowProcessSink.start`). One nobody takes (the run logs no MLflow, or
    fails before its sinks) ends at exit. The ``ppoflow`` executable calls this for a training
    command (flows/cli/entry.py)."""
    if _ahead:
        return
    _ahead.append(_Process.launch())
    atexit.register(_end_untaken)


def _end_untaken() -> None:
    while _ahead:
        _ahead.pop().end()


def _error_from(reply: Reply) -> BaseException:
    error: BaseException | None = None
    if reply.error is not None:
        try:
            error = pickle.loads(reply.error)
        except Exception:
            error = None
    if not isinstance(error, BaseException):
        error = MLflowProcessError(reply.error_text or "the MLflow process failed")
    if reply.error_traceback:
        error.add_note(f"raised in the MLflow process:\n{reply.error_traceback}")
    return error


# --- the process ---------------------------------------------------------------------------


class _Records(logging.Handler):
    """Keeps the records of :data:`RELAYED_LOGGER` as plain data until the next reply."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.kept: list[dict[str, Any]] = []

    def emit(self, record: logging.LogRecord) -> None:
        data = dict(record.__dict__)
        data["msg"], data["args"] = record.getMessage(), None
        if record.exc_info:
            data["exc_text"] = logging.Formatter().formatException(record.exc_info)
        data["exc_info"] = None
        self.kept.append(data)

    def take(self) -> list[dict[str, Any]]:
        kept, self.kept = self.kept, []
        return kept


def _reply(
    logger: Any, records: _Records, result: Any = None, error: Exception | None = None
) -> Reply:
    reply = Reply(
        run_id=getattr(logger, "run_id", None),
        tracking_uri=getattr(logger, "tracking_uri", None),
        result=result,
    )
    if error is not None:
        reply.error_text = f"{type(error).__name__}: {error}"
        reply.error_traceback = "".join(traceback.format_exception(error))
        try:
            reply.error = pickle.dumps(error)
        except Exception:
            reply.error = None
    reply.records = records.take()
    reply.built = logger is not None
    reply.settled = bool(getattr(logger, "settled", True))
    reply.held = int(getattr(logger, "held_calls", 0))
    handover = getattr(logger, "handover", None)
    reply.state = handover() if callable(handover) else None
    return reply


def builds_ahead(settings: Mapping[str, Any], environ: Mapping[str, str] = os.environ) -> bool:
    """Whether building the logger now writes nothing: its store is not a local SQLite file
    that does not exist yet (building the client would create it, and a run whose start fails
    leaves no new store behind).

    >>> builds_ahead({"tracking_uri": "http://mlflow:5000", "run_dir": None})
    True
    >>> builds_ahead({"tracking_uri": "sqlite:////nowhere/mlflow.db", "run_dir": None})
    False
    """
    from flows.sinks.mlflow_store import default_tracking_uri, sqlite_file

    uri = settings["tracking_uri"] or environ.get("MLFLOW_TRACKING_URI")
    if not uri:
        if settings["run_dir"] is None:
            return True  # the logger refuses: its error is the reply
        uri = default_tracking_uri(settings["run_dir"])
    database = sqlite_file(uri)
    return database is None or database.exists()


def serve(request_fd: int, reply_fd: int, parent: int | None = None) -> None:
    """The process's main: import MLflow (at :data:`NICENESS`), take the settings, send stdout
    and stderr to their ``output``, build the logger (:func:`builds_ahead`; else at the first
    request) — all with the cyclic garbage collector off (flows/process/start_up_gc.py) — answer the
    start, then answer each request ``(method, args)`` with the logger's ``method(*args)`` until
    ``close`` or the pipe's end. ``parent``: the training process's id; the process ends when it
    is gone (:func:`_end_with_parent`)."""
    pause_collector()  # while MLflow is imported and the logger built (flows/process/start_up_gc.py)
    for stop in (signal.SIGINT, signal.SIGTERM):  # the training process closes this one
        signal.signal(stop, signal.SIG_IGN)
    if parent is not None:
        _end_with_parent(parent)
    requests = Connection(request_fd, writable=False)
    replies = Connection(reply_fd, readable=False)
    records = _Records()
    relayed = logging.getLogger(RELAYED_LOGGER)
    relayed.setLevel(logging.INFO)
    relayed.propagate = False
    relayed.addHandler(records)
    imported = _run_at_low_priority(_import_logger)
    try:
        settings = requests.recv()
    except EOFError:
        return
    if settings["output"] is not None:
        _send_output_to(settings["output"])
    logger, error = None, imported.error
    if error is None:
        built = _run_at_low_priority(lambda: _build_ahead(imported.value, settings["logger"]))
        logger, error = built.value, built.error
    resume_collector()
    sent_state = None  # the last handover sent: a reply carries it only when it changed
    _answer(replies, _reply(logger, records, error=error))
    if error is not None:
        return
    while True:
        try:
            _send_when_due(logger, requests)
            method, args = requests.recv()
        except EOFError:
            if getattr(logger, "hold_deadline", None) is not None:
                with suppress(Exception):  # the training process is gone: keep what it logged
                    logger.send_held()
            return
        try:
            if logger is None and method == "close":  # nothing was logged: no store needed
                result = None
            else:
                logger = logger or imported.value(**settings["logger"], deferred=True)
                result = getattr(logger, method)(*args)
            reply = _reply(logger, records, result=result)
        except Exception as err:
            reply = _reply(logger, records, error=err)
        if reply.state == sent_state:
            reply.state = None
        else:
            sent_state = reply.state
        _answer(replies, reply)
        if method == "close":
            _exit_now()


def _send_when_due(logger: Any, requests: Connection) -> None:
    """Wait for the next request; while the logger holds metrics, send them when they are due
    (``MLflowLogger.hold_deadline``) if no request came first. An error there leaves them queued,
    so the next call that sends raises it."""
    while (deadline := getattr(logger, "hold_deadline", None)) is not None:
        if requests.poll(max(0.0, deadline - time.monotonic())):
            return
        with suppress(Exception):
            logger.send_held()
        if logger.hold_deadline == deadline:  # not sent (an outage's wait): the next call tries
            return


def _answer(replies: Connection, reply: Reply) -> None:
    """Send ``reply``; a training process that is gone ends this one (nobody is left to ask)."""
    try:
        replies.send(reply)
    except (BrokenPipeError, ConnectionResetError):
        _exit_now()


def _end_with_parent(parent: int) -> None:
    """A daemon thread that ends the process once ``parent`` is no longer its parent (it died:
    the process was handed to another), checked every :data:`PARENT_POLL_S`. The request pipe's
    end does it too, unless a process forked from the training process still holds that pipe."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(PARENT_POLL_S)
        _exit_now()

    threading.Thread(target=watch, name="ppoflow-mlflow-parent", daemon=True).start()


@dataclass
class _Outcome:
    value: Any = None
    error: Exception | None = None


def _run_at_low_priority(work: Callable[[], Any]) -> _Outcome:
    """``work()`` on a thread :data:`NICENESS` steps nicer than the process (Linux gives each
    thread its own; elsewhere it runs at the process's priority), so that the training process's
    start-up, which needs every core, goes first; the calls answered later run at normal
    priority on the main thread."""
    outcome = _Outcome()

    def run() -> None:
        with suppress(OSError, AttributeError):
            tid = threading.get_native_id()
            os.setpriority(os.PRIO_PROCESS, tid, os.getpriority(os.PRIO_PROCESS, tid) + NICENESS)
        try:
            outcome.value = work()
        except Exception as err:
            outcome.error = err

    thread = threading.Thread(target=run, name="ppoflow-mlflow-start")
    thread.start()
    thread.join()
    return outcome


def _import_logger() -> type:
    from flows.sinks.mlflow_logger import MLflowLogger

    with suppress(ImportError):  # what building a SQLite store's client imports
        import mlflow.store.tracking.sqlalchemy_store  # noqa: F401
    return MLflowLogger


def _build_ahead(logger_class: type, settings: Mapping[str, Any]) -> Any:
    """The logger, warmed up (``MLflowLogger.warm_up``), when :func:`builds_ahead`; else None."""
    if not builds_ahead(settings):
        return None
    logger = logger_class(**settings, deferred=True)
    logger.warm_up()
    return logger


def _send_output_to(path: str) -> None:
    """Point file descriptors 1 and 2 at ``path`` (appended to)."""
    target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    for fd in (1, 2):
        os.dup2(target, fd)
    os.close(target)


def _exit_now() -> None:
    """End the process without the interpreter's teardown: the logger is closed and every call
    answered, and collecting MLflow's and matplotlib's objects is a long pass that the training
    process would wait for."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


__all__ = ["MLflowProcessError", "MLflowProcessGone", "MLflowProcessSink", "serve"]
