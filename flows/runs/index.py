"""The runs under a directory and where each stands: what ``ppoflow runs`` lists.

A run directory (:func:`find_runs`) holds a ``config.json`` and at least one of
``step_<k>/journal.json``, ``run_info.json`` or ``rerun.json`` (flows/runs/store.py's layout). Runs are looked for in the directory given and
up to :data:`MAX_DEPTH` levels below it, never inside a run directory.

What a run's summary (:func:`summarize`) holds:

- ``steps_done`` / ``steps_total``: the steps whose journal is ``done``, and the steps planned:
  ``trainer.total_training_steps`` for a training run, 1 for a re-run branch (the step its
  ``rerun.json`` names); None (shown ``?``) when the config leaves the count to
  ``trainer.total_epochs``, which the dataset's length decides.
- ``status`` (:func:`run_status`): ``done``, ``running``, ``failed`` or ``partial``.
- ``score``: ``critic/score/mean`` of the last finished step's journal.
- ``val_score`` / ``val_step`` and ``mlflow_status``: from the run's MLflow run
  (flows/runs/tracking.py), found by ``mlflow_run_id`` and ``mlflow_tracking_uri`` of its
  ``run_info.json``; None without one. ``mlflow_run_id`` is None (shown ``-``) for a run
  without run_info.json or without an MLflow sink.
- ``parent``: a re-run branch's ``parent_run_dir`` (``rerun.json``).
- ``started``: when the run started: the earlier of the modification times of ``config.json``
  and of the first step's folder (a resume into the same directory rewrites config.json, not
  the folders of the steps before it); runs are listed in this order.
- ``problem``: a file of the run that could not be read (the status is then ``unreadable``).
"""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from flows.runs.lock import lock_held
from flows.runs.store import (
    CONFIG_FILE,
    JOURNAL_FILE,
    RERUN_FILE,
    RUN_INFO_FILE,
    RunStore,
    StepJournal,
)
from flows.runs.tracking import TrackingLookup

MAX_DEPTH = 4
SCORE = "critic/score/mean"
STEP_TIME = "timing_s/step"
#: a run counts as still running while its files changed less than this long ago (s) …
ACTIVE_FLOOR_S = 600.0
#: … or less than this many times its slowest step took
ACTIVE_STEP_FACTOR = 3.0
STATUSES = ("done", "running", "failed", "partial", "unreadable")


@dataclass(frozen=True)
class RunSummary:
    """One line of ``ppoflow runs`` (module docstring)."""

    run_dir: str
    status: str
    steps_done: int = 0
    steps_total: int | None = None
    last_step: int | None = None
    score: float | None = None
    val_score: float | None = None
    val_step: int | None = None
    mlflow_run_id: str | None = None
    mlflow_status: str | None = None
    parent: str | None = None
    started: float = 0.0
    problem: str | None = None

    def to_json(self) -> dict[str, Any]:
        """JSON data; ``started`` as an ISO 8601 UTC time."""
        data = asdict(self)
        data["started"] = datetime.fromtimestamp(self.started, UTC).isoformat()
        return data


def run_status(
    *,
    planned_done: bool,
    interrupted: bool,
    recently_written: bool,
    tracking_status: str | None,
) -> str:
    """The status of a run from what its files and its MLflow run say.

    - ``done``: the last planned step's journal is done;
    - ``failed``: otherwise, if MLflow ended the run ``FAILED`` / ``KILLED``, or its last journal
      is still ``running`` (a step stopped part-way) and nothing was written for a while;
    - ``running``: otherwise, if a training holds its lock (or, for a run without a lock file,
      its files changed recently: ``recently_written``) and MLflow, when known, says
      ``RUNNING``;
    - ``partial``: stopped between steps before the last planned one (a kill between steps,
      ``trainer.val_only``, a run that MLflow ended ``FINISHED`` early).

    Args:
        planned_done: the last planned step is journaled done.
        interrupted: the last journal's status is ``running``.
        recently_written: a training holds the run's lock (flows/runs/lock.py); for a run
            without a lock file, its newest journal changed within the activity window
            (:data:`ACTIVE_FLOOR_S`, :data:`ACTIVE_STEP_FACTOR`).
        tracking_status: the MLflow run's status, None when unknown.

    Example:
        >>> run_status(planned_done=False, interrupted=True, recently_written=True,
        ...            tracking_status="RUNNING")
        'running'
        >>> run_status(planned_done=False, interrupted=True, recently_written=False,
        ...            tracking_status="RUNNING")
        'failed'
        >>> run_status(planned_done=False, interrupted=False, recently_written=False,
        ...            tracking_status=None)
        'partial'
    """
    if planned_done:
        return "done"
    if tracking_status in ("FAILED", "KILLED"):
        return "failed"
    if recently_written and tracking_status in (None, "RUNNING"):
        return "running"
    return "failed" if interrupted else "partial"


# --- finding runs -------------------------------------------------------------------------------


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise ValueError(
            f"{path} is not valid JSON ({err.msg} at line {err.lineno}): truncated or damaged"
        ) from None


def is_run_dir(path: Path) -> bool:
    """Whether ``path`` is a run directory (module docstring)."""
    if not (path / CONFIG_FILE).is_file():
        return False
    if (path / RUN_INFO_FILE).is_file() or (path / RERUN_FILE).is_file():
        return True
    return any(path.glob(f"step_*/{JOURNAL_FILE}"))


