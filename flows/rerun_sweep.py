"""Sweeps over a past step: ``ppoflow rerun RUN --step K --from STAGE --sweep key=v1,v2,…``.

Each ``--sweep KEY=V1,V2,…`` is an axis; several axes form a grid (every combination, the first
axis slowest). Every point of the grid is one re-run branch of step K (flows/rerun.py) with the
point's overrides after the command's own, written to ``SWEEP_DIR/branch-<i>``:

1. before anything is written, every branch's config is resolved and validated, and each swept
   key is checked against the stages that read it (``Stage.config_keys``): a key no stage of
   the step reads, or only stages before ``--from`` read, is refused — every branch would
   reuse the same artifacts and equal the original;
2. the stages before ``--from`` are the parent's artifacts in every branch (computed once, by
   the original run; each branch's journal records them as reused); the stages from ``--from``
   on run per branch, as cached stage tasks (a stage whose inputs and config the point does
   not change hits the parent's cache). The branches run one after another in this process,
   one engine set at a time; with ``--parallel N``, N at a time, each in a process of its own
   with its own engines, where the engines allow it (flows/sweep_processes.py: a slice of the
   CUDA devices or of the torch threads each, checked before anything is written);
3. the table: one row per metric that differs from the original in any branch, the original as
   the first column and one column per branch (wall-time metrics left out, as in the diff);
4. with ``mlflow`` in ``trainer.logger``: one MLflow run for the sweep (nested under the
   original's run when both are in one store), holding the table as ``sweep.json``, and each
   branch a child run of it.

A branch that fails stops the sweep with its error; the branches already finished stay (each
is a complete re-run directory), the failed one leaves nothing (flows/rerun.py).
"""

from __future__ import annotations

import functools
import itertools
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from flows.rerun import (
    RerunResult,
    _rerun,
    branch_info,
    check_stage_name,
    open_parent,
    stage_window,
)
from flows.rerun_diff import log_branch_run, metric_diff
from flows.rerun_rounds import planned_stages
from flows.runs.store import RunStore
from flows.step_flow import StepFlow
from flows.sweep_processes import (
    BranchJob,
    BranchProcess,
    Placement,
    check_parallel,
    placements,
    run_branches,
    visible_devices,
)
from stages.config import ConfigError, PPORunConfig, apply_overrides
from stages.engines.worker_group import WORKER_BACKENDS
from stages.ppo import PPO_STAGES

ORIGINAL = "original"


@dataclass(frozen=True)
class SweepAxis:
    """One ``--sweep KEY=V1,V2,…``: the dotted config key and its values (YAML text each)."""

    key: str
    values: tuple[str, ...]


def split_values(text: str) -> list[str]:
    """``text`` split at the commas outside brackets and quotes (a value may be a YAML list).

    >>> split_values("grpo,rloo,[1, 2],'a,b'")
    ['grpo', 'rloo', '[1, 2]', "'a,b'"]
    """
    values, depth, quote, start = [], 0, "", 0
    for i, char in enumerate(text):
        if quote:
            quote = "" if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char in "[{":
            depth += 1
        elif char in "]}":
            depth -= 1
        elif char == "," and depth == 0:
            values.append(text[start:i].strip())
            start = i + 1
    values.append(text[start:].strip())
    return values


def parse_axis(spec: str) -> SweepAxis:
    """``KEY=V1,V2,…`` as a :class:`SweepAxis`; ValueError naming the spec when it is not one.

    >>> parse_axis("algorithm.adv_estimator=grpo,rloo")
    SweepAxis(key='algorithm.adv_estimator', values=('grpo', 'rloo'))
    """
    key, sep, text = spec.partition("=")
    values = split_values(text) if sep else []
    if not sep or not key.strip() or any(not value for value in values):
        raise ValueError(
            f"--sweep {spec!r} is not KEY=V1,V2,… (a dotted config key, then its values "
            "separated by commas)"
        )
    if len(set(values)) != len(values):
        raise ValueError(f"--sweep {spec!r} names a value twice")
    return SweepAxis(key.strip(), tuple(values))


