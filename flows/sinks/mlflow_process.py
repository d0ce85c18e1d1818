"""The ``mlflow`` metric sink in a process of its own: the training process never imports MLflow.

:meth:`MLflowProcessSink.start` launches ``python -c "…serve(R, W)"``, which imports MLflow,
builds a deferred :class:`~flows.sinks.mlflow_logger.MLflowLogger` (its run is created at the first
call) and opens its store; a store that does not exist yet is created at the first call instead,
so a run whose start fails leaves no new store (:func:`builds_ahead`). The training flow starts it
when the run starts opening, before the model is read (``opens_ahead`` in
stages/metrics/sinks.py), so that set-up — MLflow's imports and its SQLite store — runs on
another core beside the model, data and engines
phases; and each step's ``log_batch`` then runs there too, not on the training process's
interpreter lock.

:class:`MLflowProcessSink` has the metric-sink methods (flows/sinks/contract.py ``MetricSink``).
Each call is one request and one reply over a pair of pipes (pickled,
``multiprocessing.connection`` framing), in order under a lock, and it returns when the logger's
method has returned in the other process: ``log_metrics`` returning still means the step's
metrics are in the store, or queued there by the logger's outage handling. A reply carries

* the method's result, or the exception it raised, raised again here (one that does not survive
  pickling becomes :class:`MLflowProcessError` with its type and message); the other process's
  traceback is added as a note;
* the logger's run id, which ``run_id`` here follows (None while an outage delays the run);
* the log records that ppoflow's modules (``flows.*``) made during the call, handed to the same
  loggers here, so the logger's warnings (an outage, a plot not made) reach the console and the
  run's log as before. MLflow's own log lines and output go to the process's stderr, which it
  inherits (the run's log file while the run starts).

The config reaches the other process as plain JSON data (flows/jsonable.py). The process ignores
SIGINT and SIGTERM (Ctrl-C, or a stop sent to the whole process group, reaches it too: the
training process stops the run first, then closes this sink with the run's status) and ends when
its request pipe closes: after :meth:`~MLflowProcessSink.close`, or when the training process
dies (``kill -9``), which leaves the MLflow run as a killed in-process logger would. If the process dies first, the next call
raises :class:`MLflowProcessError` with its exit status, and the fan-out retires the sink (the
metrics it misses go to ``mlflow_pending.jsonl``, flows/sinks/fanout.py).
"""

from __future__ import annotations

import atexit
import logging
import os
import pickle
import signal
import subprocess
import sys
import threading
import traceback
from collections.abc import Callable, Mapping
from contextlib import suppress
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from flows.process.start_up_gc import pause as pause_collector
from flows.process.start_up_gc import resume as resume_collector

log = logging.getLogger(__name__)

#: the directory that holds the ``flows`` package, first on the process's import path
SOURCE_ROOT = str(Path(__file__).resolve().parents[2])
#: how long :meth:`MLflowProcessSink.close` waits for the process to end after its last reply
EXIT_WAIT_S = 10.0
#: the loggers whose records the process hands back (the logger, the plots, the store)
RELAYED_LOGGER = "flows"
#: how much nicer the process's start (MLflow's imports, its store) runs: Linux then gives it
#: about a tenth of a core while the training process's start keeps both busy, and all the CPU
#: left idle. Not an idle scheduling class: on a machine loaded by others that one would starve it
#: for minutes (seen: a 2-step training behind one busy process per core took 14 min), and an
#: unprivileged process cannot raise its priority again once the training process waits for it
NICENESS = 10


class MLflowProcessError(RuntimeError):
    """The MLflow process ended, or raised an error that could not be sent back as it was."""


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


