"""``ppoflow runs [DIR] [--json]``: one line per run directory under DIR, oldest first.

Columns (flows/runs/index.py): start time, run directory (relative to DIR), status (done /
running / failed / partial), steps done / planned, the last step's training score
(``critic/score/mean``), the last validation score with its step, the MLflow run id, and a
re-run branch's parent. ``--json`` prints a JSON list instead, one object per run
(``RunSummary.to_json``: absolute paths, ISO 8601 start times, None for what is unknown).
Lines about MLflow stores and run files that could not be read go to stderr (``note: …``).

DIR defaults to the default ``ppoflow.artifact_dir``. Exit status: 0 (also for a directory
without runs, which prints one line saying so); 2 when DIR is not a directory.
"""

from __future__ import annotations

import json
import math
import os
from datetime import datetime
from typing import TYPE_CHECKING, Annotated

import typer

if TYPE_CHECKING:
    from flows.runs.index import RunSummary


def default_runs_dir() -> str:
    """The default of ``ppoflow.artifact_dir`` (where ``ppoflow train`` puts run directories)."""
    from stages.config.schema_trainer import PPOFlowConfig

    return PPOFlowConfig.model_fields["artifact_dir"].default


def packaged_run_dirs(cwd: str = ".") -> list[tuple[str, str]]:
    """``(ppoflow.artifact_dir, config file)`` of each packaged config in configs/ that sets
    its own artifact directory and whose directory exists under ``cwd`` (``make demo`` writes
    to ``outputs/demo/runs``, not the default ``runs``): where a bare ``ppoflow runs`` points a
    user who has no ``runs`` directory."""
    import yaml

    from stages.config import CONFIGS_DIR

    found = []
    for path in sorted(CONFIGS_DIR.glob("*.yaml")):
        try:
            tree = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        except (OSError, yaml.YAMLError):
            continue
        where = (tree.get("ppoflow") or {}).get("artifact_dir") if isinstance(tree, dict) else None
        if isinstance(where, str) and os.path.isdir(os.path.join(cwd, where)):
            found.append((where, f"configs/{path.name}"))
    return found


def _number(value: float | None) -> str:
    return "-" if value is None or not math.isfinite(value) else f"{value:.3f}"


def _near(path: str | None, root: str) -> str:
    """``path`` relative to ``root`` when it lies below it ("." for root itself)."""
    if path is None:
        return "-"
    inside = os.path.commonpath([os.path.abspath(path), root]) == root
    return os.path.relpath(path, root) if inside else path


def row(run: RunSummary, root: str) -> list[str]:
    """The table cells of one run (module docstring)."""
    total = "?" if run.steps_total is None else str(run.steps_total)
    val = _number(run.val_score)
    return [
        datetime.fromtimestamp(run.started).strftime("%Y-%m-%d %H:%M"),
        _near(run.run_dir, root),
        run.status,
        f"{run.steps_done}/{total}",
        _number(run.score),
        val if run.val_step is None else f"{val} @{run.val_step}",
        run.mlflow_run_id or "-",
        _near(run.parent, root),
    ]


HEADERS = ("started", "run", "status", "steps", "score", "val score", "MLflow run", "parent")


def print_table(runs: list[RunSummary], root: str) -> None:
    """The runs as a rich table (no wrapping when the output is not a terminal)."""
    from rich import box
    from rich.console import Console
    from rich.table import Table

    console = Console(highlight=False)
    if not console.is_terminal:
        console.width = 1000  # a pipe or a file: one line per run, however long
    table = Table(*HEADERS, box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
    for run in runs:
        table.add_row(*row(run, root))
    console.print(table)


def runs_command(
    directory: Annotated[
        str | None,
        typer.Argument(help="Where to look for runs; default the default ppoflow.artifact_dir"),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON list")] = False,
) -> None:
    """List the run directories under DIR: status, steps, scores, MLflow run, parent."""
    from flows.runs.index import list_runs
    from flows.runs.tracking import TrackingLookup

    root = os.path.abspath(directory or default_runs_dir())
    tracking = TrackingLookup()
    try:
        runs = list_runs(root, tracking)
    except FileNotFoundError:
        found = "; ".join(f"{where} ({config})" for where, config in packaged_run_dirs())
        typer.echo(
            f"error: {root} is not a directory; pass the directory that holds the run "
            "directories (ppoflow.artifact_dir of the runs)"
            + (f"; the packaged configs' runs here: {found}" if found else ""),
            err=True,
        )
        raise typer.Exit(2) from None
    if as_json:
        typer.echo(json.dumps([run.to_json() for run in runs], indent=1))
    elif not runs:
        typer.echo(
            f"no run directories under {root} (a run directory holds config.json and "
            "step_<k>/journal.json; ppoflow train writes them)"
        )
    else:
        print_table(runs, root)
    notes = tracking.notes + [f"{run.run_dir}: {run.problem}" for run in runs if run.problem]
    for note in notes:
        typer.echo(f"note: {note}", err=True)


def register(app: typer.Typer) -> None:
    """Add the ``runs`` command to the ``ppoflow`` app."""
    app.command("runs")(runs_command)


__all__ = ["default_runs_dir", "register", "row", "runs_command"]