def parse_axes(specs: Sequence[str]) -> list[SweepAxis]:
    """The axes of the ``--sweep`` options, each key once."""
    axes = [parse_axis(spec) for spec in specs]
    keys = [axis.key for axis in axes]
    twice = sorted({key for key in keys if keys.count(key) > 1})
    if twice:
        raise ValueError(f"--sweep names {twice[0]} twice; give its values in one --sweep")
    return axes


def grid(axes: Sequence[SweepAxis]) -> list[tuple[str, ...]]:
    """Every point of the grid as its overrides, the first axis slowest.

    >>> grid([SweepAxis("a", ("1", "2")), SweepAxis("b", ("x", "y"))])
    [('a=1', 'b=x'), ('a=1', 'b=y'), ('a=2', 'b=x'), ('a=2', 'b=y')]
    """
    return [
        tuple(f"{axis.key}={value}" for axis, value in zip(axes, point, strict=True))
        for point in itertools.product(*(axis.values for axis in axes))
    ]


def reads(config_key: str, key: str) -> bool:
    """Whether a stage that declares ``config_key`` reads ``key`` (one is the other or a
    section holding it).

    >>> reads("actor_rollout_ref.actor", "actor_rollout_ref.actor.clip_ratio")
    True
    >>> reads("algorithm.gamma", "algorithm.gamma_x")
    False
    """
    return key == config_key or key.startswith(config_key + ".") or config_key.startswith(key + ".")


def readers(key: str) -> list[str]:
    """The PPO stages whose ``config_keys`` or ``file_keys`` read ``key``, in step order."""
    return [
        stage.name
        for stage in PPO_STAGES
        if any(reads(declared, key) for declared in (*stage.config_keys, *stage.file_keys))
    ]


def axis_problem(axis: SweepAxis, from_stage: str, before: Sequence[str]) -> str | None:
    """Why sweeping ``axis`` from ``from_stage`` would change nothing, or None."""
    found = readers(axis.key)
    if not found:
        return (
            f"--sweep {axis.key}: no stage of the step reads it (no stage's cache key would "
            "change, so every branch would equal the original)"
        )
    if all(name in before for name in found):
        return (
            f"--sweep {axis.key} is read by the {' and '.join(found)} stage(s), before --from "
            f"{from_stage}: every branch would reuse the original's artifacts; pass --from "
            f"{found[0]}"
        )
    return None


def check_branches(
    parent_cfg: PPORunConfig,
    axes: Sequence[SweepAxis],
    overrides: Sequence[str],
    from_stage: str,
    before: Sequence[str],
) -> list[tuple[str, ...]]:
    """The grid's points, once every branch's config validates and every axis is read by a
    stage from ``from_stage`` on (module docstring, 1); ConfigError / ValueError otherwise."""
    points = grid(axes)
    for point in points:
        try:
            apply_overrides(parent_cfg, [*overrides, *point])
        except ConfigError as err:
            raise ConfigError(err.problems, f"branch {', '.join(point)}") from None
    for axis in axes:
        problem = axis_problem(axis, from_stage, before)
        if problem is not None:
            raise ValueError(problem)
    return points


def label(point: Sequence[str]) -> str:
    """A branch's column name: each override's last key part and its value.

    >>> label(("algorithm.adv_estimator=rloo", "actor_rollout_ref.actor.clip_ratio=0.1"))
    'adv_estimator=rloo clip_ratio=0.1'
    """
    return " ".join(
        f"{key.rpartition('.')[2]}={value}" for key, _, value in (p.partition("=") for p in point)
    )


@dataclass
class SweepResult:
    """What a sweep made: its directory, each branch's re-run, the table's rows."""

    sweep_dir: str
    parent_dir: str
    step: int
    points: list[tuple[str, ...]]
    branches: list[RerunResult]
    original: dict[str, float]
    rows: list[dict[str, Any]] = field(default_factory=list)
    mlflow_run_id: str | None = None
    parallel: int = 1  # branches run at once
    processes: list[BranchProcess] = field(default_factory=list)  # with parallel > 1


