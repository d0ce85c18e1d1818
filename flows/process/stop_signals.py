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

A stop is also latched: every stop signal that reaches a handler of ours is recorded before the
handler runs on (:func:`latch_stop_signals`, installed over Prefect's handler for the training
loop), and the loop asks :func:`raise_if_stop_requested` at each step boundary. The exception a
handler raises lands wherever the main thread happens to be; code there that catches
``BaseException`` and goes on (a library's wait loop recording it on a future nobody reads) would
otherwise lose the stop, and the run would train to its end (seen once in CI, on a loaded
machine). With the latch such a stop still ends the run, at the next step boundary.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

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


class StopLatch:
    """The first stop signal that reached a handler of ours since :meth:`clear`."""

    def __init__(self) -> None:
        self.signum: int | None = None

    def record(self, signum: int) -> None:
        if self.signum is None:
            self.signum = signum

    def clear(self) -> None:
        self.signum = None


#: the process's latch (the signal handlers are process-wide too)
LATCH = StopLatch()


def _raise_stopped(signum: int, frame: object) -> None:
    LATCH.record(signum)
    raise RunStopped(signum)


def _latching(previous: Callable[[int, Any], Any]) -> Callable[[int, Any], Any]:
    def handler(signum: int, frame: Any) -> Any:
        LATCH.record(signum)
        return previous(signum, frame)

    return handler


@contextmanager
def latch_stop_signals() -> Iterator[None]:
    """Inside the block every stop signal (:data:`STOP_SIGNALS`) whose handler is a Python
    function is recorded in :data:`LATCH` and then handled as before (Prefect's handler raises
    ``TerminationSignal``, Python's SIGINT handler ``KeyboardInterrupt``); a signal that is
    ignored or left to the operating system is left so. The handlers in place before are
    restored after, and the latch is cleared (a stop that ended the block is carried by its
    exception; a later run in this process starts clear). Outside the main thread the block
    runs as it is."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {signum: signal.getsignal(signum) for signum in STOP_SIGNALS}
    wrapped = {signum: handler for signum, handler in previous.items() if callable(handler)}
    for signum, handler in wrapped.items():
        signal.signal(signum, _latching(handler))
    try:
        yield
    finally:
        for signum, handler in wrapped.items():
            signal.signal(signum, handler)
        LATCH.clear()


def raise_if_stop_requested() -> None:
    """Raise :class:`RunStopped` for the latched stop signal, if one came (module docstring).

    >>> LATCH.clear(); raise_if_stop_requested()  # nothing came: nothing happens
    >>> LATCH.record(signal.SIGTERM)
    >>> raise_if_stop_requested()
    Traceback (most recent call last):
    ...
    flows.process.stop_signals.RunStopped: SIGTERM
    >>> LATCH.clear()
    """
    if LATCH.signum is not None:
        raise RunStopped(LATCH.signum)


@contextmanager
def stop_on_signals() -> Iterator[None]:
    """SIGTERM raises :class:`RunStopped` in the main thread inside the block (module
    docstring); the previous handler is restored after. Outside the main thread (where Python
    cannot set handlers) the block runs as it is."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    LATCH.clear()  # a stop of an earlier command in this process is not this one's
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
    "LATCH",
    "STOP_SIGNALS",
    "RunStopped",
    "StopLatch",
    "exit_code",
    "is_stop",
    "latch_stop_signals",
    "raise_if_stop_requested",
    "signals_deferred",
    "stop_in",
    "stop_line",
    "stop_on_signals",
    "stop_signum",
]
