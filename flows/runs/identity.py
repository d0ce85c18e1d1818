"""Who a training run is, across resumes and re-run branches: what run_info.json, the MLflow tags
and each checkpoint record about it, and the history a resume replays.

* :func:`config_digest`: sha256 of the canonical config JSON (sorted keys, no spaces), the
  ``ppoflow.config_digest`` tag; two runs with the same digest ran the same resolved config.
* :func:`run_tags`: the tags of every training run's MLflow run — ``ppoflow.version``,
  ``ppoflow.commit`` (when run from a git checkout), ``ppoflow.run_dir``,
  ``ppoflow.config_digest`` and, for a resumed run, ``ppoflow.resumed_from_step``.
* :func:`run_info`: the data of ``<run dir>/run_info.json`` (``RunStore.save_run_info``):
  ``mlflow_run_id``, ``mlflow_tracking_uri``, ``mlflow_experiment`` (None without an MLflow
  sink, or while the store is unreachable), the run directory, the working directory the run
  started in (``ppoflow resume`` runs from there, so relative config paths mean the same), the
  config digest, the version and commit, and the step it last resumed from.
* :data:`CACHE_HITS` ``ppoflow/cache_hits``: a metric of every step (``flows.train.step_metrics``),
  the number of the step's stages taken from the cache (:func:`cache_hits`), described in
  :data:`FLOW_METRICS`. A metric, not a
  tag, because it changes per step: a resumed or retrained step shows its hits where they
  happened. ``ppoflow rerun`` leaves it out of its metric diff (flows/rerun.py), since a branch
  hits the cache by design.
* :func:`resume_history`: step → metrics of the steps a checkpoint's run journaled up to the
  checkpoint step, which a resume replays into the MLflow run where it lacks them.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Iterable, Mapping
from typing import Any

from flows.jsonable import jsonable
from flows.runs.store import RUN_INFO_REQUIRED, RunStore, StageRecord
from flows.sinks.flow_metrics import CACHE_HITS, FLOW_METRICS
from flows.version import ppoflow_version, source_commit

log = logging.getLogger(__name__)

#: the keys of run_info.json that other commands (``ppoflow runs``) read; always present
RUN_INFO_KEYS = RUN_INFO_REQUIRED


def config_digest(config: Any) -> str:
    """sha256 hex digest of the config's canonical JSON (sorted keys, ``,``/``:`` separators).

    >>> config_digest({"b": 1, "a": [1.5, None]}) == config_digest({"a": [1.5, None], "b": 1})
    True
    >>> config_digest({})[:12]
    '44136fa355b3'
    """
    text = json.dumps(jsonable(config, "config"), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def cache_hits(records: Iterable[StageRecord]) -> float:
    """How many of the step's stage records are cache hits (status ``cached``).

    >>> cache_hits([StageRecord("rollout", "cached", "cache hit"),
    ...             StageRecord("reward", "ran", "cache miss")])
    1.0
    """
    return float(sum(record.status == "cached" for record in records))


def run_tags(config: Any, run_dir: str, resumed_from_step: int | None = None) -> dict[str, str]:
    """The MLflow tags of a training run (module docstring).

    >>> tags = run_tags({"a": 1}, "/runs/r1", resumed_from_step=4)
    >>> tags["ppoflow.run_dir"], tags["ppoflow.resumed_from_step"], "ppoflow.version" in tags
    ('/runs/r1', '4', True)
    """
    tags = {
        "ppoflow.version": ppoflow_version(),
        "ppoflow.run_dir": str(run_dir),
        "ppoflow.config_digest": config_digest(config),
    }
    commit = source_commit()
    if commit is not None:
        tags["ppoflow.commit"] = commit
    if resumed_from_step is not None:
        tags["ppoflow.resumed_from_step"] = str(resumed_from_step)
    return tags


def run_info(
    config: Any,
    run_dir: str,
    mlflow: Mapping[str, str | None],
    resumed_from_step: int | None = None,
) -> dict[str, Any]:
    """The data of run_info.json (module docstring); ``mlflow`` holds :data:`RUN_INFO_KEYS`."""
    missing = [key for key in RUN_INFO_KEYS if key not in mlflow]
    if missing:
        raise KeyError(f"run_info needs the MLflow keys {list(RUN_INFO_KEYS)}; missing {missing}")
    return {
        **{key: mlflow[key] for key in RUN_INFO_KEYS},
        "run_dir": str(run_dir),
        "working_dir": os.getcwd(),
        "config_digest": config_digest(config),
        "ppoflow_version": ppoflow_version(),
        "ppoflow_commit": source_commit(),
        "resumed_from_step": resumed_from_step,
    }


def mlflow_identity(sinks: Any, project: str) -> dict[str, str | None]:
    """:data:`RUN_INFO_KEYS` of a run's MLflow sink (flows/sinks/fanout.py ``MetricSinks``):
    its run id (None while the store was unreachable), store and experiment; all None when
    ``trainer.logger`` lists no MLflow sink."""
    sink = sinks.sinks.get("mlflow")
    if sink is None:
        return dict.fromkeys(RUN_INFO_KEYS)
    return {
        "mlflow_run_id": sink.run_id,
        "mlflow_tracking_uri": sink.tracking_uri,
        "mlflow_experiment": project,
    }


def step_record_metrics(store: RunStore, step: int) -> dict[str, float] | None:
    """The metrics of the finished, readable journal of ``step``, else None."""
    journal = store.previous_journal(step)
    if journal is None or journal.status != "done" or not journal.metrics:
        return None
    return dict(journal.metrics)


def resume_history(
    origin: str | None, step: int, step_metrics: Mapping[str, float] | None
) -> dict[int, dict[str, float]]:
    """step → metrics of the steps ≤ ``step`` that the run at ``origin`` journaled (module
    docstring), oldest first.

    Step ``step`` (the checkpoint's) takes ``step_metrics`` when the checkpoint recorded them:
    those are the metrics as published, validation metrics included, which the journal lacks.
    An earlier step that is missing from the MLflow run (lost in an outage) gets its journal's
    metrics, without validation metrics. ``origin`` None or unreadable: only ``step_metrics``.
    """
    history: dict[int, dict[str, float]] = {}
    if origin is not None:
        try:
            store = RunStore(origin)
            steps = [k for k in store.steps() if k <= step]
        except (OSError, ValueError) as err:
            log.warning("resume: cannot read the journals of %s (%s); none replayed", origin, err)
            steps = []
        for k in steps:
            metrics = step_record_metrics(store, k)
            if metrics is not None:
                history[k] = metrics
    if step_metrics:
        history[step] = dict(step_metrics)
    return dict(sorted(history.items()))


__all__ = [
    "CACHE_HITS",
    "FLOW_METRICS",
    "RUN_INFO_KEYS",
    "cache_hits",
    "config_digest",
    "mlflow_identity",
    "resume_history",
    "run_info",
    "run_tags",
]
