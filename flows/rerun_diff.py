"""The metric diff of a re-run step against its parent, and the branch as an MLflow run
(``ppoflow rerun``, flows/rerun.py steps 5 and 6).

:func:`metric_diff` compares the step's metrics with the parent journal's: the metrics that
differ or exist on one side only, wall-time ones (:data:`TIMING_PREFIXES`) and
:data:`UNCOMPARED` left out. :func:`log_branch_run` logs the branch as an MLflow run in the
parent's experiment, nested under the parent's run when both are in the same store, with the
diff as the table artifact ``metric_diff.json``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from flows.runs.identity import CACHE_HITS, run_info, run_tags
from flows.runs.store import RUN_INFO_FILE, RunStore
from stages.config import PPORunConfig

#: metric name prefixes that differ between any two runs of the same work (wall time, including
#: the reward stage's own reward/time_s)
TIMING_PREFIXES = (
    "timing_s/",
    "timing_per_token_ms/",
    "perf/",
    "reward/time_s",
)
#: metrics no diff compares: how the step was computed, not what it computed (a branch hits the
#: cache by design)
UNCOMPARED = (CACHE_HITS,)


# --- metrics ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MetricChange:
    """One metric of the re-run step against the original (None: absent on that side)."""

    name: str
    before: float | None
    after: float | None

    @property
    def delta(self) -> float | None:
        if self.before is None or self.after is None:
            return None
        return self.after - self.before


def _same(a: float | None, b: float | None) -> bool:
    if a is None or b is None:
        return a is b
    return a == b or (math.isnan(a) and math.isnan(b))


def compared_names(
    before: Mapping[str, float], after: Mapping[str, float], include_timing: bool = False
) -> list[str]:
    """The metric names a diff compares: both sides' names but :data:`UNCOMPARED`, sorted,
    wall-time ones only with ``include_timing``.

    >>> compared_names({"a": 1.0, "ppoflow/cache_hits": 0.0}, {"timing_s/gen": 1.0, "a": 2.0})
    ['a']
    """
    names = sorted((set(before) | set(after)) - set(UNCOMPARED))
    if include_timing:
        return names
    return [name for name in names if not name.startswith(TIMING_PREFIXES)]


def metric_diff(
    before: Mapping[str, float], after: Mapping[str, float], include_timing: bool = False
) -> list[MetricChange]:
    """Metrics that differ (or exist on one side only), sorted by name; wall-time metrics
    (:data:`TIMING_PREFIXES`) only with ``include_timing``.

    >>> [c.name for c in metric_diff({"a": 1.0, "b": 2.0, "timing_s/gen": 1.0},
    ...                               {"a": 1.0, "b": 3.0, "c": 0.0, "timing_s/gen": 2.0})]
    ['b', 'c']
    """
    names = compared_names(before, after, include_timing)
    changes = [MetricChange(name, before.get(name), after.get(name)) for name in names]
    return [change for change in changes if not _same(change.before, change.after)]


def format_diff(changes: Sequence[MetricChange], unchanged: int) -> str:
    """A plain-text table: name, original, re-run, Δ; then the count of unchanged metrics."""

    def cell(value: float | None) -> str:
        return "-" if value is None else f"{value:.6g}"

    if not changes:
        return f"no metric changed ({unchanged} compared, wall-time metrics left out)"
    width = max(len(change.name) for change in changes)
    lines = [f"{'metric':<{width}}  {'original':>12}  {'re-run':>12}  {'Δ':>12}"]
    for change in changes:
        lines.append(
            f"{change.name:<{width}}  {cell(change.before):>12}  {cell(change.after):>12}  "
            f"{cell(change.delta):>12}"
        )
    lines.append(f"{len(changes)} changed, {unchanged} unchanged (wall-time metrics left out)")
    return "\n".join(lines)


# --- the branch in MLflow ------------------------------------------------------------------------


def diff_rows(changes: Sequence[MetricChange]) -> list[dict[str, Any]]:
    """The metric diff as table rows (``metric``, ``original``, ``re-run``, ``delta``).

    >>> diff_rows([MetricChange("a", 1.0, 3.0), MetricChange("b", None, 0.5)])[1]
    {'metric': 'b', 'original': None, 're-run': 0.5, 'delta': None}
    """
    return [
        {"metric": c.name, "original": c.before, "re-run": c.after, "delta": c.delta}
        for c in changes
    ]


def branch_parent_tags(parent: RunStore, parent_info: Mapping[str, Any], uri: str) -> dict:
    """The tags that tie a run made from ``parent`` to it: its directory and, when it recorded
    an MLflow run, that run (``mlflow.parentRunId`` too when both are in the store ``uri``, so
    the UI nests the run under it)."""
    tags = {"ppoflow.parent_run_dir": parent.root}
    parent_run = parent_info.get("mlflow_run_id")
    if parent_run:
        tags["ppoflow.parent_mlflow_run_id"] = parent_run
        if parent_info.get("mlflow_tracking_uri") == uri:
            tags["mlflow.parentRunId"] = parent_run
    return tags


def branch_tags(
    parent: RunStore,
    parent_info: Mapping[str, Any],
    uri: str,
    info: dict,
    mlflow_parent: str | None = None,
) -> dict:
    """The parent tags of a branch run (module docstring, step 6); with ``mlflow_parent`` (a
    sweep's run, flows/rerun_sweep.py) the branch is nested under that run instead."""
    tags = {
        **branch_parent_tags(parent, parent_info, uri),
        "ppoflow.rerun.step": str(info["step"]),
        "ppoflow.rerun.from": info["from"],
        "ppoflow.rerun.to": info["to"],
        "ppoflow.rerun.overrides": json.dumps(info["overrides"]),
    }
    if mlflow_parent is not None:
        tags["mlflow.parentRunId"] = tags["ppoflow.sweep_mlflow_run_id"] = mlflow_parent
    return tags


def branch_tracking_uri(cfg: PPORunConfig, parent: RunStore) -> tuple[str, dict[str, Any]]:
    """The store a run made from ``parent`` logs to (module docstring, step 6), and the
    parent's run_info ({} when it has none)."""
    from flows.sinks.mlflow_store import select_tracking_uri

    parent_info = parent.load_run_info() if parent.exists(RUN_INFO_FILE) else {}
    uri = select_tracking_uri(
        cfg.ppoflow.mlflow_tracking_uri,
        cfg.ppoflow.artifact_dir,
        recorded=parent_info.get("mlflow_tracking_uri"),
    )
    return uri, parent_info


def log_branch_run(
    cfg: PPORunConfig,
    parent: RunStore,
    store: RunStore,
    info: dict,
    metrics: Mapping[str, float],
    changes: Sequence[MetricChange],
    mlflow_parent: str | None = None,
) -> str | None:
    """Log the branch as an MLflow run (module docstring, step 6; a sweep's branch under the
    sweep's run ``mlflow_parent``); its run id, or None while the store is unreachable (then
    what was logged is in the branch's mlflow_pending.jsonl)."""
    from flows.sinks.mlflow_logger import MLflowLogger

    uri, parent_info = branch_tracking_uri(cfg, parent)
    name = f"{cfg.trainer.experiment_name}-rerun-step{info['step']}-{info['from']}"
    local_dir = store.root if store.is_local else None
    with MLflowLogger(cfg.trainer.project_name, name, run_dir=local_dir, tracking_uri=uri) as sink:
        tags = branch_tags(parent, parent_info, uri, info, mlflow_parent)
        sink.set_tags({**run_tags(cfg, store.root), **tags})
        sink.log_params(cfg)
        sink.log_metrics(metrics, info["step"])
        sink.log_table(diff_rows(changes), "metric_diff.json")
    identity = {
        "mlflow_run_id": sink.run_id,
        "mlflow_tracking_uri": uri,
        "mlflow_experiment": cfg.trainer.project_name,
    }
    store.save_run_info(run_info(cfg, store.root, identity))
    return sink.run_id


__all__ = [
    "TIMING_PREFIXES",
    "UNCOMPARED",
    "MetricChange",
    "branch_parent_tags",
    "branch_tags",
    "branch_tracking_uri",
    "compared_names",
    "diff_rows",
    "format_diff",
    "log_branch_run",
    "metric_diff",
]