def sweep_rows(
    original: Mapping[str, float], points: Sequence[Sequence[str]], branches: Sequence[RerunResult]
) -> list[dict[str, Any]]:
    """One row per metric that differs from the original in any branch (wall-time metrics left
    out): ``{"metric": name, "original": value, <label>: value, …}``, None where absent."""
    changed = sorted({c.name for branch in branches for c in metric_diff(original, branch.metrics)})
    return [
        {
            "metric": name,
            ORIGINAL: original.get(name),
            **{
                label(point): branch.metrics.get(name)
                for point, branch in zip(points, branches, strict=True)
            },
        }
        for name in changed
    ]


def format_table(rows: Sequence[Mapping[str, Any]], columns: Mapping[str, str]) -> str:
    """The rows as a plain-text table: the metric, then one column per key of ``columns``
    (a row's key → the column's heading)."""
    if not rows:
        return "no metric differs from the original in any branch (wall-time metrics left out)"

    def cell(value: Any) -> str:
        return "-" if value is None else f"{value:.6g}"

    width = max(len(row["metric"]) for row in rows)
    widths = {key: max(12, len(heading)) for key, heading in columns.items()}
    headings = (f"{heading:>{widths[key]}}" for key, heading in columns.items())
    lines = ["  ".join([f"{'metric':<{width}}", *headings])]
    for row in rows:
        cells = (f"{cell(row[key]):>{widths[key]}}" for key in columns)
        lines.append("  ".join([f"{row['metric']:<{width}}", *cells]))
    return "\n".join(lines)


def default_sweep_dir(parent_dir: str, step: int, from_stage: str) -> str:
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S-%f")
    return f"{parent_dir.rstrip('/')}-sweep-step{step}-{from_stage}-{stamp}"


def _sweep(
    run_dir: str,
    step: int,
    from_stage: str,
    sweeps: Sequence[str],
    to_stage: str | None = None,
    overrides: Sequence[str] = (),
    sweep_dir: str | None = None,
    refresh: bool = False,
    parallel: int = 1,
) -> SweepResult:
    """Re-run step ``step`` of ``run_dir`` from ``from_stage`` once per point of the grid of
    ``sweeps``, ``parallel`` branches at a time (module docstring)."""
    check_stage_name(from_stage, "--from")
    axes = parse_axes(sweeps)
    parent, parent_cfg = open_parent(run_dir)
    _, before = stage_window(from_stage, to_stage, planned_stages(parent_cfg, None, from_stage))
    points = check_branches(parent_cfg, axes, overrides, from_stage, before)
    slots = branch_placements(parent_cfg, overrides, points, parallel)
    root = RunStore(sweep_dir or default_sweep_dir(parent.root, step, from_stage))
    if root.fs.exists(root.root) and root.fs.ls(root.root):
        raise ValueError(f"{root.root} is not empty; choose a new directory for the sweep")
    original = dict(parent.read_journal(step).metrics)
    sink = _open_sweep_run(parent_cfg, parent, step, from_stage, axes)
    mlflow_parent = None if sink is None else sink.run_id
    jobs = [
        BranchJob(
            i,
            label(point),
            {
                "run_dir": parent.root,
                "step": step,
                "from_stage": from_stage,
                "to_stage": to_stage,
                "overrides": [*overrides, *point],
                "new_run_dir": f"{root.root}/branch-{i}",
                "refresh": refresh,
                "mlflow_parent": mlflow_parent,
            },
        )
        for i, point in enumerate(points)
    ]
    branches: list[RerunResult] = []
    processes: list[BranchProcess] = []
    rows: list[dict[str, Any]] = []
    status = "FAILED"
    try:
        if len(slots) == 1:
            for job in jobs:
                branches.append(_rerun(**job.rerun))
        else:
            branches, processes = run_branches(
                jobs, slots, prefect_env(), functools.partial(log_branch, parent, parent_cfg)
            )
        rows = sweep_rows(original, points, branches)
        if sink is not None:
            sink.log_table(rows, "sweep.json")
        status = "FINISHED"
    finally:
        if sink is not None:
            sink.close(status)
    return SweepResult(
        sweep_dir=root.root,
        parent_dir=parent.root,
        step=step,
        points=points,
        branches=branches,
        original=original,
        rows=rows,
        mlflow_run_id=mlflow_parent,
        parallel=len(slots),
        processes=processes,
    )


