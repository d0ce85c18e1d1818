"""One run's metrics fanned out to every sink ``trainer.logger`` lists (stages/metrics/sinks.py).

:func:`open_sinks` builds each listed sink through its registry entry's factory, hands it the
resumed run (if any) and the run's tags, and logs the resolved config once; :class:`MetricSinks`
then gives every sink the same calls:

* ``continue_run(resumed)`` first, for a training resumed from a checkpoint
  (:class:`ResumedRun`): MLflow continues the checkpoint's run and fills in its history
  (flows/sinks/mlflow_logger.py); W&B and TensorBoard ignore it (a resumed W&B run is a new run);
* ``set_tags(tags)`` (flows/runs/identity.py ``run_tags``): MLflow only;
* ``log_params(config)`` once, at the start (MLflow: flattened params and ``config.json``;
  TensorBoard: the config as a text summary; W&B: a no-op, ``wandb.init`` got the config);
* ``log_metrics(metrics, step)``, the same dict for every sink, once per step (the publishing
  thread, flows/sinks/publisher.py) and once for the validation before training (step 0 or N);
* ``log_table(rows, artifact_file)`` for the validation generations, ``log_dict(data,
  artifact_file)`` and ``log_plots(history)`` at the end: MLflow only (W&B and TensorBoard
  ignore them and draw their own charts);
* ``close(status)``, ``"FINISHED"`` or ``"FAILED"``, at the end.

Failures. Outages stay each sink's own business, as in :class:`flows.sinks.mlflow_logger.MLflowLogger`,
which queues what an unreachable store did not take and retries; W&B's service process buffers
and re-sends uploads itself, and offline it only writes local files; TensorBoard writes local
files from its own thread. What does reach the fan-out is therefore not an outage, and it is
treated by when it happens:

* while a sink opens, continues, takes its tags or logs the config: raised, after the sinks already opened are closed as
  ``FAILED``; the setup is wrong, and no step has been computed yet;
* later (a step's metrics, generations, plots): the sink is *retired*. One warning names it, with
  the error's traceback; every other sink still gets this call and each later one, so one broken
  sink neither stops the training nor leaves the others short of a step; the retired sink gets
  no further calls but ``close``; and the metrics it did not receive (the failing step's and each
  later one) are appended to ``<run_dir>/<name>_pending.jsonl``, one row per value in
  ``mlflow_pending.jsonl``'s format (``key``, ``value``, ``step``, ``ts`` in ms), so no computed
  step is lost. A retired sink is not retried: its library already retried what can be, so the
  same call would fail again. This holds for MLflow's request errors too (a bad name), which
  the logger raises instead of queueing. A sink that gave up after its own recovery raises
  :class:`~flows.sinks.contract.SinkGaveUp` (the MLflow process past its restarts,
  flows/sinks/mlflow_process.py): its message already says what failed and what was saved
  where, so the warning is that one line, without a traceback;
* in ``close``: a warning, and the other sinks are still closed.

Example:
    >>> from flows.sinks.contract import SinkDefaults
    >>> class Printer(SinkDefaults):
    ...     def log_metrics(self, metrics, step):
    ...         print(step, dict(metrics))
    ...     def close(self, status="FINISHED"):
    ...         print(status)
    >>> sinks = MetricSinks({"printer": Printer()}, run_dir=None)
    >>> sinks.log_metrics({"critic/score/mean": 0.5}, step=1)
    1 {'critic/score/mean': 0.5}
    >>> sinks.close("FINISHED")
    FINISHED
"""

from __future__ import annotations

import importlib
import logging
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from flows.sinks.contract import MetricSink, ResumedRun, SinkGaveUp
from flows.sinks.pending import append_pending, pending_file
from stages.metrics.sinks import METRIC_SINKS

log = logging.getLogger(__name__)


