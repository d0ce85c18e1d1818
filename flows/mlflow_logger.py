"""MLflow logging for a training run that an unreachable tracking server never stops.

* Experiment = ``trainer.project_name``, run name = ``trainer.experiment_name``; with
  ``MLFLOW_RUN_ID`` set (or ``run_id=``) the logger attaches to that run instead of creating one
  (and leaves its status to its owner).
* Tracking URI: the ``tracking_uri`` argument, else ``MLFLOW_TRACKING_URI``, else a SQLite file
  inside the run directory (``<run_dir>/mlflow.db``, artifacts in ``<run_dir>/mlflow-artifacts``).
* Params: the resolved config flattened to dotted keys; a value longer than MLflow's limit
  (6000 characters) is truncated with a note saying so, and the full config is logged as the
  artifact ``config.json``.
* Metrics: one ``log_batch`` per step (20× faster than one call per metric on SQLite), with
  ``step=global_step``. Names are sanitized one-to-one (stages/metrics/naming.py); the mapping
  sanitized → original is the artifact ``metric_names.json`` and each metric's description
  (stages/metrics/catalog.py) is ``metric_descriptions.json``, rewritten when new names appear.
* Plots: :meth:`MLflowLogger.log_plots` renders the end-of-run reward / response length / KL
  plots (flows/plots.py) and logs them as ``plots/<name>.png``.
* Outages: every call goes through a queue. When the server cannot be reached (connection
  refused, timeout, 5xx, a locked SQLite file) the entry stays queued, one warning is logged for
  the outage, and the queue is retried at the next call once ``retry_interval_s`` has passed
  (and at :meth:`close`). Metrics keep the timestamp and step of the moment they were logged.
  Whatever is still queued at close is written to ``<run_dir>/mlflow_pending.jsonl`` with a
  warning. Errors the server reports about the request itself (a bad name, a changed param)
  are raised: they are bugs, not outages.

HTTP stores: MLflow reads its retry and timeout settings from the environment on every request,
with defaults (7 retries with backoff, 120 s timeout) that would stall a training step for
minutes. For ``http(s)`` URIs the logger sets ``MLFLOW_HTTP_REQUEST_MAX_RETRIES=0`` and
``MLFLOW_HTTP_REQUEST_TIMEOUT=5`` unless the user has set them.
"""

from __future__ import annotations

import json
import logging
import math
import os
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from mlflow.entities import Metric, Param
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient
from mlflow.utils.validation import (
    MAX_METRICS_PER_BATCH,
    MAX_PARAM_VAL_LENGTH,
    MAX_PARAMS_TAGS_PER_BATCH,
)

from flows.cache_keys import jsonable
from flows.plots import PlotReport, write_run_plots
from stages.metrics.catalog import describe_metric
from stages.metrics.naming import sanitize_metric_name

log = logging.getLogger(__name__)

NAMES_ARTIFACT = "metric_names.json"
DESCRIPTIONS_ARTIFACT = "metric_descriptions.json"
CONFIG_ARTIFACT = "config.json"
PENDING_FILE = "mlflow_pending.jsonl"
PLOTS_ARTIFACT_DIR = "plots"
TRANSIENT_ERROR_CODES = {"INTERNAL_ERROR", "TEMPORARILY_UNAVAILABLE", "REQUEST_LIMIT_EXCEEDED"}
HTTP_DEFAULTS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": "5"}


def default_tracking_uri(run_dir: str | os.PathLike) -> str:
    """``sqlite:///<abs run_dir>/mlflow.db`` (the directory is created)."""
    if "://" in os.fspath(run_dir):
        raise ValueError(
            f"run_dir {os.fspath(run_dir)!r} is not a local path, so it cannot hold the default "
            "SQLite store; pass tracking_uri or set MLFLOW_TRACKING_URI"
        )
    root = Path(run_dir).absolute()
    root.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{root / 'mlflow.db'}"


