"""SIGTERM and SIGINT end a training cleanly, at a safe point, and say how to resume.

During a flow run, Prefect's engine turns SIGTERM into ``TerminationSignal`` raised in the flow
(so ``finally`` blocks run: the engines, the reward workers, Ray and vLLM are closed, the MLflow
run is ended ``KILLED``) and, after the flow has unwound, sends the signal again to the handler
that was installed before it. With Python's default handler that second signal kills the
process on the spot: no ``atexit``, so Prefect's temporary server is left running as an orphan.
:func:`stop_on_signals` installs the handler that is there before the flow: it raises
:class:`RunStopped`, which the command line turns into one line and exit status 128 + signal
(143 for SIGTERM, 130 for SIGINT) while the interpreter exits normally and stops the server.
SIGINT raises ``KeyboardInterrupt`` in the flow, which unwinds the same way.

Safe points: artifacts and checkpoints are written to a temporary name and renamed, so a stop
leaves each one complete or absent. A checkpoint that is being written when the signal comes is
finished first (:func:`signals_deferred` holds the signal until the block ends), so a stop
during a due checkpoint does not lose it. The same holds for the signal by which the loss of
Prefect's temporary server stops a run (:data:`DEFERRED_SIGNALS`, flows/process/server_guard.py).
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
#: held by :func:`signals_deferred`: the stop signals and the server guard's (SIGURG,
#: flows/process/server_guard.py ``SIGNAL``; ignored by default, so holding it changes nothing
#: where no guard is on)
DEFERRED_SIGNALS = (*STOP_SIGNALS, signal.SIGURG)


class RunStopped(BaseException):
    """A stop signal reached the command line after the flow unwound (module docstring)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _raise_stopped(signum: int, frame: object) -> None:
    raise RunStopped(signum)


@contextmanager
def stop_on_signals() -> Iterator[None]:
    """SIGTERM raises :class:`RunStopped` in the main thread inside the block (module
    docstring); the previous handler is restored after. Outside the main thread (where Python
    cannot set handlers) the block runs as it is."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _raise_stopped)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextmanager
def signals_deferred() -> Iterator[None]:
    """Hold SIGTERM and SIGINT (and the server guard's signal, :data:`DEFERRED_SIGNALS`) until
    the block ends, then deliver the first one that came to the handler in place before
    (outside the main thread: no holding)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received: list[int] = []
    previous = {
        signum: signal.signal(signum, lambda s, _: received.append(s))
        for signum in DEFERRED_SIGNALS
    }
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        if received:
            os.kill(os.getpid(), received[0])


def stop_in(err: BaseException) -> BaseException | None:
    """The stop signal's exception that ``err`` is, or was raised while handling (its
    ``__cause__`` / ``__context__`` chain): :class:`RunStopped`, ``KeyboardInterrupt`` or
    Prefect's ``TerminationSignal``; None when there is none.

    The chain matters because a signal can land while Prefect's task engine is still creating
    a task run: its crash handler then fails on the missing run (``ValueError: Task run is not
    set``), and that error, not the signal's, is what comes out of the flow.

    >>> try:
    ...     try:
    ...         raise RunStopped(15)
    ...     except RunStopped:
    ...         raise ValueError("Task run is not set")
    ... except ValueError as err:
    ...     stop_in(err)
    RunStopped('SIGTERM')
    >>> stop_in(ValueError("no signal")) is None
    True
    """
    from prefect.exceptions import TerminationSignal

    seen: set[int] = set()
    current: BaseException | None = err
    while current is not None and id(current) not in seen:
        if isinstance(current, RunStopped | KeyboardInterrupt | TerminationSignal):
            return current
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return None


def is_stop(err: BaseException) -> bool:
    """Whether ``err`` is, or was raised while handling, a stop signal's exception
    (:func:`stop_in`)."""
    return stop_in(err) is not None


def stop_signum(err: BaseException) -> int:
    """The signal behind :func:`stop_in` of ``err``: the signal a :class:`RunStopped` or a
    ``TerminationSignal`` carries, SIGINT for ``KeyboardInterrupt``."""
    stopped = stop_in(err)
    if isinstance(stopped, RunStopped):
        return stopped.signum
    return getattr(stopped, "signal", None) or signal.SIGINT


def stop_line(stopped: BaseException, run_dir: str, checkpoint_step: int | None) -> str:
    """The one line of a stopped training: what stopped it, what is kept, how to go on.

    >>> stop_line(RunStopped(15), "/runs/r", 4)
    'stopped by SIGTERM: the checkpoint of step 4 is kept; continue with `ppoflow resume /runs/r`'
    >>> stop_line(KeyboardInterrupt(), "/runs/r", None)
    'stopped by SIGINT before the first checkpoint (trainer.save_freq): nothing to resume'
    """
    name = signal.Signals(stop_signum(stopped)).name
    if checkpoint_step is None:
        return (
            f"stopped by {name} before the first checkpoint (trainer.save_freq): nothing to resume"
        )
    return (
        f"stopped by {name}: the checkpoint of step {checkpoint_step} is kept; "
        f"continue with `ppoflow resume {run_dir}`"
    )


def exit_code(stopped: BaseException) -> int:
    """128 + the signal (:func:`stop_signum`): 143 for SIGTERM, 130 for SIGINT."""
    return 128 + stop_signum(stopped)


__all__ = [
    "DEFERRED_SIGNALS",
    "STOP_SIGNALS",
    "RunStopped",
    "exit_code",
    "is_stop",
    "signals_deferred",
    "stop_in",
    "stop_line",
    "stop_on_signals",
    "stop_signum",
]