def branch_placements(
    parent_cfg: PPORunConfig,
    overrides: Sequence[str],
    points: Sequence[Sequence[str]],
    parallel: int,
) -> list[Placement]:
    """Where each branch process running at once computes (flows/sweep_processes.py): one
    placement per process, at most one per branch; a single one (this process) for
    ``parallel`` 1. ValueError where the engines do not allow it: a workers backend whose ranks
    are not in the branch's process, too few devices, more than one node."""
    import torch

    check_parallel(parallel)
    parallel = min(parallel, len(points))
    if parallel == 1:
        return [Placement(torch.get_num_threads(), {})]
    configs = [apply_overrides(parent_cfg, [*overrides, *point]) for point in points]
    for cfg in configs:
        backend = cfg.ppoflow.workers.backend
        if not WORKER_BACKENDS.get(backend).ranks_in_driver:
            raise ValueError(
                f"--parallel {parallel} runs each branch's engines in a process of its own, but "
                f"ppoflow.workers.backend = {backend} places them as actors of a cluster; run "
                "this sweep with --parallel 1"
            )
    device = configs[0].trainer.device
    return placements(
        parallel,
        device,
        max(cfg.trainer.n_gpus_per_node for cfg in configs),
        max(cfg.trainer.nnodes for cfg in configs),
        visible_devices(os.environ, torch.cuda.device_count() if device == "cuda" else 0),
        torch.get_num_threads(),
    )


def prefect_env() -> dict[str, str]:
    """The variables that put a branch process on this flow run's Prefect server and home."""
    from prefect.client.orchestration import get_client
    from prefect.settings import get_current_settings

    with get_client(sync_client=True) as client:
        url = str(client.api_url).rstrip("/")
    return {"PREFECT_API_URL": url, "PREFECT_HOME": str(get_current_settings().home)}


def log_branch(
    parent: RunStore, parent_cfg: PPORunConfig, job: BranchJob, result: RerunResult
) -> RerunResult:
    """Log a branch that ran in a process of its own as the sweep's child run in MLflow (what
    ``_rerun`` does itself for a branch run in this process); the result, with its run id."""
    overrides = job.rerun["overrides"]
    cfg = apply_overrides(parent_cfg, overrides)
    if "mlflow" not in cfg.trainer.logger:
        return result
    rerun = job.rerun
    info = branch_info(parent.root, result.step, rerun["from_stage"], rerun["to_stage"], overrides)
    store = RunStore(result.run_dir)
    result.mlflow_run_id = log_branch_run(
        cfg, parent, store, info, result.metrics, result.changes, rerun["mlflow_parent"]
    )
    return result


def _open_sweep_run(
    cfg: PPORunConfig, parent: RunStore, step: int, from_stage: str, axes: Sequence[SweepAxis]
) -> Any:
    """The sweep's MLflow run (module docstring, 4), open; None without the mlflow sink."""
    if "mlflow" not in cfg.trainer.logger:
        return None
    from flows.rerun_diff import branch_parent_tags, branch_tracking_uri
    from flows.sinks.mlflow_logger import MLflowLogger

    uri, parent_info = branch_tracking_uri(cfg, parent)
    name = f"{cfg.trainer.experiment_name}-sweep-step{step}-{from_stage}"
    sink = MLflowLogger(cfg.trainer.project_name, name, run_dir=None, tracking_uri=uri)
    sink.set_tags(
        {
            **branch_parent_tags(parent, parent_info, uri),
            "ppoflow.sweep.step": str(step),
            "ppoflow.sweep.from": from_stage,
            "ppoflow.sweep.axes": ", ".join(f"{a.key}={','.join(a.values)}" for a in axes),
        }
    )
    return sink


sweep = StepFlow(
    fn=_sweep,
    name="ppo-sweep",
    flow_run_name="sweep-step{step}-from-{from_stage}",
    validate_parameters=False,
    persist_result=False,
)