def flatten_config(config: Any) -> dict[str, str]:
    """The config as ``{dotted key: value text}``; lists and scalars as JSON text.

    >>> flatten_config({"a": {"b": 1, "c": [1, 2]}, "d": None, "e": "x"})
    {'a.b': '1', 'a.c': '[1, 2]', 'd': 'null', 'e': 'x'}
    """
    flat: dict[str, str] = {}

    def walk(node: Any, prefix: str) -> None:
        if isinstance(node, Mapping) and node:
            for key, value in node.items():
                walk(value, f"{prefix}.{key}" if prefix else str(key))
        else:
            flat[prefix] = node if isinstance(node, str) else json.dumps(node)

    walk(jsonable(config, "config"), "")
    return flat


def truncate_param(value: str, limit: int = MAX_PARAM_VAL_LENGTH) -> str:
    """``value`` cut to ``limit`` characters, ending with a note giving the full length.

    >>> truncate_param("x" * 70, limit=60)
    'xxxxxxxxxxxxxxxx… [truncated from 70 chars; see config.json]'
    """
    if len(value) <= limit:
        return value
    note = f"… [truncated from {len(value)} chars; see {CONFIG_ARTIFACT}]"
    return (value[: max(limit - len(note), 0)] + note)[:limit]


def is_transient(error: BaseException) -> bool:
    """Whether ``error`` means "the store is unreachable now" (queue and retry later)."""
    if isinstance(error, MlflowException):
        return error.error_code in TRANSIENT_ERROR_CODES
    if isinstance(error, ConnectionError | TimeoutError):
        return True
    from requests import RequestException
    from sqlalchemy.exc import OperationalError

    return isinstance(error, RequestException | OperationalError)


def _describe(name: str) -> str:
    try:
        return describe_metric(name)
    except KeyError:
        return "(no description in stages/metrics/catalog.py)"


