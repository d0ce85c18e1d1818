"""flows/process/stop_signals.py: which errors are a stop signal's, and the exit status and line they get."""

from __future__ import annotations

import os
import signal
import time

import pytest
from prefect.exceptions import TerminationSignal

from flows.process.stop_signals import (
    LATCH,
    RunStopped,
    exit_code,
    is_stop,
    latch_stop_signals,
    raise_if_stop_requested,
    stop_line,
    stop_on_signals,
)


def raised_while_handling(stop: BaseException) -> BaseException:
    """What Prefect's task engine raises when a signal lands before its task run exists."""
    try:
        try:
            raise stop
        except BaseException:
            raise ValueError("Task run is not set")  # noqa: B904  # as Prefect does
    except ValueError as err:
        return err


@pytest.mark.parametrize(
    ("stop", "status", "name"),
    [
        (RunStopped(signal.SIGTERM), 143, "SIGTERM"),
        (TerminationSignal(signal.SIGTERM), 143, "SIGTERM"),
        (KeyboardInterrupt(), 130, "SIGINT"),
    ],
)
def test_a_stop_and_an_error_raised_while_handling_it_end_the_same_way(stop, status, name):
    for err in (stop, raised_while_handling(stop)):
        assert is_stop(err)
        assert exit_code(err) == status
        assert stop_line(err, "/runs/r", 4).startswith(
            f"stopped by {name}: the checkpoint of step 4"
        )


def test_an_error_without_a_signal_behind_it_is_no_stop():
    try:
        try:
            raise KeyError("a")
        except KeyError:
            raise ValueError("b")  # noqa: B904
    except ValueError as err:
        assert not is_stop(err)


def test_a_stop_whose_exception_was_swallowed_is_still_raised_at_the_next_boundary():
    """Prefect's handler raises where the main thread happens to be; code there that catches
    ``BaseException`` and goes on must not lose the stop (flows/process/stop_signals.py)."""

    def prefects(signum, frame):
        raise TerminationSignal(signum)

    LATCH.clear()
    previous = signal.signal(signal.SIGTERM, prefects)
    try:
        with latch_stop_signals():
            swallowed = None
            try:
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(1)  # the handler runs here, in the main thread
            except BaseException as err:  # a library swallowing it
                swallowed = err
            assert isinstance(swallowed, TerminationSignal), "the earlier handler did not run"
            with pytest.raises(RunStopped) as stopped:
                raise_if_stop_requested()
        assert stopped.value.signum == signal.SIGTERM
        assert LATCH.signum is None  # cleared with the block: a later run starts clear
        assert exit_code(stopped.value) == 143
        assert signal.getsignal(signal.SIGTERM) is prefects  # restored
    finally:
        signal.signal(signal.SIGTERM, previous)
        LATCH.clear()


def test_an_ignored_signal_stays_ignored_and_nothing_is_latched():
    LATCH.clear()
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with latch_stop_signals():
            assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.2)
        raise_if_stop_requested()  # nothing latched: no exception
    finally:
        signal.signal(signal.SIGINT, previous)


def test_the_command_lines_handler_latches_too_and_a_new_command_starts_clear():
    LATCH.record(signal.SIGINT)  # an earlier command's stop in this process
    with stop_on_signals():
        assert LATCH.signum is None
        with pytest.raises(RunStopped):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(1)
        assert LATCH.signum == signal.SIGTERM
    LATCH.clear()
