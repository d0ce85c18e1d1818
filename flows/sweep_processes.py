"""A sweep's branches run N at a time, in N processes of their own (``ppoflow rerun … --sweep …
--parallel N``, flows/rerun_sweep.py), each process taking the next waiting branch when it has
finished one (so a grid of many points pays N process starts, not one per point).

A branch process (flows/sweep_branch.py) builds each branch's engines, so branches share nothing
but the parent's artifacts, which they only read. Where the engines allow it:

* the workers backend must run a branch's ranks in the branch's process
  (``ranks_in_driver`` of its entry in ``stages.engines.worker_group.WORKER_BACKENDS``); the Ray
  backend's actors would be placed by one Ray cluster per branch;
* ``trainer.device=cuda``: each branch gets ``trainer.n_gpus_per_node`` devices of its own
  (``CUDA_VISIBLE_DEVICES``, a slice of the devices this process sees), so N branches need
  N × that many devices; one node only;
* ``trainer.device=cpu``: each branch gets ``max(1, T // N)`` torch threads, T being this
  process's.

The branch processes talk to this process's Prefect server (each branch is a ``ppo-rerun`` flow
run of its own), end with this process (flows/process/lifeline.py), and leave their MLflow runs
to this process, which logs each branch when its process has finished, so that one process
writes the store. The first branch that fails stops the sweep: no further branch starts, the
running ones are stopped (a stopped branch leaves nothing, as a failed one), and its error is
raised with the branch named; the branches that finished stay.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flows.process.lifeline import Lifeline
from flows.rerun import RerunResult
from flows.rerun_diff import MetricChange
from flows.runs.store import StageRecord

#: seconds between two looks at the running branch processes
POLL_S = 0.1
#: seconds a stopped branch process has to unwind before it is killed
STOP_GRACE_S = 30.0


class BranchFailed(RuntimeError):
    """A branch of a parallel sweep failed; its message names the branch and its error."""


@dataclass(frozen=True)
class Placement:
    """Where one branch process computes: its torch threads and the variables it starts with."""

    threads: int
    env: Mapping[str, str]


@dataclass(frozen=True)
class BranchJob:
    """One branch to run: its index in the grid, its column label, what ``_rerun`` takes."""

    index: int
    label: str
    rerun: Mapping[str, Any]  # flows.rerun._rerun's keyword arguments, JSON data


@dataclass(frozen=True)
class BranchProcess:
    """When and where a branch ran: its process id and its wall-clock window (``time.time``)."""

    index: int
    pid: int
    started: float
    ended: float


def visible_devices(environ: Mapping[str, str], device_count: int) -> list[str]:
    """The CUDA devices this process sees, as ``CUDA_VISIBLE_DEVICES`` names them for a child.

    >>> visible_devices({"CUDA_VISIBLE_DEVICES": "3,5"}, 2), visible_devices({}, 2)
    (['3', '5'], ['0', '1'])
    """
    listed = environ.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        return [name.strip() for name in listed.split(",") if name.strip()][:device_count]
    return [str(i) for i in range(device_count)]


def check_parallel(parallel: int) -> None:
    """ValueError naming ``--parallel`` when it is not a count of processes (1 or more)."""
    if parallel < 1:
        raise ValueError(f"--parallel {parallel}: give how many branches run at once, 1 or more")


def placements(
    parallel: int,
    device: str,
    devices_per_branch: int,
    nnodes: int,
    visible: Sequence[str],
    threads: int,
) -> list[Placement]:
    """One :class:`Placement` per branch process running at once (module docstring); ValueError
    naming what does not fit.

    >>> [p.threads for p in placements(2, "cpu", 1, 1, [], 4)]
    [2, 2]
    >>> [dict(p.env) for p in placements(2, "cuda", 2, 1, ["0", "1", "2", "3"], 8)]
    [{'CUDA_VISIBLE_DEVICES': '0,1'}, {'CUDA_VISIBLE_DEVICES': '2,3'}]
    """
    check_parallel(parallel)
    if device != "cuda":
        share = max(1, threads // parallel)
        return [Placement(share, {}) for _ in range(parallel)]
    if nnodes != 1:
        raise ValueError(
            f"--parallel {parallel} places each branch on devices of this machine, but "
            f"trainer.nnodes = {nnodes}; run a multi-node sweep with --parallel 1"
        )
    needed = parallel * devices_per_branch
    if needed > len(visible):
        fits = len(visible) // devices_per_branch
        raise ValueError(
            f"--parallel {parallel} needs {parallel} × {devices_per_branch} CUDA devices "
            f"(trainer.n_gpus_per_node = {devices_per_branch} per branch), but this process sees "
            f"{len(visible)}" + (f"; lower --parallel to {fits}" if fits >= 1 else "")
        )
    return [
        Placement(
            threads,
            {
                "CUDA_VISIBLE_DEVICES": ",".join(
                    visible[i * devices_per_branch : (i + 1) * devices_per_branch]
                )
            },
        )
        for i in range(parallel)
    ]


def result_from_json(data: Mapping[str, Any]) -> RerunResult:
    """The :class:`RerunResult` a branch process wrote (flows/sweep_branch.py ``result_json``)."""
    return RerunResult(
        run_dir=data["run_dir"],
        parent_dir=data["parent_dir"],
        step=data["step"],
        records=[StageRecord.from_json(record) for record in data["records"]],
        metrics=dict(data["metrics"]),
        changes=[MetricChange(*change) for change in data["changes"]],
        unchanged=data["unchanged"],
        engines_built=list(data["engines_built"]),
    )


@dataclass
class _Worker:
    """A branch process, and the branch it runs now (None: idle)."""

    placement: Placement
    process: subprocess.Popen
    lifeline: Lifeline
    log_path: Path
    job: BranchJob | None = None
    result_path: Path | None = None


def run_branches(
    jobs: Sequence[BranchJob],
    slots: Sequence[Placement],
    env: Mapping[str, str],
    on_done: Callable[[BranchJob, RerunResult], RerunResult],
) -> tuple[list[RerunResult], list[BranchProcess]]:
    """Run ``jobs`` in ``len(slots)`` branch processes, each with one slot's placement and
    ``env``, each taking the next waiting branch when it has finished one (module docstring);
    ``on_done`` gets each finished branch in this process (and returns it, its MLflow run
    logged). The results and the branches' windows, in the order of ``jobs``."""
    done: dict[int, tuple[RerunResult, BranchProcess]] = {}
    waiting = list(jobs)
    workers: list[_Worker] = []
    with tempfile.TemporaryDirectory(prefix="ppoflow-sweep-") as scratch:
        try:
            for i, placement in enumerate(slots[: len(jobs)]):
                workers.append(_start(placement, env, Path(scratch) / f"process-{i}.log"))
                _give(workers[-1], waiting.pop(0), Path(scratch))
            while any(worker.job is not None for worker in workers):
                finished = False
                for worker in workers:
                    job = worker.job
                    if job is None:
                        continue
                    if worker.result_path.exists():  # written whole (renamed into place)
                        outcome = _outcome(job, worker.result_path)
                        worker.job = None
                        done[job.index] = (on_done(job, outcome[0]), outcome[1])
                        if waiting:
                            _give(worker, waiting.pop(0), Path(scratch))
                        else:
                            worker.process.stdin.close()  # nothing more: the process ends
                        finished = True
                    elif worker.process.poll() is not None:
                        tail = _tail(worker.log_path)
                        raise BranchFailed(
                            f"{_name(job)}: its process ended with status "
                            f"{worker.process.returncode} and wrote no result"
                            + (f"; its last output: {tail}" if tail else "")
                        )
                if not finished:
                    time.sleep(POLL_S)
        finally:
            _stop(workers)
    ordered = [done[job.index] for job in jobs]
    return [result for result, _ in ordered], [window for _, window in ordered]


