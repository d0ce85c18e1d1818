"""The stop of a health check with action ``stop``: its error and the command line's line for it.
Light on purpose (no torch): the command line imports it to explain the error."""

from __future__ import annotations


class HealthCheckStop(RuntimeError):
    """A check with action ``stop`` tripped; the message is its line and how to go on."""


def stop_error(line: str, step: int) -> HealthCheckStop:
    """The error that ends the run after ``step`` was saved and logged."""
    name = line.removeprefix("health check ").split(":", 1)[0]
    return HealthCheckStop(
        f"{line} — the run stopped after step {step}; fix the cause and resume from the last "
        f"checkpoint, or set ppoflow.health.{name}.action=warn to train on"
    )


def explain_health_stop(err: BaseException) -> str | None:
    """The command line's error line for a health stop: its message as it is."""
    return str(err) if isinstance(err, HealthCheckStop) else None