class MetricSinks:
    """Every sink of a run behind one sink's methods (module docstring: calls and failures).

    Args:
        sinks: sink name (a ``trainer.logger`` entry) → sink.
        run_dir: the local run directory, for the pending files; None = nowhere to save them.
    """

    def __init__(self, sinks: Mapping[str, MetricSink], run_dir: str | None) -> None:
        self.sinks = dict(sinks)
        self.run_dir = None if run_dir is None else Path(run_dir)
        self.retired: dict[str, str] = {}  # name → the error that retired it

    @property
    def run_ids(self) -> dict[str, str]:
        """Sink name → its tracking run's id, for the sinks that have one now."""
        return {name: sink.run_id for name, sink in self.sinks.items() if sink.run_id is not None}

    def open(self, config: Any, tags: Mapping[str, str], resumed: ResumedRun | None = None) -> None:
        """Start every sink: ``continue_run`` (when resumed), ``set_tags``, ``log_params``; an
        error is raised (nothing computed yet)."""
        for sink in self.sinks.values():
            if resumed is not None:
                sink.continue_run(resumed)
            sink.set_tags(tags)
            sink.log_params(config)

    def log_params(self, config: Any) -> None:
        """The resolved config, once, to every sink; an error is raised (nothing computed yet)."""
        for sink in self.sinks.values():
            sink.log_params(config)

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        """``metrics`` at ``step`` to every sink; a failing or retired one gets a pending row."""
        self._each(lambda sink: sink.log_metrics(metrics, step), f"step {step}", (metrics, step))

    def log_table(self, rows: list[Mapping[str, Any]], artifact_file: str) -> None:
        self._each(lambda sink: sink.log_table(rows, artifact_file), artifact_file)

    def log_dict(self, data: Any, artifact_file: str) -> None:
        self._each(lambda sink: sink.log_dict(data, artifact_file), artifact_file)

    def log_text(self, text: str, artifact_file: str) -> None:
        self._each(lambda sink: sink.log_text(text, artifact_file), artifact_file)

    def log_plots(self, history: list[Mapping[str, float]]) -> None:
        self._each(lambda sink: sink.log_plots(history), "the end-of-run plots")

    def close(self, status: str = "FINISHED") -> None:
        """Close every sink, retired ones included; a failing ``close`` is a warning."""
        for name, sink in self.sinks.items():
            try:
                sink.close(status)
            except Exception as err:
                log.warning(
                    "metric sink %r: close(%s) failed: %s",
                    name,
                    status,
                    err,
                    exc_info=not isinstance(err, SinkGaveUp),
                )

    def _each(
        self,
        call: Callable[[MetricSink], Any],
        what: str,
        missed: tuple[Mapping[str, float], int] | None = None,
    ) -> None:
        for name, sink in self.sinks.items():
            if name not in self.retired:
                try:
                    call(sink)
                    continue
                except Exception as err:
                    self._retire(name, what, err)
            if missed is not None:
                self._save_pending(name, *missed)

    def _retire(self, name: str, what: str, err: Exception) -> None:
        self.retired[name] = f"{type(err).__name__}: {err}"
        where = pending_file(self.run_dir, name) if self.run_dir else "nowhere (no run_dir)"
        gave_up = isinstance(err, SinkGaveUp)  # its message is the whole story: one line
        log.warning(
            "metric sink %r failed on %s and is retired for the rest of the run; the other sinks "
            "and the training go on, and the metrics it misses are saved to %s%s",
            name,
            what,
            where,
            f": {err}" if gave_up else "",
            exc_info=None if gave_up else err,
        )

    def _save_pending(self, name: str, metrics: Mapping[str, float], step: int) -> None:
        if self.run_dir is None:
            return
        now = int(time.time() * 1000)
        values = [(key, value, step, now) for key, value in metrics.items()]
        append_pending(pending_file(self.run_dir, name), values)


# --- opening ---------------------------------------------------------------------------------


def start_sinks_ahead(cfg: Any, run_dir: str | None) -> dict[str, MetricSink]:
    """The sinks ``cfg.trainer.logger`` lists whose registry entry ``opens_ahead``, built now
    (their factories called), so that what they set up in the background comes up beside the
    run's start-up phases; :func:`open_sinks` takes them over. Nothing is logged to them yet.
    Close them with ``MetricSinks(started, run_dir).close("FAILED")`` if the run fails to open
    before that."""
    started: dict[str, MetricSink] = {}
    try:
        for name in cfg.trainer.logger:
            spec = METRIC_SINKS.get(name)
            if spec.opens_ahead and spec.factory is not None and name not in started:
                started[name] = import_factory(name, spec.factory)(cfg, run_dir)
    except BaseException:
        MetricSinks(started, run_dir).close("FAILED")
        raise
    return started


