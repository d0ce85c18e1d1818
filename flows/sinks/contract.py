"""What a metric sink is: the calls the fan-out (flows/sinks/fanout.py) makes on every sink.

:class:`MetricSink` is the protocol, :class:`SinkDefaults` the no-op optional part a sink may
inherit, :class:`ResumedRun` what a training resumed from a checkpoint hands its sinks, and
:class:`SinkGaveUp` the error of a sink that has stopped for good on its own. A module of its own,
so every sink and the fan-out import it and not each other.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass(frozen=True)
class ResumedRun:
    """What a training resumed from a checkpoint tells its sinks (``flows.train.resume``).

    Attributes:
        step: the checkpoint's step N; the training continues at N + 1.
        mlflow_run_id: the MLflow run the checkpoint recorded (None: none was recorded).
        mlflow_tracking_uri: the store that run is in.
        history: step → metrics of the steps ≤ N the checkpoint's run journaled
            (flows/runs/identity.py ``resume_history``), for a sink to fill in what it lacks.
    """

    step: int
    mlflow_run_id: str | None = None
    mlflow_tracking_uri: str | None = None
    history: Mapping[int, Mapping[str, float]] = field(default_factory=dict)


class SinkGaveUp(RuntimeError):
    """Raised by a sink that has stopped for good after the recovery it does itself (the MLflow
    process sink past its restarts, flows/sinks/mlflow_process.py). Its message is the whole
    story in one line: what failed, and where what the sink still held was saved. The fan-out
    retires the sink with that line and no traceback (flows/sinks/fanout.py)."""


class MetricSink(Protocol):
    """What the fan-out calls; ``MLflowLogger`` has it all, :class:`SinkDefaults` the optional part."""

    run_id: str | None  # the tracking run's id, None for a sink without one

    def continue_run(self, resumed: ResumedRun) -> None: ...

    def set_tags(self, tags: Mapping[str, str]) -> None: ...

    def log_params(self, config: Any) -> None: ...

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None: ...

    def log_table(self, rows: list[Mapping[str, Any]], artifact_file: str) -> None: ...

    def log_dict(self, data: Any, artifact_file: str) -> None: ...

    def log_text(self, text: str, artifact_file: str) -> None: ...

    def log_plots(self, history: list[Mapping[str, float]]) -> Any: ...

    def close(self, status: str = "FINISHED") -> None: ...


class SinkDefaults:
    """No run id, and no-op ``continue_run`` / ``set_tags`` / ``log_params`` / ``log_table`` /
    ``log_dict`` / ``log_text`` / ``log_plots``, for a sink without them."""

    run_id: str | None = None

    def continue_run(self, resumed: ResumedRun) -> None:
        return None

    def set_tags(self, tags: Mapping[str, str]) -> None:
        return None

    def log_params(self, config: Any) -> None:
        return None

    def log_table(self, rows: list[Mapping[str, Any]], artifact_file: str) -> None:
        return None

    def log_dict(self, data: Any, artifact_file: str) -> None:
        return None

    def log_text(self, text: str, artifact_file: str) -> None:
        return None

    def log_plots(self, history: list[Mapping[str, float]]) -> None:
        return None


__all__ = ["MetricSink", "ResumedRun", "SinkDefaults", "SinkGaveUp"]
