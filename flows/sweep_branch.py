"""The branches of a parallel sweep, in a process of its own: ``python -m flows.sweep_branch``
(started by flows/sweep_processes.py, one process per branch running at once).

Each line of its standard input is one branch's job, as JSON: ``threads`` (its torch threads),
``rerun`` (``flows.rerun._rerun``'s keyword arguments: the parent run, the step, ``--from`` /
``--to``, the branch's overrides and directory, ``--refresh``, ``mlflow_parent``) and ``result``
(a path). The branch runs as a ``ppo-rerun`` flow run of its own on the Prefect server that
``PREFECT_API_URL`` names, without its MLflow run (the sweep's process logs it); the ``result``
file then holds, as JSON, the branch's records, metrics, metric changes and engines
(:func:`result_json`) or ``{"error": one line}``, both with the process id and the branch's
wall-clock window. The process takes the next line, and ends at the end of its input (exit
status 0) or after a branch that failed (1).

The process ends with the sweep's (flows/process/lifeline.py), and SIGTERM unwinds it as a
stopped re-run (flows/process/stop_signals.py): the branch then leaves nothing (flows/rerun.py).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from flows.process.lifeline import watch


def result_json(result: Any) -> dict[str, Any]:
    """A ``flows.rerun.RerunResult`` (its MLflow run aside) as JSON data
    (``flows.sweep_processes.result_from_json`` reads it back)."""
    return {
        "run_dir": result.run_dir,
        "parent_dir": result.parent_dir,
        "step": result.step,
        "records": [record.to_json() for record in result.records],
        "metrics": result.metrics,
        "changes": [[c.name, c.before, c.after] for c in result.changes],
        "unchanged": result.unchanged,
        "engines_built": list(result.engines_built),
    }


def run(job: dict[str, Any]) -> dict[str, Any]:
    """Run the branch of ``job`` (module docstring); its :func:`result_json`."""
    import torch

    from flows.process.stop_signals import stop_on_signals
    from flows.rerun import rerun

    torch.set_num_threads(int(job["threads"]))
    with stop_on_signals():
        return result_json(rerun(**job["rerun"], log_mlflow=False))


def write_result(path: str, data: dict[str, Any]) -> None:
    partial = Path(f"{path}.partial")
    partial.write_text(json.dumps(data), encoding="utf-8")
    partial.replace(path)


def main() -> int:
    watch()
    for line in sys.stdin:
        job = json.loads(line)
        started = time.time()
        try:
            data, failed = run(job), False
        except BaseException as err:  # a stop too: the sweep's process reads why from the file
            data, failed = {"error": f"{type(err).__name__}: {err}".splitlines()[0]}, True
        data.update(pid=os.getpid(), started=started, ended=time.time())
        write_result(job["result"], data)
        if failed:
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