class MLflowLogger:
    """Logs one training run to MLflow (module docstring); use as a context manager or call close.

    Args:
        project: experiment name (``trainer.project_name``).
        experiment: run name (``trainer.experiment_name``).
        run_dir: the run directory; holds the default SQLite store and the pending-metrics file.
        tracking_uri: overrides ``MLFLOW_TRACKING_URI`` and the default.
        run_id: attach to this run (default: ``MLFLOW_RUN_ID`` when set).
        retry_interval_s: how long to wait after a failure before the next attempt.
    """

    def __init__(
        self,
        project: str,
        experiment: str,
        *,
        run_dir: str | os.PathLike | None = None,
        tracking_uri: str | None = None,
        run_id: str | None = None,
        retry_interval_s: float = 30.0,
    ) -> None:
        uri = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")
        if not uri:
            if run_dir is None:
                raise ValueError("MLflowLogger needs run_dir, tracking_uri or MLFLOW_TRACKING_URI")
            uri = default_tracking_uri(run_dir)
        if uri.startswith(("http://", "https://")):
            for name, value in HTTP_DEFAULTS.items():
                os.environ.setdefault(name, value)
        self.project, self.experiment, self.tracking_uri = project, experiment, uri
        self.run_dir = None if run_dir is None else Path(run_dir)
        self.run_id = run_id or os.environ.get("MLFLOW_RUN_ID") or None
        self._owns_run = self.run_id is None
        self._attached = False
        self._client = MlflowClient(tracking_uri=uri)
        self._queue: list[tuple[str, Any]] = []
        self._names: dict[str, str] = {}  # sanitized → original
        self._names_dirty = False
        self._retry_interval_s = retry_interval_s
        self._next_attempt = 0.0
        self._in_outage = False
        self._drain(force=True)

    # --- public API ---

    @property
    def pending(self) -> int:
        """Number of queued metric values (0 when everything reached the store)."""
        return sum(len(item) for kind, item in self._queue if kind == "metrics")

    def log_params(self, config: Any) -> None:
        """Log the flattened config as params (truncated with a note) and ``config.json``."""
        params = [Param(k, truncate_param(v)) for k, v in flatten_config(config).items()]
        for start in range(0, len(params), MAX_PARAMS_TAGS_PER_BATCH):
            chunk = params[start : start + MAX_PARAMS_TAGS_PER_BATCH]
            self._queue.append(("call", lambda rid, c=chunk: self._client.log_batch(rid, params=c)))
        self.log_dict(jsonable(config, "config"), CONFIG_ARTIFACT)

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        """Log ``metrics`` at ``step`` (one ``log_batch``); names sanitized one-to-one."""
        now = int(time.time() * 1000)
        entries = []
        for name, value in metrics.items():
            safe = sanitize_metric_name(name)
            if safe not in self._names:
                self._names[safe] = name
                self._names_dirty = True
            entries.append(Metric(safe, float(value), now, int(step)))
        self._queue.append(("metrics", entries))
        self._drain()

    def log_dict(self, data: Any, artifact_file: str) -> None:
        """Log JSON data as an artifact file."""
        self._queue.append(("call", lambda rid: self._client.log_dict(rid, data, artifact_file)))
        self._drain()

    def log_text(self, text: str, artifact_file: str) -> None:
        self._queue.append(("call", lambda rid: self._client.log_text(rid, text, artifact_file)))
        self._drain()

    def log_artifact(self, local_path: str | os.PathLike, artifact_path: str | None = None) -> None:
        """Log a local file (a PNG plot, a table) as an artifact."""
        path = os.fspath(local_path)
        self._queue.append(
            ("call", lambda rid: self._client.log_artifact(rid, path, artifact_path))
        )
        self._drain()

    def log_plots(self, history: list[Mapping[str, float]]) -> PlotReport:
        """Render the run's plots from its metric history and log each as ``plots/<file>``.

        ``history`` is one metrics dict per step with ``training/global_step``
        (flows/plots.py). The PNG bytes, not the temporary files, are queued, so plots made
        during an outage are still sent when the store returns. Returns the plots report
        (written and skipped with the reason; each skip is also logged at INFO).
        """
        with tempfile.TemporaryDirectory(prefix="ppoflow-plots-") as tmp:
            report = write_run_plots(history, tmp)
            for name, path in report.written.items():
                data = path.read_bytes()
                self._queue.append(
                    (
                        "call",
                        lambda rid, n=name, d=data: self._upload(rid, n, d, PLOTS_ARTIFACT_DIR),
                    )
                )
        for name, reason in report.skipped.items():
            log.info("MLflow: plot %s not made: %s", name, reason)
        self._drain()
        return report

    def flush(self) -> bool:
        """Try to send everything queued now; True when nothing is left."""
        self._drain(force=True)
        return not self._queue and not self._names_dirty

    def close(self, status: str = "FINISHED") -> None:
        """Flush, save what could not be sent, and end the run (only a run this logger created)."""
        if self.flush() and self._owns_run and self.run_id is not None:
            try:
                self._client.set_terminated(self.run_id, status)
            except Exception as err:
                if not is_transient(err):
                    raise
                log.warning("MLflow: could not mark run %s %s: %s", self.run_id, status, err)
        self._save_pending()

    def __enter__(self) -> MLflowLogger:
        return self

    def __exit__(self, exc_type: Any, *rest: Any) -> None:
        self.close("FAILED" if exc_type is not None else "FINISHED")

    # --- the queue ---

    def _ensure_run(self) -> str:
        if self.run_id is not None and not self._attached:
            self._client.get_run(self.run_id)  # attach: the run must exist
            self._attached = True
        if self.run_id is None:
            self.run_id = self._create_run()
            self._attached = True
        return self.run_id

    def _create_run(self) -> str:
        found = self._client.get_experiment_by_name(self.project)
        if found is not None:
            experiment_id = found.experiment_id
        else:
            experiment_id = self._client.create_experiment(
                self.project, artifact_location=self._artifact_location()
            )
        return self._client.create_run(experiment_id, run_name=self.experiment).info.run_id

    def _artifact_location(self) -> str | None:
        """Beside the SQLite file for a local SQLite store; the server's default otherwise."""
        if not self.tracking_uri.startswith("sqlite:///"):
            return None
        db_file = Path(self.tracking_uri.removeprefix("sqlite:///"))
        return (db_file.parent / "mlflow-artifacts").absolute().as_uri()

    def _next_batch(self) -> tuple[str, Callable[[str], Any], int]:
        """(kind, operation, queue entries it covers); consecutive metric entries are merged."""
        kind, item = self._queue[0]
        if kind == "call":
            return kind, item, 1
        merged, used = [], 0
        for next_kind, entries in self._queue:
            if next_kind != "metrics" or len(merged) + len(entries) > MAX_METRICS_PER_BATCH:
                break
            merged += entries
            used += 1
        if used == 0:  # one entry larger than a batch: send it in parts
            merged, used = entries, 1

        def send(rid: str) -> None:
            for start in range(0, len(merged), MAX_METRICS_PER_BATCH):
                self._client.log_batch(rid, metrics=merged[start : start + MAX_METRICS_PER_BATCH])

        return kind, send, used

    def _drain(self, force: bool = False) -> None:
        if not force and time.monotonic() < self._next_attempt:
            return
        try:
            run_id = self._ensure_run()
            while self._queue:
                _, operation, used = self._next_batch()
                operation(run_id)
                del self._queue[:used]
            if self._names_dirty:
                self._log_names(run_id)
        except Exception as err:
            if not is_transient(err):
                raise
            self._next_attempt = time.monotonic() + self._retry_interval_s
            if not self._in_outage:
                log.warning(
                    "MLflow at %s is unreachable (%s); buffering metrics and retrying every "
                    "%.0f s. Training continues.",
                    self.tracking_uri,
                    err,
                    self._retry_interval_s,
                )
            self._in_outage = True
            return
        if self._in_outage:
            log.info("MLflow at %s is reachable again; buffered data sent", self.tracking_uri)
        self._in_outage = False

    def _upload(self, run_id: str, file_name: str, data: bytes, artifact_path: str) -> None:
        """Log ``data`` as the artifact ``<artifact_path>/<file_name>`` (via a temporary file)."""
        with tempfile.TemporaryDirectory(prefix="ppoflow-artifact-") as tmp:
            path = Path(tmp) / file_name
            path.write_bytes(data)
            self._client.log_artifact(run_id, str(path), artifact_path)

    def _log_names(self, run_id: str) -> None:
        descriptions = {name: _describe(name) for name in self._names.values()}
        self._client.log_dict(run_id, dict(sorted(self._names.items())), NAMES_ARTIFACT)
        self._client.log_dict(run_id, dict(sorted(descriptions.items())), DESCRIPTIONS_ARTIFACT)
        self._names_dirty = False

    def _save_pending(self) -> None:
        lost = [entry for kind, entries in self._queue if kind == "metrics" for entry in entries]
        others = sum(1 for kind, _ in self._queue if kind == "call")
        if not lost and not others:
            return
        where = "nowhere (no run_dir)"
        if self.run_dir is not None and lost:
            target = self.run_dir / PENDING_FILE
            target.parent.mkdir(parents=True, exist_ok=True)
            with target.open("a", encoding="utf-8") as out:
                for metric in lost:
                    value = metric.value if math.isfinite(metric.value) else repr(metric.value)
                    row = {"key": self._names.get(metric.key, metric.key), "value": value}
                    out.write(
                        json.dumps({**row, "step": metric.step, "ts": metric.timestamp}) + "\n"
                    )
            where = str(target)
        self._queue.clear()
        log.warning(
            "MLflow at %s stayed unreachable: %d metric values saved to %s, %d other "
            "calls (params, artifacts) not sent",
            self.tracking_uri,
            len(lost),
            where,
            others,
        )
