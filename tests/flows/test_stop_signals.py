"""flows/process/stop_signals.py: which errors are a stop signal's, and the exit status and line they get."""

from __future__ import annotations

import signal

import pytest
from prefect.exceptions import TerminationSignal

from flows.process.stop_signals import RunStopped, exit_code, is_stop, stop_line


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