def find_runs(root: Path, max_depth: int = MAX_DEPTH) -> list[Path]:
    """The run directories at or below ``root`` (at most ``max_depth`` levels down)."""
    if is_run_dir(root):
        return [root]
    if max_depth == 0:
        return []
    found: list[Path] = []
    for child in sorted(root.iterdir()):
        if child.is_dir() and not child.is_symlink() and not child.name.startswith("."):
            found.extend(find_runs(child, max_depth - 1))
    return found


def read_run_info(run_dir: str | os.PathLike) -> dict[str, Any] | None:
    """``<run dir>/run_info.json`` (``RunStore.load_run_info``: its MLflow run id and store,
    the directory the run started in, …), or None for a run that has none.

    Raises:
        ValueError: the file is damaged or lacks a key every run_info.json holds.
    """
    store = RunStore(run_dir)
    return store.load_run_info() if store.exists(RUN_INFO_FILE) else None


def working_dir(run_dir: str | os.PathLike) -> Path:
    """The directory the run started in (run_info.json ``working_dir``), where the relative
    paths of its config are read from; this process's working directory when the run records
    none (or the recorded one is gone)."""
    recorded = (read_run_info(run_dir) or {}).get("working_dir")
    if recorded and Path(recorded).is_dir():
        return Path(recorded)
    return Path.cwd()


# --- one run ------------------------------------------------------------------------------------


def _journals(run_dir: Path) -> list[StepJournal]:
    store = RunStore(run_dir)
    return [store.read_journal(step) for step in store.steps()]


def _planned(config: dict[str, Any], rerun: dict[str, Any] | None) -> int | None:
    """The last planned step: the re-run step of a branch, else the configured step count."""
    if rerun is not None:
        return int(rerun["step"])
    total = config["trainer"]["total_training_steps"]
    return None if total is None else int(total)


def _recently_written(run_dir: Path, journals: list[StepJournal], now: float) -> bool:
    """Whether the newest journal (config.json before the first) changed less than
    max(:data:`ACTIVE_FLOOR_S`, :data:`ACTIVE_STEP_FACTOR` × the slowest step) ago."""
    files = [run_dir / f"step_{j.step}" / JOURNAL_FILE for j in journals] or [run_dir / CONFIG_FILE]
    newest = max(file.stat().st_mtime for file in files)
    step_times = [j.metrics.get(STEP_TIME, math.nan) for j in journals]
    slowest = max((t for t in step_times if math.isfinite(t)), default=0.0)
    return now - newest < max(ACTIVE_FLOOR_S, ACTIVE_STEP_FACTOR * slowest)


def _started(run_dir: Path) -> float:
    """The earlier of config.json's and the first step folder's modification times."""
    times = [(run_dir / CONFIG_FILE).stat().st_mtime]
    steps = RunStore(run_dir).steps()
    if steps:
        times.append((run_dir / f"step_{steps[0]}").stat().st_mtime)
    return min(times)


def summarize(run_dir: Path, tracking: TrackingLookup | None, now: float) -> RunSummary:
    """The summary of one run (module docstring); ``tracking`` None: MLflow is not asked."""
    started = _started(run_dir)
    try:
        config = _read_json(run_dir / CONFIG_FILE)
        rerun = _read_json(run_dir / RERUN_FILE) if (run_dir / RERUN_FILE).is_file() else None
        info = read_run_info(run_dir) or {}
        journals = _journals(run_dir)
    except (ValueError, KeyError, TypeError, FileNotFoundError) as err:
        return RunSummary(str(run_dir), "unreadable", started=started, problem=str(err))
    run_id, uri = info.get("mlflow_run_id"), info.get("mlflow_tracking_uri")
    tracked = tracking.run(uri, run_id) if tracking and run_id and uri else None
    done = [j for j in journals if j.status == "done"]
    planned = _planned(config, rerun)
    by_step = {j.step: j for j in journals}
    if planned is None:
        planned_done = tracked is not None and tracked.status == "FINISHED"
    else:
        planned_done = planned in by_step and by_step[planned].status == "done"
    held = lock_held(run_dir)  # None: a run without a lock file (older, or never opened)
    status = run_status(
        planned_done=planned_done,
        interrupted=bool(journals) and journals[-1].status == "running",
        recently_written=held if held is not None else _recently_written(run_dir, journals, now),
        tracking_status=tracked.status if tracked else None,
    )
    return RunSummary(
        run_dir=str(run_dir),
        status=status,
        steps_done=len(done),
        steps_total=1 if rerun is not None else planned,
        last_step=journals[-1].step if journals else None,
        score=done[-1].metrics.get(SCORE) if done else None,
        val_score=tracked.val_score if tracked else None,
        val_step=tracked.val_step if tracked else None,
        mlflow_run_id=run_id,
        mlflow_status=tracked.status if tracked else None,
        parent=rerun["parent_run_dir"] if rerun is not None else None,
        started=started,
    )


def list_runs(
    root: str | os.PathLike, tracking: TrackingLookup | None = None, now: float | None = None
) -> list[RunSummary]:
    """Every run at or below ``root``, oldest first (module docstring).

    Raises:
        FileNotFoundError: ``root`` is not a directory.
    """
    root = Path(root).absolute()
    if not root.is_dir():
        raise FileNotFoundError(f"{root} is not a directory")
    now = time.time() if now is None else now
    runs = [summarize(path, tracking, now) for path in find_runs(root)]
    return sorted(runs, key=lambda run: (run.started, run.run_dir))


__all__ = [
    "RunSummary",
    "find_runs",
    "is_run_dir",
    "list_runs",
    "read_run_info",
    "run_status",
    "summarize",
    "working_dir",
]
