"""What a run's MLflow run says, read only: its status and its last validation score.

``ppoflow runs`` asks each run's store (the ``mlflow_tracking_uri`` of its run_info.json) for
its MLflow run: the run's status (``RUNNING``, ``FINISHED``, ``FAILED``, ``KILLED``) and the
validation metrics the train flow logged. The validation score is the one the console prints
after ``validation @ step K: score …`` for a single data source: the mean reward over the
validation samples, logged as ``val-core|val-aux/<data_source>/reward/mean@<N>`` (N the largest
sample count logged for that source); with several data sources it is the mean over sources.

Nothing is created: a SQLite store whose file does not exist is not opened (MLflow would
create it), and an HTTP store gets no retries and a 5 s timeout (MLflow's defaults retry for
minutes), unless ``MLFLOW_HTTP_REQUEST_MAX_RETRIES`` / ``MLFLOW_HTTP_REQUEST_TIMEOUT`` are set. A
store that cannot be read adds one note and its runs show no MLflow status or validation score.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, field
from typing import Any

from stages.metrics.naming import restore_metric_name

SQLITE_PREFIX = "sqlite:///"
HTTP_DEFAULTS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": "5"}
_VAL_REWARD = re.compile(r"val-(?:core|aux)/(?P<source>.+)/reward/mean@(?P<n>\d+)")


@dataclass(frozen=True)
class TrackedRun:
    """One MLflow run as ``ppoflow runs`` shows it: status, last validation score and its step."""

    status: str
    val_score: float | None = None
    val_step: int | None = None


def validation_score(metrics: dict[str, float]) -> tuple[float | None, str | None]:
    """(the validation score, the metric name behind it) from restored metric names (module
    docstring); (None, None) when no validation was logged.

    Example:
        >>> validation_score({"val-aux/demo/reward/mean@1": 0.25, "val-aux/demo/reward/mean@4": 0.5,
        ...                   "val-aux/math/reward/mean@1": 1.0, "critic/score/mean": 0.1})
        (0.75, 'val-aux/demo/reward/mean@4')
        >>> validation_score({"critic/score/mean": 0.1})
        (None, None)
    """
    best: dict[str, tuple[int, str]] = {}
    for name in metrics:
        match = _VAL_REWARD.fullmatch(name)
        if match and int(match["n"]) > best.get(match["source"], (-1, ""))[0]:
            best[match["source"]] = (int(match["n"]), name)
    if not best:
        return None, None
    names = [name for _, name in best.values()]
    return sum(metrics[name] for name in names) / len(names), names[0]


def sqlite_path(tracking_uri: str) -> str | None:
    """The database file of a ``sqlite:///`` URI (query dropped), else None.

    >>> sqlite_path("sqlite:////r/mlflow.db?timeout=1"), sqlite_path("http://h:5000")
    ('/r/mlflow.db', None)
    """
    if not tracking_uri.startswith(SQLITE_PREFIX):
        return None
    return tracking_uri.removeprefix(SQLITE_PREFIX).split("?", 1)[0]


@dataclass
class TrackingLookup:
    """Read-only MLflow lookups, one client per store (module docstring); ``notes`` says which
    stores could not be read and why, one line each."""

    notes: list[str] = field(default_factory=list)
    _clients: dict[str, Any] = field(default_factory=dict)

    def run(self, tracking_uri: str, run_id: str) -> TrackedRun | None:
        """The MLflow run ``run_id`` of the store ``tracking_uri``; None when it cannot be read."""
        try:
            client = self._client(tracking_uri)
            if client is None:
                return None
            found = client.get_run(run_id)
            metrics = {restore_metric_name(k): v for k, v in found.data.metrics.items()}
            score, name = validation_score(metrics)
            step = None
            if name is not None:
                history = client.get_metric_history(run_id, _sanitized(found, name))
                step = max(point.step for point in history)
        except _read_errors() as err:
            if getattr(err, "error_code", None) != "RESOURCE_DOES_NOT_EXIST":
                self._clients[tracking_uri] = None  # unreachable or damaged: not asked again
            self.notes.append(f"MLflow run {run_id} in {tracking_uri}: {_one_line(err)}")
            return None
        if score is not None and not math.isfinite(score):
            score = None
        return TrackedRun(found.info.status, score, step)

    def _client(self, tracking_uri: str) -> Any:
        if tracking_uri in self._clients:
            return self._clients[tracking_uri]
        self._clients[tracking_uri] = None  # a store that fails is tried once
        database = sqlite_path(tracking_uri)
        if database is not None and not os.path.isfile(database):
            self.notes.append(f"MLflow store {tracking_uri}: the database file does not exist")
            return None
        if tracking_uri.startswith(("http://", "https://")):
            for name, value in HTTP_DEFAULTS.items():
                os.environ.setdefault(name, value)
        from mlflow.tracking import MlflowClient

        self._clients[tracking_uri] = MlflowClient(tracking_uri=tracking_uri)
        return self._clients[tracking_uri]


def _read_errors() -> tuple[type[Exception], ...]:
    """What reading a store raises when it is unreachable, damaged or lacks the run: MLflow's
    own errors, the connection's, the database's."""
    from mlflow.exceptions import MlflowException
    from sqlalchemy.exc import SQLAlchemyError

    return (MlflowException, SQLAlchemyError, OSError)


def _sanitized(found: Any, restored: str) -> str:
    """The logged (sanitized) name of the metric whose restored name is ``restored``."""
    return next(k for k in found.data.metrics if restore_metric_name(k) == restored)


def _one_line(err: Exception) -> str:
    return " ".join(str(err).split())[:300]


__all__ = ["TrackedRun", "TrackingLookup", "sqlite_path", "validation_score"]
