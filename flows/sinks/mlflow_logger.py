"""MLflow logging for a training run that an unreachable tracking server never stops.

* Experiment = ``trainer.project_name``, created as a model-training experiment (tag
  ``mlflow.experimentKind`` = ``custom_model_development``, which MLflow 3's UI opens on runs and
  charts instead of its GenAI traces view; an existing experiment without a kind gets the tag, one
  whose kind a user chose keeps it), run name = ``trainer.experiment_name``; with
  ``MLFLOW_RUN_ID`` set (or ``run_id=``) the logger attaches to that run instead of creating one
  (and leaves its status to its owner). Two runs that create the experiment at once both use it.
* Tracking URI: the ``tracking_uri`` argument, else ``MLFLOW_TRACKING_URI``, else a SQLite file
  in ``run_dir``. The training flow always passes the store of flows/sinks/mlflow_store.py (config key,
  env var, else the project store ``<ppoflow.artifact_dir>/mlflow.db``, artifacts in
  ``<ppoflow.artifact_dir>/mlflow-artifacts``); a local SQLite file is created under a lock, so
  runs starting together do not race MLflow's schema migrations.
* Continuing a run (:meth:`MLflowLogger.continue_run`, a training resumed from a checkpoint):
  the run the checkpoint recorded, when it is in this logger's store, is marked ``RUNNING`` again
  and gets the rest of the steps; otherwise a new run starts. Either way the run's history is
  made whole and kept free of repeats: the steps it already holds (read back from the history of
  ``training/global_step``) are not logged again, and the checkpoint's journaled steps it lacks
  are replayed — so a step whose metrics a ``kill -9`` lost, or one the killed process had logged
  after its last checkpoint, is in the history exactly once (the first values logged stay).
  Params it already holds are not logged again; params whose value changed on resume cannot be
  (MLflow forbids it): they are listed in the tag ``ppoflow.changed_params``, and the resumed
  config is the artifact ``config_resumed_step_<N>.json``.
* Taking over from a logger in a process that died (flows/sinks/mlflow_process.py): the dead
  logger's last :meth:`MLflowLogger.handover` (its run, the tags, the steps a continued run held)
  given to :meth:`MLflowLogger.take_over` of a new deferred logger makes it go on with the same
  run, which it reads back (params, metric names) before anything else; the calls the store may
  lack are then sent again, and :attr:`MLflowLogger.settled` tells when none is left. A metric
  sent again with the timestamp it was first given (``log_metrics(…, timestamp_ms=)``) is the
  same point, which MLflow's store keeps once.
* A run created by a process that died before it answered: a logger given a ``creation_token``
  tags the run it creates with it (``ppoflow.creation_token``, in the same ``create_run`` call),
  and looks for a run with that tag before creating one, so the logger of a replacement process
  goes on with that run instead of starting a second one.
* Pending values (:meth:`MLflowLogger.log_pending`): the rows of a pending file
  (flows/sinks/pending.py) are logged with the step and timestamp they carry, so a value that
  reached the store before is the same point.
* Params: the resolved config flattened to dotted keys; a value longer than MLflow's limit
  (6000 characters) is truncated with a note saying so, and the full config is logged as the
  artifact ``config.json``.
* Metrics: one ``log_batch`` per step (20× faster than one call per metric on SQLite), with
  ``step=global_step``; with ``metrics_interval_s`` > 0, the steps that come sooner than that
  after the first one held are held and sent together, one ``log_batch`` of up to 1000 values
  (MLflow's limit), once the first has waited that long. MLflow's SQL store does much of its
  work once per call (its transaction, the latest-value row of each name), so a call for
  several steps costs less than a call each (bench/README.md, "Side processes"). The caller's
  clock sends them: :attr:`~MLflowLogger.hold_deadline` says when they are due and
  :meth:`~MLflowLogger.send_held` sends them (the MLflow process does,
  flows/sinks/mlflow_process.py); any other call, a step with a metric name not logged before
  (so a run's first step and a new metric show at once), :meth:`~MLflowLogger.flush` and
  :meth:`~MLflowLogger.close` send them first; :attr:`~MLflowLogger.held_calls` counts them.
  Names are sanitized one-to-one (stages/metrics/naming.py); the mapping sanitized → original
  is the artifact ``metric_names.json`` and each metric's description
  (stages/metrics/catalog.py, flows/runs/identity.py) is ``metric_descriptions.json``, rewritten when new names appear,
  together with the run description (tag ``mlflow.note.content``, flows/sinks/run_description.py): a
  header from the run's tags (:meth:`MLflowLogger.set_tags`), a link to the experiment's
  headline charts and a table of what each logged metric measures and its denominator. The
  headline charts are a saved chart view of the experiment (tag
  ``mlflow.sharedViewState.ppoflow-headline``, flows/sinks/headline_view.py), rewritten with the
  description when the run's headline metrics change.
* Tables: :meth:`MLflowLogger.log_table` logs rows with ``MlflowClient.log_table`` (MLflow's
  table artifact, which the UI renders as a table); a file the run already holds is not logged
  again (``log_table`` would append to it), so a resumed run does not repeat a table.
* System metrics: with ``system_metrics_interval_s`` MLflow's own monitor
  (``mlflow.system_metrics``) samples the machine's CPU, memory, disk, network and, where
  ``pynvml`` finds them, GPUs every that many seconds into ``system/*`` metrics of the run (their
  steps count samples, not training steps), from the run's creation (or attachment) to
  :meth:`MLflowLogger.close`; a continued run's samples go on after its last one.
* Plots: :meth:`MLflowLogger.log_plots` renders the end-of-run reward / response length / KL
  plots (flows/sinks/plots.py) and logs them as ``plots/<name>.png``; the first :meth:`log_metrics`
  starts importing the renderer in a background thread (``plots.preload_renderer``), so the
  plots after the last step do not wait for matplotlib's import.
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
import posixpath
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mlflow.entities import Metric, Param, RunTag
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient
from mlflow.utils.validation import (
    MAX_METRICS_PER_BATCH,
    MAX_PARAM_VAL_LENGTH,
    MAX_PARAMS_TAGS_PER_BATCH,
    MAX_TAG_VAL_LENGTH,
)

from flows.jsonable import jsonable
from flows.sinks.headline_view import VIEW_TAG, shared_view_state, view_address, view_tag_value
from flows.sinks.mlflow_store import artifact_location, creation_lock, default_tracking_uri
from flows.sinks.plots import PlotReport, preload_renderer, write_run_plots
from flows.sinks.run_description import NOTE_TAG, describe, description_markdown
from stages.metrics.naming import restore_metric_name, sanitize_metric_name

if TYPE_CHECKING:
    from flows.sinks.contract import ResumedRun

log = logging.getLogger(__name__)

NAMES_ARTIFACT = "metric_names.json"
DESCRIPTIONS_ARTIFACT = "metric_descriptions.json"
CONFIG_ARTIFACT = "config.json"
PENDING_FILE = "mlflow_pending.jsonl"
PLOTS_ARTIFACT_DIR = "plots"
#: the metric whose history says which steps a run holds (every training step logs it)
STEP_METRIC = "training/global_step"
CHANGED_PARAMS_TAG = "ppoflow.changed_params"
#: the tag that names the logger settings a run was created with (module docstring)
CREATION_TOKEN_TAG = "ppoflow.creation_token"
TRANSIENT_ERROR_CODES = {"INTERNAL_ERROR", "TEMPORARILY_UNAVAILABLE", "REQUEST_LIMIT_EXCEEDED"}
HTTP_DEFAULTS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": "5"}
#: the experiment tag MLflow 3's UI reads to choose its view, and the kind a training run is
EXPERIMENT_KIND_TAG, TRAINING_KIND = "mlflow.experimentKind", "custom_model_development"


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


def truncate_tag(value: str, limit: int = MAX_TAG_VAL_LENGTH) -> str:
    """``value`` cut to MLflow's tag length limit, ending with ``…`` when cut.

    >>> truncate_tag("abcdef", limit=4)
    'abc…'
    """
    return value if len(value) <= limit else value[: limit - 1] + "…"


def is_transient(error: BaseException) -> bool:
    """Whether ``error`` means "the store is unreachable now" (queue and retry later)."""
    if isinstance(error, MlflowException):
        return error.error_code in TRANSIENT_ERROR_CODES
    if isinstance(error, ConnectionError | TimeoutError):
        return True
    from requests import RequestException
    from sqlalchemy.exc import OperationalError

    return isinstance(error, RequestException | OperationalError)


def changed_params_text(changed: Mapping[str, tuple[str, str]]) -> str:
    """The ``ppoflow.changed_params`` tag: one ``key: old → new`` line per changed param.

    >>> print(changed_params_text({"trainer.total_training_steps": ("4", "6")}))
    trainer.total_training_steps: 4 → 6
    """
    return "\n".join(f"{key}: {old} → {new}" for key, (old, new) in sorted(changed.items()))


def table_columns(rows: Iterable[Mapping[str, Any]]) -> dict[str, list[Any]]:
    """Rows as columns (every key of any row, in first-seen order; a missing cell is None).

    >>> table_columns([{"step": 1, "output": "a"}, {"step": 1, "score": 0.5}])
    {'step': [1, 1], 'output': ['a', None], 'score': [None, 0.5]}
    """
    rows = list(rows)
    names = dict.fromkeys(name for row in rows for name in row)
    return {name: [row.get(name) for row in rows] for name in names}


class MLflowLogger:
    """Logs one training run to MLflow (module docstring); use as a context manager or call close.

    Args:
        project: experiment name (``trainer.project_name``).
        experiment: run name (``trainer.experiment_name``).
        run_dir: the run directory; holds the pending-metrics file, and the SQLite store when
            neither ``tracking_uri`` nor ``MLFLOW_TRACKING_URI`` names one.
        tracking_uri: overrides ``MLFLOW_TRACKING_URI`` and the default.
        run_id: attach to this run (default: ``MLFLOW_RUN_ID`` when set).
        retry_interval_s: how long to wait after a failure before the next attempt.
        deferred: create (or attach to) the run at the first call instead of now, so that
            :meth:`continue_run` can name an existing run first.
        system_metrics_interval_s: sample the machine's system metrics into the run every this
            many seconds (module docstring); None = none.
        creation_token: tag the run this logger creates with it, and go on with a run that
            holds it already instead of creating one (module docstring); None = always create.
        metrics_interval_s: hold steps' metrics for up to this many seconds and send them
            together (module docstring); 0 = each :meth:`log_metrics` sends at once.
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
        deferred: bool = False,
        system_metrics_interval_s: float | None = None,
        creation_token: str | None = None,
        metrics_interval_s: float = 0.0,
    ) -> None:
        if metrics_interval_s < 0:
            raise ValueError(f"metrics_interval_s must be >= 0, got {metrics_interval_s}")
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
        with creation_lock(uri):  # building the client creates a missing SQLite store
            self._client = MlflowClient(tracking_uri=uri)
        self._queue: list[tuple[str, Any]] = []
        self._names: dict[str, str] = {}  # sanitized → original
        self._names_dirty = False
        self._experiment_id: str | None = None
        # the view this logger last wrote (flows/sinks/headline_view.py), and when it first did
        self._headline_view: dict[str, Any] = {}
        self._headline_created_ms = 0
        self._tags: dict[str, str] = {}
        self._params: dict[str, str] | None = None  # the run's params, read when continuing
        self._held_steps: set[int] = set()  # steps a continued run holds: not logged again
        self._resumed_step: int | None = None
        self._continuing = False  # run_id came from a checkpoint (continue_run)
        self._retry_interval_s = retry_interval_s
        self._next_attempt = 0.0
        self._in_outage = False
        self._renderer_import: threading.Thread | None = None  # started by the first metrics
        self._taken_over = False  # go on with a dead logger's run (take_over)
        self._system_interval_s = system_metrics_interval_s
        self._system_monitor: Any = None  # mlflow.system_metrics' monitor, once the run exists
        self._creation_token = creation_token
        self._metrics_interval_s = float(metrics_interval_s)
        self._held_calls = 0  # the last queued log_metrics calls, held for the interval
        self._held_since: float | None = None  # time.monotonic() when the first was held
        if not deferred:
            self._drain(force=True)

    # --- public API ---

    @property
    def pending(self) -> int:
        """Number of queued metric values (0 when everything reached the store)."""
        return sum(len(item) for kind, item in self._queue if kind == "metrics")

    @property
    def held_calls(self) -> int:
        """How many of the latest :meth:`log_metrics` calls are held for the metrics interval,
        everything before them being in the store; 0 when none is, or when anything else waits
        (an outage, a call that raised, new metric names)."""
        if self._in_outage or self._names_dirty or self._held_calls != len(self._queue):
            return 0
        return self._held_calls

    @property
    def hold_deadline(self) -> float | None:
        """When the held metrics are due (``time.monotonic()``), None when none are held."""
        if self._held_since is None:
            return None
        return self._held_since + self._metrics_interval_s

    def send_held(self) -> None:
        """Send the held metrics now (and whatever is queued with them); an outage keeps them
        queued as for any call."""
        if self._held_calls:
            self._drain()

    @property
    def settled(self) -> bool:
        """Whether everything this logger was given is in the store: nothing queued (an outage,
        or a call that raised), the metric names and descriptions written."""
        return not self._queue and not self._names_dirty

    def handover(self) -> dict[str, Any] | None:
        """What a logger in a new process needs to go on with this one's run (:meth:`take_over`),
        as plain data; None before the run is known (a new logger then starts it itself)."""
        if self.run_id is None:
            return None
        return {
            "run_id": self.run_id,
            "owns_run": self._owns_run,
            "continuing": self._continuing,
            "resumed_step": self._resumed_step,
            "held_steps": sorted(self._held_steps),
            "tags": dict(self._tags),
        }

    def take_over(self, state: Mapping[str, Any]) -> None:
        """Go on with the run of a logger whose process died (its :meth:`handover`): the same run,
        owned as it was (ended by :meth:`close`), the same tags for the run's description, the same
        steps a continued run held already. Call it on a ``deferred`` logger before anything else.
        The run's params and metric names are read back (queued, like any call) so that a config
        logged again adds nothing and the names artifact stays whole; an owned run that was
        ended meanwhile is marked RUNNING again."""
        self.run_id, self._owns_run = state["run_id"], bool(state["owns_run"])
        self._continuing, self._resumed_step = bool(state["continuing"]), state["resumed_step"]
        self._held_steps = {int(step) for step in state["held_steps"]}
        self._tags = {str(k): str(v) for k, v in state["tags"].items()}
        self._taken_over = True
        self._queue.append(("call", self._read_back))

    def continue_run(self, resumed: ResumedRun) -> None:
        """Continue the run a checkpoint recorded, or fill a new run's history (module docstring).

        Call it on a ``deferred`` logger before anything else: then the recorded run, when it
        is in this store, becomes this logger's run (owned: marked RUNNING now, FINISHED or
        FAILED at :meth:`close`). On a logger whose run exists already it only replays. The
        history is read and the missing steps replayed on the queue, so an outage delays them
        like any other call.
        """
        same_store = resumed.mlflow_tracking_uri == self.tracking_uri
        if self._taken_over:
            pass  # sent again to a logger that took over the run: the run is chosen, only replay
        elif self.run_id is None and resumed.mlflow_run_id and same_store:
            self.run_id, self._owns_run, self._continuing = resumed.mlflow_run_id, True, True
        elif resumed.mlflow_run_id:
            log.info(
                "MLflow: the checkpoint's run %s is in %s, this run logs to %s: a new run gets "
                "its steps 1–%d replayed",
                resumed.mlflow_run_id,
                resumed.mlflow_tracking_uri,
                self.tracking_uri,
                resumed.step,
            )
        self._resumed_step = resumed.step
        history = {int(k): dict(v) for k, v in resumed.history.items()}
        self._queue.append(("call", lambda rid: self._catch_up(rid, history)))

    def set_tags(self, tags: Mapping[str, str]) -> None:
        """Set run tags (values cut to MLflow's 8000 characters); they also head the run's
        description, which is rewritten."""
        self._tags.update({str(k): str(v) for k, v in tags.items()})
        batch = [RunTag(key, truncate_tag(value)) for key, value in self._tags.items()]
        self._queue.append(("call", lambda rid: self._client.log_batch(rid, tags=batch)))
        self._names_dirty = True
        self._drain()

    def log_params(self, config: Any) -> None:
        """Log the flattened config as params (truncated with a note) and ``config.json``
        (module docstring: a continued run's changed params)."""
        params = {key: truncate_param(value) for key, value in flatten_config(config).items()}
        data = jsonable(config, "config")
        self._queue.append(("call", lambda rid: self._send_params(rid, params, data)))
        self._drain()

    def log_metrics(
        self, metrics: Mapping[str, float], step: int, timestamp_ms: int | None = None
    ) -> None:
        """Log ``metrics`` at ``step`` (one ``log_batch``); names sanitized one-to-one.
        ``timestamp_ms``: the time they were logged (default now)."""
        if self._renderer_import is None:
            self._renderer_import = preload_renderer()
        now = int(time.time() * 1000) if timestamp_ms is None else int(timestamp_ms)
        entries = []
        for name, value in metrics.items():
            safe = sanitize_metric_name(name)
            if safe not in self._names:
                self._names[safe] = name
                self._names_dirty = True
            entries.append(Metric(safe, float(value), now, int(step)))
        self._queue.append(("metrics", entries))
        if self._holds():
            self._held_calls += 1
            if self._held_since is None:
                self._held_since = time.monotonic()
            return
        self._drain()

    def _holds(self) -> bool:
        """Whether the metrics just queued wait: an interval is set, everything queued before
        them is held metrics, no new name came, no outage, and the first held has not waited
        the interval yet."""
        if self._metrics_interval_s <= 0 or self._names_dirty or self._in_outage:
            return False
        if self._held_calls != len(self._queue) - 1:
            return False
        deadline = self.hold_deadline
        return deadline is None or time.monotonic() < deadline

    def log_pending(self, rows: Iterable[tuple[str, float | str, int, int]]) -> None:
        """Log pending-file rows ``(key, value, step, ts_ms)`` (a non-finite value as its
        ``repr``) at their own steps and timestamps (module docstring)."""
        by_step: dict[tuple[int, int], list[Metric]] = {}
        for key, value, step, ts in rows:
            safe = sanitize_metric_name(key)
            if safe not in self._names:
                self._names[safe] = key
                self._names_dirty = True
            metric = Metric(safe, float(value), int(ts), int(step))
            by_step.setdefault((int(step), int(ts)), []).append(metric)
        for entries in by_step.values():
            self._queue.append(("metrics", entries))
        self._drain()

    def log_dict(self, data: Any, artifact_file: str) -> None:
        """Log JSON data as an artifact file."""
        self._queue.append(("call", lambda rid: self._client.log_dict(rid, data, artifact_file)))
        self._drain()

    def log_table(self, rows: list[Mapping[str, Any]], artifact_file: str) -> None:
        """Log rows as MLflow's table artifact ``artifact_file`` (``.json``), unless the run
        already holds that file (module docstring)."""
        columns = table_columns(rows)
        self._queue.append(("call", lambda rid: self._send_table(rid, columns, artifact_file)))
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
        (flows/sinks/plots.py). The PNG bytes, not the temporary files, are queued, so plots made
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

    def warm_up(self) -> None:
        """One read-only request (the experiment by name), so that the store's lazy set-up on its
        first query (SQLAlchemy configures its mappers) is paid now, not
        by the first call that logs. An unreachable store is left for that call to report."""
        try:
            self._client.get_experiment_by_name(self.project)
        except Exception as err:
            if not is_transient(err):
                raise

    def flush(self) -> bool:
        """Try to send everything queued now; True when nothing is left."""
        self._drain(force=True)
        return not self._queue and not self._names_dirty

    def close(self, status: str = "FINISHED") -> None:
        """Flush, save what could not be sent, and end the run (only a run this logger created
        or continued)."""
        self._stop_system_metrics()
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

    # --- the run ---

    def _ensure_run(self) -> str:
        if self.run_id is not None and not self._attached:
            if self._continuing:
                self.run_id = self._continuable(self.run_id)
            else:
                self._client.get_run(self.run_id)  # attach: the run must exist
            self._attached = True
        if self.run_id is None:
            self.run_id = self._create_run()
            self._attached = True
        if self._system_monitor is None and self._system_interval_s is not None:
            self._start_system_metrics(self.run_id)
        return self.run_id

    def _start_system_metrics(self, run_id: str) -> None:
        from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

        self._system_monitor = SystemMetricsMonitor(
            run_id,
            sampling_interval=self._system_interval_s,
            resume_logging=True,  # a continued run (or a replaced process) goes on after its last
            tracking_uri=self.tracking_uri,
        )
        self._system_monitor.start()

    def _stop_system_metrics(self) -> None:
        monitor, self._system_monitor = self._system_monitor, None
        if monitor is not None:
            try:
                monitor.finish()
            except Exception as err:  # the store went away: the training's own metrics matter
                log.warning("MLflow: system metrics did not stop cleanly: %s", err)

    def _continuable(self, run_id: str) -> str | None:
        """``run_id`` when the store still has it (not deleted), else None (a new run)."""
        try:
            run = self._client.get_run(run_id)
        except MlflowException as err:
            if err.error_code != "RESOURCE_DOES_NOT_EXIST":
                raise
            run = None
        if run is not None and run.info.lifecycle_stage != "deleted":
            return run_id
        log.warning(
            "MLflow: the checkpoint's run %s is not in %s (deleted?); a new run continues it",
            run_id,
            self.tracking_uri,
        )
        self._continuing = False
        return None

    def _create_run(self) -> str:
        found = self._client.get_experiment_by_name(self.project)
        if found is None:
            try:
                self._client.create_experiment(
                    self.project,
                    artifact_location=artifact_location(self.tracking_uri),
                    tags={EXPERIMENT_KIND_TAG: TRAINING_KIND},
                )
            except MlflowException as err:  # another run created it a moment ago
                if err.error_code != "RESOURCE_ALREADY_EXISTS":
                    raise
            found = self._client.get_experiment_by_name(self.project)
        if not found.tags.get(EXPERIMENT_KIND_TAG):
            self._client.set_experiment_tag(found.experiment_id, EXPERIMENT_KIND_TAG, TRAINING_KIND)
        if self._creation_token is None:
            return self._client.create_run(
                found.experiment_id, run_name=self.experiment
            ).info.run_id
        created = self._created_before(found.experiment_id)
        if created is not None:
            return created
        tags = {CREATION_TOKEN_TAG: self._creation_token}
        run = self._client.create_run(found.experiment_id, run_name=self.experiment, tags=tags)
        return run.info.run_id

    def _created_before(self, experiment_id: str) -> str | None:
        """The run of this experiment tagged with this logger's creation token (created by a
        logger whose process died before it answered), read back as :meth:`take_over` does; None
        when there is none."""
        found = self._client.search_runs(
            [experiment_id],
            filter_string=f"tags.`{CREATION_TOKEN_TAG}` = '{self._creation_token}'",
            max_results=1,
        )
        if not found:
            return None
        run_id = found[0].info.run_id
        self._read_back(run_id)
        log.info(
            "MLflow: run %s was created by a process that ended before it answered; this one "
            "goes on with it",
            run_id,
        )
        return run_id

    def _catch_up(self, run_id: str, history: dict[int, dict[str, float]]) -> None:
        """Mark a continued run RUNNING, read what it holds, replay the steps it lacks."""
        run = self._client.get_run(run_id)
        if self._owns_run and run.info.status != "RUNNING":
            self._client.update_run(run_id, status="RUNNING")
        self._params = dict(run.data.params)
        for safe in run.data.metrics:
            self._names.setdefault(safe, restore_metric_name(safe))
        held = {point.step for point in self._client.get_metric_history(run_id, STEP_METRIC)}
        missing = [step for step in sorted(history) if step not in held]
        for step in missing:
            now = int(time.time() * 1000)
            entries = []
            for name, value in history[step].items():
                safe = sanitize_metric_name(name)
                self._names.setdefault(safe, name)
                entries.append(Metric(safe, float(value), now, step))
            for start in range(0, len(entries), MAX_METRICS_PER_BATCH):
                chunk = entries[start : start + MAX_METRICS_PER_BATCH]
                self._client.log_batch(run_id, metrics=chunk)
        self._held_steps = held | set(missing)
        self._names_dirty = True
        log.info(
            "MLflow: run %s continues after step %s; it held %d steps, %d replayed from the "
            "journals (%s)",
            run_id,
            self._resumed_step,
            len(held),
            len(missing),
            missing or "none",
        )

    def _read_back(self, run_id: str) -> None:
        """What a logger that took over a run reads first (:meth:`take_over`)."""
        run = self._client.get_run(run_id)
        if self._owns_run and run.info.status != "RUNNING":
            self._client.update_run(run_id, status="RUNNING")
        self._params = dict(run.data.params)
        for safe in run.data.metrics:
            self._names.setdefault(safe, restore_metric_name(safe))

    def _send_params(self, run_id: str, params: dict[str, str], config: Any) -> None:
        known = self._params or {}
        new = [Param(key, value) for key, value in params.items() if key not in known]
        changed = {
            key: (known[key], value)
            for key, value in params.items()
            if key in known and known[key] != value
        }
        for start in range(0, len(new), MAX_PARAMS_TAGS_PER_BATCH):
            self._client.log_batch(run_id, params=new[start : start + MAX_PARAMS_TAGS_PER_BATCH])
        if changed:
            self._client.set_tag(
                run_id, CHANGED_PARAMS_TAG, truncate_tag(changed_params_text(changed))
            )
        artifact = CONFIG_ARTIFACT
        if self._continuing:
            artifact = f"config_resumed_step_{self._resumed_step}.json"
        self._client.log_dict(run_id, config, artifact)

    def _send_table(self, run_id: str, columns: dict[str, list[Any]], artifact_file: str) -> None:
        folder = posixpath.dirname(artifact_file) or None
        if any(item.path == artifact_file for item in self._client.list_artifacts(run_id, folder)):
            log.info("MLflow: run %s holds %s already; not logged again", run_id, artifact_file)
            return
        self._client.log_table(run_id, data=columns, artifact_file=artifact_file)

    # --- the queue ---

    def _next_batch(self) -> tuple[str, Callable[[str], Any], int]:
        """(kind, operation, queue entries it covers); consecutive metric entries are merged,
        and a step a continued run holds already is left out."""
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
            fresh = [metric for metric in merged if metric.step not in self._held_steps]
            for start in range(0, len(fresh), MAX_METRICS_PER_BATCH):
                self._client.log_batch(rid, metrics=fresh[start : start + MAX_METRICS_PER_BATCH])

        return kind, send, used

    def _drain(self, force: bool = False) -> None:
        if not force and time.monotonic() < self._next_attempt:
            return
        self._held_calls, self._held_since = 0, None  # sent now, or kept by an outage or error
        try:
            run_id = self._ensure_run()
            while self._queue:
                _, operation, used = self._next_batch()
                operation(run_id)
                del self._queue[:used]
            if self._names_dirty:
                self._log_descriptions(run_id)
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
        self._in_outage, self._next_attempt = False, 0.0

    def _upload(self, run_id: str, file_name: str, data: bytes, artifact_path: str) -> None:
        """Log ``data`` as the artifact ``<artifact_path>/<file_name>`` (via a temporary file)."""
        with tempfile.TemporaryDirectory(prefix="ppoflow-artifact-") as tmp:
            path = Path(tmp) / file_name
            path.write_bytes(data)
            self._client.log_artifact(run_id, str(path), artifact_path)

    def _log_descriptions(self, run_id: str) -> None:
        """The name mapping, each name's description and the run description (module doc)."""
        descriptions = {name: describe(name) for name in self._names.values()}
        self._client.log_dict(run_id, dict(sorted(self._names.items())), NAMES_ARTIFACT)
        self._client.log_dict(run_id, dict(sorted(descriptions.items())), DESCRIPTIONS_ARTIFACT)
        address = self._write_headline_view(run_id)
        note = description_markdown(
            self._names.values(), self._tags, self.experiment, headline_address=address
        )
        self._client.set_tag(run_id, NOTE_TAG, note)
        self._names_dirty = False

    def _write_headline_view(self, run_id: str) -> str | None:
        """The experiment's headline chart view for this run's metric names
        (flows/sinks/headline_view.py), written when it changed; its address, or None while no
        headline metric is logged."""
        view = shared_view_state(self._names)
        if not view["compareRunCharts"]:
            return None
        if self._experiment_id is None:
            self._experiment_id = self._client.get_run(run_id).info.experiment_id
        if view != self._headline_view:
            now_ms = int(time.time() * 1000)
            self._headline_created_ms = self._headline_created_ms or now_ms
            tag = view_tag_value(view, self._headline_created_ms, now_ms)
            self._client.set_experiment_tag(self._experiment_id, VIEW_TAG, tag)
            self._headline_view = view
        return view_address(self._experiment_id)

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


__all__ = [
    "MLflowLogger",
    "default_tracking_uri",
    "flatten_config",
    "is_transient",
    "truncate_param",
]