def _start(placement: Placement, env: Mapping[str, str], log_path: Path) -> _Worker:
    lifeline = Lifeline()
    child_env = {**os.environ, **env, **placement.env, "OMP_NUM_THREADS": str(placement.threads)}
    try:
        with open(log_path, "wb") as log:
            process = subprocess.Popen(
                [sys.executable, "-m", "flows.sweep_branch"],
                env=lifeline.child_env(child_env),
                stdin=subprocess.PIPE,
                stdout=log,
                stderr=subprocess.STDOUT,
                pass_fds=lifeline.pass_fds,
                text=True,
            )
    except BaseException:
        lifeline.cut()
        raise
    lifeline.started()
    return _Worker(placement, process, lifeline, log_path)


def _give(worker: _Worker, job: BranchJob, scratch: Path) -> None:
    """Hand ``job`` to the idle ``worker``."""
    worker.job, worker.result_path = job, scratch / f"branch-{job.index}.json"
    line = {"threads": worker.placement.threads, "rerun": dict(job.rerun)}
    worker.process.stdin.write(json.dumps({**line, "result": str(worker.result_path)}) + "\n")
    worker.process.stdin.flush()


def _name(job: BranchJob) -> str:
    return f"branch b{job.index} ({job.label})"


def _outcome(job: BranchJob, path: Path) -> tuple[RerunResult, BranchProcess]:
    """The finished branch's result and window; :class:`BranchFailed` when it failed."""
    data = json.loads(path.read_text(encoding="utf-8"))
    if "error" in data:
        raise BranchFailed(f"{_name(job)}: {data['error']}")
    window = BranchProcess(job.index, data["pid"], data["started"], data["ended"])
    return result_from_json(data), window


def _tail(path: Path) -> str:
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").strip().splitlines()
    except OSError:
        return ""
    return lines[-1].strip() if lines else ""


def _stop(workers: Sequence[_Worker]) -> None:
    """End the branch processes: an idle one at the end of its input; one still running a
    branch is stopped (it unwinds and removes its branch). One that has not ended after
    :data:`STOP_GRACE_S` is killed."""
    for worker in workers:
        if worker.process.poll() is None:
            with contextlib.suppress(OSError):
                worker.process.stdin.close()
            if worker.job is not None and not worker.result_path.exists():
                worker.process.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + STOP_GRACE_S
    for worker in workers:
        try:
            worker.process.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            worker.process.kill()
            worker.process.wait()
        worker.lifeline.cut()


__all__ = [
    "BranchFailed",
    "BranchJob",
    "BranchProcess",
    "Placement",
    "check_parallel",
    "placements",
    "result_from_json",
    "run_branches",
    "visible_devices",
]
