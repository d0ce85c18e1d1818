"""How much CPU each process of a demo training takes over its steady steps, two settings paired.

    .venv/bin/python bench/side_processes.py [--pairs 3] [--steps 80] [--threads 2]
        [--before KEY=VALUE …] [--after KEY=VALUE …]

Each run is ``ppoflow train configs/demo-cpu.yaml`` as ``make demo`` runs it
(bench/vs_trl.py's ``ppoflow_command``: ``python -m flows``, the ``ppoflow`` executable, with
Prefect's temporary server started ahead, MLflow's process, the reward zygote and its 2
workers), on the demo data and tiny model written into a temp directory, no validation, no
checkpoints, ``--threads`` torch threads. Every process of
the tree has its CPU seconds (user + system) read every :data:`SAMPLE_S` seconds; over the last
:data:`STEADY_SHARE` of the run (the steady steps: start-up and the first steps left out), each
process's CPU seconds ÷ the window's wall seconds is its share of a core (1.0 = one core busy).
The processes are grouped as the trainer (the command's process), Prefect's server, the MLflow
process and the reward zygote with its workers; the **side share** is the last three's CPU ÷
the whole tree's. The two sides (``--before`` overrides, then ``--after`` overrides) alternate,
``--pairs`` times; printed: each run, then the median of each group per side and the median of
the per-pair ratios after ÷ before of the side share.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))

from vs_trl import PPOFLOW_PY, REPO, ppoflow_command

#: seconds between two readings of the tree's CPU times
SAMPLE_S = 0.5
#: the last share of the run's readings that counts as its steady steps
STEADY_SHARE = 0.4
GROUPS = ("trainer", "server", "mlflow", "reward")


def group_of(process: psutil.Process, trainer_pid: int) -> str | None:
    """Which group a process of the tree belongs to (None: a short-lived helper, not counted)."""
    if process.pid == trainer_pid:
        return "trainer"
    command = " ".join(process.cmdline())
    if "prefect_server" in command or "uvicorn" in command:
        return "server"
    if "mlflow_process" in command:
        return "mlflow"
    if "reward" in command:
        return "reward"
    return None


def run_once(work: Path, index: str, overrides: list[str], steps: int, threads: int) -> dict:
    """One training: each group's share of a core over the steady window, and the side share."""
    command, env, _ = ppoflow_command(work, steps, index, overrides, threads=threads)
    log = (work / f"run-{index}.log").open("w")
    child = subprocess.Popen(command, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
    root = psutil.Process(child.pid)
    readings: list[tuple[float, dict[tuple[int, str], float]]] = []
    last: dict[tuple[int, str], float] = {}
    while child.poll() is None:
        try:
            tree = [root, *root.children(recursive=True)]
        except psutil.Error:
            break
        for process in tree:
            try:
                group = group_of(process, child.pid)
                if group is not None:
                    times = process.cpu_times()
                    last[(process.pid, group)] = times.user + times.system
            except psutil.Error:
                continue
        readings.append((time.monotonic(), dict(last)))
        time.sleep(SAMPLE_S)
    log.close()
    if child.wait() != 0:
        sys.exit(f"error: run {index} failed; its output: {work}/run-{index}.log")
    start_at, start = readings[int(len(readings) * (1 - STEADY_SHARE))]
    end_at, end = readings[-1]
    window = end_at - start_at
    shares = dict.fromkeys(GROUPS, 0.0)
    for (pid, group), seconds in end.items():
        shares[group] += (seconds - start.get((pid, group), 0.0)) / window
    side = sum(shares[group] for group in GROUPS[1:])
    return {**shares, "side_share": side / (side + shares["trainer"]), "window_s": window}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--steps", type=int, default=80)
    parser.add_argument("--threads", type=int, default=2, help="torch threads (make demo: 2)")
    parser.add_argument("--before", nargs="*", default=[], metavar="KEY=VALUE")
    parser.add_argument("--after", nargs="*", default=[], metavar="KEY=VALUE")
    args = parser.parse_args()
    if args.steps < 20:
        sys.exit("error: --steps must be at least 20 (the steady window is the last 40 %)")
    sides: dict[str, list[dict]] = {"before": [], "after": []}
    with tempfile.TemporaryDirectory(prefix="side-processes-") as tmp:
        work = Path(tmp)
        for what in (["make-demo-data", f"{work}/demo/data"], ["make-tiny-model", f"{work}/demo/model"]):  # fmt: skip
            subprocess.run([str(PPOFLOW_PY), "-m", "flows.cli", *what], check=True, cwd=REPO, capture_output=True)  # fmt: skip
        for index in range(args.pairs):
            for side, overrides in (("before", args.before), ("after", args.after)):
                result = run_once(work, f"{side}-{index}", overrides, args.steps, args.threads)
                sides[side].append(result)
                print(f"pair {index + 1} {side:<6} " + "  ".join(
                    f"{key} {value:.3f}" for key, value in result.items()), flush=True)  # fmt: skip
    print(f"\n{args.pairs} pairs × {args.steps} steps, {args.threads} torch threads, "
          f"load average {os.getloadavg()[0]:.2f}")  # fmt: skip
    for side, overrides in (("before", args.before), ("after", args.after)):
        medians = {key: statistics.median(r[key] for r in sides[side]) for key in (*GROUPS, "side_share")}  # fmt: skip
        print(f"  {side:<6} {' '.join(overrides) or '(defaults)'}: " + ", ".join(
            f"{key} {value:.3f}" for key, value in medians.items()))  # fmt: skip
    ratios = sorted(a["side_share"] / b["side_share"] for a, b in zip(sides["after"], sides["before"], strict=True))  # fmt: skip
    print(f"  side share after ÷ before: {statistics.median(ratios):.2f} "
          f"(pairs {ratios[0]:.2f}–{ratios[-1]:.2f})")  # fmt: skip


if __name__ == "__main__":
    main()
