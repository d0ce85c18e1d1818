"""What a run does before its first step, in ppoflow's own voice; the libraries' output in a file.

A run opens in phases (model, data, engines, MLflow, Prefect). Each phase, when it ends, prints
one line with its result and its time, and logs the same line at INFO to the flow run's logger
once there is one (``ppoflow: data: 2000 train / 64 val prompts (0.2 s)``), so a deployment's
logs show them too::

    ppoflow 0.1.0 · demo-cpu + 3 overrides · run dir outputs/demo/runs/grpo-tiny-…
      model    qwen2, 2 layers, hidden 64, vocab 40 (outputs/demo/model)  1.2 s
      data     2000 train / 64 val prompts                               0.2 s
      engines  reward: reward_loop                                       0.1 s
      engines  actor: DeepSpeed ZeRO-0, 1 rank, rollout hf               2.0 s
      MLflow   run 6f1c2e0a in sqlite:///outputs/mlflow.db               0.8 s
      Prefect  temporary server up in 6.1 s (started ahead), flow run 'witty-owl'  0.8 s
    ready in 5.6 s · library messages in outputs/demo/runs/grpo-tiny-…/ppoflow.log

The Prefect phase comes last when the command line started Prefect's temporary server ahead (the
run opens while it comes up, flows/cli/train.py ``train_in_phases``), first otherwise (a
configured server, a deployment).

On a terminal a spinner names the phase in progress. A phase that fails prints
``  engines  actor: failed after 0.8 s`` and the error follows from the command.

**Library output** (:class:`OutputToFile`): from the start of :func:`startup_output` until
:meth:`Startup.ready` (the first step), everything written to the process's stdout and stderr
file descriptors goes to the run's log file: Prefect's, DeepSpeed's, MLflow's and alembic's log
lines, transformers' progress bars, DeepSpeed's op-build prints, and the output of the child
processes started meanwhile (Prefect's temporary server, the reward workers), which inherit the
descriptors. It is moved at the descriptor level because these libraries bound their handlers
to ``sys.stdout`` / ``sys.stderr`` at import, and a C++ build writes to fd 1 directly.
ppoflow's own messages stay on the terminal: its loggers' warnings (``flows``, ``stages``,
``dataproto``), its warnings (raised from its packages, e.g. config notices) and
:meth:`Startup.say`. ``--verbose`` (``capture=False``) leaves the output alone.

**Prefect's records** (:func:`prefect_records_to`): for the whole run, not only its start, the
records of Prefect's loggers go to the same file instead of the terminal: a stage that fails
logs ``Task run 'reward-step1' - Finished in state Failed(…)``, a stop signal
``Crash detected!``, and each is said on the terminal by the command's one line (``error: …``,
``stopped by SIGTERM: …``). ``--verbose`` leaves them on the terminal.

Without :func:`startup_output` (a deployment, a test calling the flow), :func:`current_startup`
is a :class:`Startup` that logs its phases and prints only :meth:`Startup.say`'s lines.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
import warnings
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager, redirect_stderr
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from rich.console import Console
from rich.live import Live
from rich.spinner import Spinner

from flows.process.start_up_gc import resume as resume_collector

#: the packages whose loggers and warnings are ppoflow's own (pyproject's packages)
OWN_PACKAGES = ("flows", "stages", "dataproto")
_OWN_DIRS = tuple(str(Path(__file__).resolve().parents[2] / name) + os.sep for name in OWN_PACKAGES)
#: the log file's name in a local run directory
LOG_NAME = "ppoflow.log"

#: the :func:`startup_output` in progress (one per process: it moves the process's fds)
_active: list[Startup] = []


@dataclass
class _Phase:
    name: str
    doing: str
    began: float = field(default_factory=time.perf_counter)


class Startup:
    """The phases of a run's start (module docstring).

    Args:
        console: where the phase lines go (None: nowhere, only the logger).
        logger: where each finished phase is also logged at INFO (settable later: the flow sets
            its run logger when it begins).
        log_file: the file the libraries' output goes to, named in the last line.
    """

    def __init__(
        self,
        console: Console | None = None,
        logger: logging.Logger | logging.LoggerAdapter | None = None,
        log_file: str | None = None,
    ) -> None:
        self.console = console
        self.logger = logger
        self.log_file = log_file
        self.began = time.perf_counter()
        self.capture: OutputToFile | None = None
        self.held = ExitStack()  # what ready() releases: the capture, the own-message routing
        self._open: _Phase | None = None
        self._status: Any = None
        self._ready = False
        #: (run directory, run) opened by the command line before the flow began, until the
        #: flow takes it over (flows/train.py ``open_run_ahead`` / ``take_opened_run``)
        self.opened: tuple[str, Any] | None = None

    @property
    def pending(self) -> str | None:
        """The name of the phase in progress, if any."""
        return None if self._open is None else self._open.name

    def begin(self, name: str, doing: str) -> None:
        """Start phase ``name`` (``doing``: what the spinner says meanwhile); one at a time."""
        if self._open is not None:
            raise RuntimeError(f"start-up phase {self._open.name!r} is still open")
        self._open = _Phase(name, doing)
        if self.console is not None and self.console.is_terminal:
            # not Console.status: its Live sends sys.stdout / sys.stderr to the terminal
            self._status = Live(
                Spinner("dots", f"{name}: {doing} …"),
                console=self.console,
                transient=True,
                redirect_stdout=False,
                redirect_stderr=False,
            )
            self._status.start()

    def end(self, result: str) -> None:
        """End the open phase with its ``result`` text: one line printed and logged."""
        phase = self._take()
        seconds = time.perf_counter() - phase.began
        self._line(phase.name, result, f"{seconds:.1f} s")
        if self.logger is not None:
            self.logger.info("ppoflow: %s: %s (%.1f s)", phase.name, result, seconds)

    def fail(self) -> None:
        """End the open phase as failed (the error itself is the caller's to show)."""
        phase = self._take()
        seconds = time.perf_counter() - phase.began
        self._line(phase.name, f"{phase.doing}: failed after {seconds:.1f} s", "", style="red")

    @contextmanager
    def phase(self, name: str, doing: str) -> Iterator[dict[str, str]]:
        """A phase around a block; the block sets ``result["text"]`` (default: ``doing``)."""
        result = {"text": doing}
        self.begin(name, doing)
        try:
            yield result
        except BaseException:
            self.fail()
            raise
        self.end(result["text"])

    def say(self, text: str) -> None:
        """A line of ppoflow's own (e.g. the checkpoint a run resumes from, a notice), printed
        and logged; printed on stdout also without a console (a notice is never only logged)."""
        console = self.console or Console(highlight=False, soft_wrap=True)
        console.print(f"  {text}" if self.console is not None else text, markup=False)
        if self.logger is not None:
            self.logger.info("ppoflow: %s", text)

    def ready(self) -> None:
        """The run is open: the libraries' output goes back to the terminal, and the cyclic
        garbage collector, if the command line held it off, is on again with the start-up's
        objects frozen (flows/process/start_up_gc.py) (idempotent)."""
        if self._ready:
            return
        self._ready = True
        resume_collector()
        self.held.close()
        seconds = time.perf_counter() - self.began
        where = f" · library messages in {self.log_file}" if self.capture is not None else ""
        if self.console is not None:
            self.console.print(f"ready in {seconds:.1f} s{where}", markup=False)

    def _take(self) -> _Phase:
        if self._open is None:
            raise RuntimeError("no start-up phase is open")
        phase, self._open = self._open, None
        if self._status is not None:
            self._status.stop()
            self._status = None
        return phase

    def _line(self, name: str, text: str, seconds: str, style: str = "") -> None:
        if self.console is not None:
            line = f"  {name:<8} {text}" + (f"  {seconds}" if seconds else "")
            self.console.print(line, style=style, markup=False)


def describe_model(path: str) -> str:
    """``qwen2, 2 layers, hidden 64, vocab 40 (PATH)`` from a model directory's config.json
    (just ``PATH`` when it has none)."""
    try:
        config = json.loads((Path(path) / "config.json").read_text())
    except (OSError, ValueError):
        return str(path)
    fields = [
        config.get("model_type"),
        _field(config, "num_hidden_layers", "{} layers"),
        _field(config, "hidden_size", "hidden {}"),
        _field(config, "vocab_size", "vocab {}"),
    ]
    return ", ".join(f for f in fields if f) + f" ({path})"


def _field(config: dict[str, Any], key: str, form: str) -> str | None:
    return None if config.get(key) is None else form.format(config[key])


def describe_sinks(sinks: Any, project: str) -> str:
    """``run 6f1c2e0a, experiment demo, sqlite:///…/mlflow.db`` for an MLflow sink (its run id
    ``unreachable`` while the store is), then the other sinks' names."""
    from flows.runs.identity import mlflow_identity

    names = [name for name in sinks.sinks if name != "mlflow"]
    parts = []
    if "mlflow" in sinks.sinks:
        identity = mlflow_identity(sinks, project)
        run_id = identity["mlflow_run_id"]
        parts.append(
            f"run {run_id[:8] if run_id else 'unreachable'}, experiment {project!r}, "
            f"{identity['mlflow_tracking_uri']}"
        )
    if names:
        parts.append("also " + ", ".join(names))
    return "; ".join(parts) or "no metric sinks"


def current_startup() -> Startup:
    """The active :func:`startup_output` one, else a new :class:`Startup` that only logs."""
    return _active[-1] if _active else Startup()


def log_file_for(run_dir: str) -> str:
    """``<run_dir>/ppoflow.log`` for a local run directory, else a file in the temp directory
    (the run directory is a URL; the libraries' output cannot be appended there)."""
    if "://" in run_dir and not run_dir.startswith("file://"):
        import tempfile

        handle, path = tempfile.mkstemp(prefix="ppoflow-", suffix=".log")
        os.close(handle)
        return path
    path = Path(run_dir.removeprefix("file://")) / LOG_NAME
    path.parent.mkdir(parents=True, exist_ok=True)
    return str(path)


@contextmanager
def startup_output(header: str, log_file: str, capture: bool = True) -> Iterator[Startup]:
    """The command line's start-up output (module docstring): print ``header``, move the
    libraries' output to ``log_file`` until :meth:`Startup.ready` (not with ``capture=False``),
    and make the :class:`Startup` the one :func:`current_startup` returns."""
    terminal = _terminal_stream(capture)
    console = Console(file=terminal, highlight=False, soft_wrap=True)
    startup = Startup(console, log_file=log_file if capture else None)
    console.print(header, markup=False)
    _active.append(startup)
    try:
        if capture:
            startup.held.enter_context(_own_messages_to(terminal))
            startup.capture = OutputToFile(log_file)
            startup.capture.start()
            startup.held.callback(startup.capture.stop)
        yield startup
    except BaseException:
        if startup.pending is not None:
            startup.fail()
        if startup.capture is not None and not startup._ready:
            startup.held.close()
            console.print(f"library messages: {log_file}", markup=False)
        raise
    finally:
        startup.held.close()
        _active.remove(startup)
        if terminal is not sys.stdout:
            terminal.close()


def _terminal_stream(capture: bool) -> IO[str]:
    """A stream to where stdout goes now, which the capture will not move: a duplicate of fd 1
    when ``sys.stdout`` is it, else ``sys.stdout`` itself (e.g. a test runner's buffer)."""
    if not capture:
        return sys.stdout
    try:
        is_fd_1 = sys.stdout.fileno() == 1
    except (AttributeError, OSError, ValueError):
        is_fd_1 = False
    if not is_fd_1:
        return sys.stdout
    sys.stdout.flush()
    return os.fdopen(os.dup(1), "w", buffering=1, encoding=sys.stdout.encoding or "utf-8")


@contextmanager
def _own_messages_to(terminal: IO[str]) -> Iterator[None]:
    """While the capture is on, ppoflow's warnings and its loggers' WARNING records go to
    ``terminal`` (the records also reach the log file through the usual handlers)."""
    handler = logging.StreamHandler(terminal)
    handler.setLevel(logging.WARNING)
    handler.setFormatter(logging.Formatter("%(levelname)s: %(message)s"))
    loggers = [logging.getLogger(name) for name in OWN_PACKAGES]
    shown = warnings.showwarning

    def show(message, category, filename, lineno, file=None, line=None):
        if file is None and str(filename).startswith(_OWN_DIRS):
            with redirect_stderr(terminal):
                shown(message, category, filename, lineno, None, line)
        else:
            shown(message, category, filename, lineno, file, line)

    for logger in loggers:
        logger.addHandler(handler)
    warnings.showwarning = show
    try:
        yield
    finally:
        warnings.showwarning = shown
        for logger in loggers:
            logger.removeHandler(handler)


#: the loggers whose records :func:`prefect_records_to` moves: "prefect" (the flow and task run
#: loggers, the clients, propagate to it) and the one that does not propagate to it
PREFECT_LOGGERS = ("prefect", "prefect._internal")


def is_prefect_record(record: logging.LogRecord) -> bool:
    """Whether ``record`` comes from one of Prefect's loggers."""
    return record.name == "prefect" or record.name.startswith("prefect.")


class _PrefectOffTerminal(logging.Filter):
    """On a handler that writes to the terminal: drops Prefect's records (they go to the run's
    log file, :func:`prefect_records_to`)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not is_prefect_record(record)


@contextmanager
def prefect_records_to(log_file: str) -> Iterator[None]:
    """Inside, the records of Prefect's loggers (:data:`PREFECT_LOGGERS`) are appended to
    ``log_file`` in Prefect's own format, and the handlers that write to a stream (the terminal:
    Prefect's console handler on the root logger, its debug handler) no longer show them; the
    loggers' levels are left as they are. Restored on the way out."""
    file_handler = logging.FileHandler(log_file, encoding="utf-8", delay=True)
    file_handler.setFormatter(_PrefectFormat())
    loggers = [logging.getLogger(name) for name in PREFECT_LOGGERS]
    off_terminal = _PrefectOffTerminal()
    terminal = [
        handler
        for logger in (logging.getLogger(), *loggers)
        for handler in logger.handlers
        if isinstance(handler, logging.StreamHandler)
        and not isinstance(handler, logging.FileHandler)
    ]
    for handler in terminal:
        handler.addFilter(off_terminal)
    # "prefect" sees every record of the loggers under it that propagate; the others get the
    # handler of their own (Prefect's logging config stops "prefect._internal" propagating)
    loggers = [loggers[0], *(logger for logger in loggers[1:] if not logger.propagate)]
    for logger in loggers:
        logger.addHandler(file_handler)
    try:
        yield
    finally:
        for logger in loggers:
            logger.removeHandler(file_handler)
        for handler in terminal:
            handler.removeFilter(off_terminal)
        file_handler.close()


class _PrefectFormat(logging.Formatter):
    """The formatter of Prefect's console handler (``time | LEVEL | Task run 'name' - text``)
    where there is one, else the same fields by name; a record that the first cannot format (a
    run logger's record without its run's name) gets the second, not a logging error."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s | %(levelname)-7s | %(name)s - %(message)s")
        self.prefects = next(
            (
                handler.formatter
                for handler in logging.getLogger().handlers
                if type(handler).__name__ == "PrefectConsoleHandler"
            ),
            None,
        )

    def format(self, record: logging.LogRecord) -> str:
        if self.prefects is not None:
            try:
                return self.prefects.format(record)
            except (KeyError, ValueError, TypeError):
                pass
        return super().format(record)


class OutputToFile:
    """fds 1 and 2 of this process appended to ``path`` between :meth:`start` and :meth:`stop`
    (module docstring); :meth:`stop` is idempotent."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._saved: tuple[int, int] | None = None

    def start(self) -> None:
        Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        _flush_std()
        with open(self.path, "ab") as log:
            saved = (os.dup(1), os.dup(2))
            os.dup2(log.fileno(), 1)
            os.dup2(log.fileno(), 2)
        self._saved = saved

    def stop(self) -> None:
        if self._saved is None:
            return
        _flush_std()
        out, err = self._saved
        self._saved = None
        os.dup2(out, 1)
        os.dup2(err, 2)
        os.close(out)
        os.close(err)


def _flush_std() -> None:
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        try:
            if stream is not None:
                stream.flush()
        except (OSError, ValueError):
            pass


__all__ = [
    "LOG_NAME",
    "OutputToFile",
    "Startup",
    "current_startup",
    "describe_model",
    "describe_sinks",
    "log_file_for",
    "prefect_records_to",
    "startup_output",
]