class MLflowProcessSink:
    """The ``mlflow`` sink, its :class:`~flows.sinks.mlflow_logger.MLflowLogger` in another process.

    Args of :meth:`start`: those of ``MLflowLogger`` (``project``: the experiment, ``experiment``:
    the run name, ``run_dir``, ``tracking_uri``); the logger is deferred.
    """

    def __init__(self, child: _Process, tracking_uri: str | None) -> None:
        self._child = child
        self.tracking_uri = tracking_uri
        self.run_id: str | None = None
        self._lock = threading.Lock()
        self._opened: bool | None = None  # None: the start reply is not read yet
        self._closed = False

    @classmethod
    def start(
        cls,
        project: str,
        experiment: str,
        *,
        run_dir: str | os.PathLike | None,
        tracking_uri: str | None,
        output: str | None = None,
    ) -> MLflowProcessSink:
        """Hand the logger's settings to the process :func:`start_ahead` started (else to a new
        one); returns at once. ``output``: a file the process sends its stdout and stderr to
        (MLflow's and alembic's lines; the run's log while the run starts), None = leave them."""
        sink = cls(_ahead.pop() if _ahead else _Process.launch(), tracking_uri)
        run_path = None if run_dir is None else str(run_dir)
        settings = {"project": project, "experiment": experiment, "tracking_uri": tracking_uri}
        sink._child.requests.send({"logger": {**settings, "run_dir": run_path}, "output": output})
        return sink

    @property
    def popen(self) -> subprocess.Popen:
        """The MLflow process."""
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
        self._call("log_metrics", {key: float(value) for key, value in metrics.items()}, step)

    def log_table(self, rows: list[Mapping[str, Any]], artifact_file: str) -> None:
        self._call("log_table", [dict(row) for row in rows], artifact_file)

    def log_dict(self, data: Any, artifact_file: str) -> None:
        self._call("log_dict", data, artifact_file)

    def log_plots(self, history: list[Mapping[str, float]]) -> Any:
        return self._call("log_plots", [dict(metrics) for metrics in history])

    def close(self, status: str = "FINISHED") -> None:
        """End the run with ``status`` (the logger's ``close``) and the process; a process that
        never started its logger, or already ended, is only waited for."""
        if self._closed:
            return
        try:
            if self.popen.poll() is None and self._await_start(raise_error=False):
                self._call("close", status)
        finally:
            self._closed = True
            self._child.end()

    # --- requests ---

    def _call(self, method: str, *args: Any) -> Any:
        if self._closed:
            raise MLflowProcessError(f"the MLflow sink is closed; {method} was not sent")
        with self._lock:
            self._await_start(raise_error=True)
            try:
                self._child.requests.send((method, args))
                reply = self._child.replies.recv()
            except (EOFError, OSError) as err:
                raise self._ended(method) from err
        return self._take(reply)

    def _await_start(self, raise_error: bool) -> bool:
        """Read the start reply once; whether the logger started. When it did not, raise why
        (``raise_error``) or return False (closing: the error was raised at the first call, or
        the run failed to open for another reason, which it must not mask)."""
        if self._opened is None:
            try:
                self._start_reply: Reply | None = self._child.replies.recv()
            except (EOFError, OSError):
                self._start_reply = None
            reply = self._start_reply
            self._opened = reply is not None and reply.error is None and reply.error_text is None
            if self._opened:
                self._take(reply)
        if not self._opened and raise_error:
            if self._start_reply is None:
                raise self._ended("start")
            self._take(self._start_reply)  # raises the logger's error
        return bool(self._opened)

    def _take(self, reply: Reply) -> Any:
        """Relay the reply's log records (once), follow its run id; its result, or raise its
        error."""
        records, reply.records = reply.records, []
        for data in records:
            record = logging.makeLogRecord(data)
            handler = logging.getLogger(record.name)
            if handler.isEnabledFor(record.levelno):
                handler.handle(record)
        self.run_id = reply.run_id
        self.tracking_uri = reply.tracking_uri or self.tracking_uri
        if reply.error is None and reply.error_text is None:
            return reply.result
        raise _error_from(reply)

    def _ended(self, method: str) -> MLflowProcessError:
        try:
            status = self.popen.wait(timeout=EXIT_WAIT_S)
        except subprocess.TimeoutExpired:
            status = None
        how = "is not answering" if status is None else f"ended with exit status {status}"
        return MLflowProcessError(
            f"the MLflow process (pid {self.pid}) {how} before answering {method}; its "
            "output is in the run's log (ppoflow.log) or on stderr"
        )


@dataclass
class _Process:
    """A launched MLflow process and this side's ends of its pipes."""

    popen: subprocess.Popen
    requests: Connection
    replies: Connection

    @classmethod
    def launch(cls) -> _Process:
        """``python -c "…serve(R, W)"`` with this process's ``flows`` first on its path."""
        request_read, request_write = os.pipe()
        reply_read, reply_write = os.pipe()
        path = os.environ.get("PYTHONPATH")
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [SOURCE_ROOT, path]))}
        code = f"from flows.sinks.mlflow_process import serve; serve({request_read}, {reply_write})"
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
        requests = Connection(request_write, readable=False)
        return cls(popen, requests, Connection(reply_read, writable=False))

    def end(self) -> None:
        """Close the pipes (the process ends on their end) and reap it."""
        self.requests.close()
        self.replies.close()
        try:
            self.popen.wait(timeout=EXIT_WAIT_S)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait()


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


def serve(request_fd: int, reply_fd: int) -> None:
    """The process's main: import MLflow (at :data:`NICENESS`), take the settings, send stdout
    and stderr to their ``output``, build the logger (:func:`builds_ahead`; else at the first
    request) — all with the cyclic garbage collector off (flows/process/start_up_gc.py) — answer the
    start, then answer each request ``(method, args)`` with the logger's ``method(*args)`` until
    ``close`` or the pipe's end."""
    pause_collector()  # while MLflow is imported and the logger built (flows/process/start_up_gc.py)
    for stop in (signal.SIGINT, signal.SIGTERM):  # the training process closes this one
        signal.signal(stop, signal.SIG_IGN)
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
    replies.send(_reply(logger, records, error=error))
    if error is not None:
        return
    while True:
        try:
            method, args = requests.recv()
        except EOFError:
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
        replies.send(reply)
        if method == "close":
            _exit_now()


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


__all__ = ["MLflowProcessError", "MLflowProcessSink", "serve"]