def open_sinks(
    cfg: Any,
    run_dir: str | None,
    tags: Mapping[str, str] | None = None,
    resumed: ResumedRun | None = None,
    started: Mapping[str, MetricSink] | None = None,
) -> MetricSinks:
    """The sinks ``cfg.trainer.logger`` lists (those with a factory), started
    (:meth:`MetricSinks.open`: the resumed run, the tags, the config).

    Args:
        cfg: the resolved ``PPORunConfig``.
        run_dir: the local run directory, None when the run store is remote.
        tags: the run's tags (flows/runs/identity.py ``run_tags``); None = none.
        resumed: the checkpoint a resumed training continues from; None for a fresh run.
        started: sinks already built by :func:`start_sinks_ahead`, taken over (closed here
            too if opening fails).
    """
    sinks: dict[str, MetricSink] = dict(started or {})
    try:
        for name in cfg.trainer.logger:
            factory = METRIC_SINKS.get(name).factory
            if factory is not None and name not in sinks:
                sinks[name] = import_factory(name, factory)(cfg, run_dir)
        sinks = {name: sinks[name] for name in cfg.trainer.logger if name in sinks}
        opened = MetricSinks(sinks, run_dir)
        opened.open(cfg, tags or {}, resumed)
    except BaseException:
        MetricSinks(sinks, run_dir).close("FAILED")
        raise
    return opened


def import_factory(name: str, path: str) -> Callable[[Any, str | None], MetricSink]:
    """The function at ``"module:function"`` (a registry entry's factory).

    >>> import_factory("mlflow", "flows.sinks.fanout:open_mlflow_sink").__name__
    'open_mlflow_sink'
    """
    module, _, attr = path.partition(":")
    try:
        return getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as err:
        raise ImportError(
            f"metric sink {name!r}: cannot import its factory {path!r}: {err}"
        ) from err


def open_mlflow_sink(cfg: Any, run_dir: str | None) -> MetricSink:
    """``mlflow``: a deferred :class:`~flows.sinks.mlflow_logger.MLflowLogger` (experiment =
    project_name, run = experiment_name) in a process of its own
    (:class:`flows.sinks.mlflow_process.MLflowProcessSink`), in the store of
    :func:`flows.sinks.mlflow_store.select_tracking_uri`: ``ppoflow.mlflow_tracking_uri``, else
    ``MLFLOW_TRACKING_URI``, else the project store ``<ppoflow.artifact_dir>/mlflow.db``. Its
    run is created (or continued, :meth:`MetricSinks.open`) at the first call. The process
    writes MLflow's own output to the run's log file when the start-up captures the libraries'
    output (flows/process/startup.py). Each call waits at most ``ppoflow.mlflow_call_timeout_s``
    for the process; one that misses it, or dies, is replaced (flows/sinks/mlflow_process.py).
    MLflow's system metrics are sampled every ``ppoflow.mlflow_system_metrics_interval_s``; steps'
    metrics are held up to ``ppoflow.mlflow_metrics_interval_s`` to go to the store together
    (flows/sinks/mlflow_logger.py)."""
    from flows.process.startup import current_startup
    from flows.sinks.mlflow_process import MLflowProcessSink
    from flows.sinks.mlflow_store import select_tracking_uri

    return MLflowProcessSink.start(
        cfg.trainer.project_name,
        cfg.trainer.experiment_name,
        run_dir=run_dir,
        tracking_uri=select_tracking_uri(cfg.ppoflow.mlflow_tracking_uri, cfg.ppoflow.artifact_dir),
        output=current_startup().log_file,  # the run's log while the run starts, if captured
        call_timeout_s=cfg.ppoflow.mlflow_call_timeout_s,
        system_metrics_interval_s=cfg.ppoflow.mlflow_system_metrics_interval_s,
        metrics_interval_s=cfg.ppoflow.mlflow_metrics_interval_s,
    )
