"""Reward-pool isolation: the cost of a per-sample timeout, the pool's start-up, worker memory.

    flock /tmp/ppoflow-train.lock .venv/bin/python bench/reward_isolation.py \\
        [--before REV] [--after REV|worktree] [--pairs 3] [--workers 1] [--batch 32] \\
        [--hangs 8] [--timeout 1.0]

Two versions of ppoflow are measured in the same run: ``--before`` (default: the commit before
the zygote, 80057c8) and ``--after`` (default: HEAD; ``worktree`` = this checkout), each
exported with ``git archive`` into a temporary directory (dataproto, stages, flows). Each
measurement is a fresh Python process whose ``__main__`` is a driver script that starts as the
``ppoflow`` entry script does (``from flows.cli.app import app``, so it holds torch and Prefect, as a
training run's driver does), then:

1. starts a ``ScorerPool`` of ``--workers`` processes on a scorer file (timed: start-up);
2. reads every descendant process's RSS and PSS from ``/proc/<pid>/smaps_rollup`` (workers,
   and the server they come from: multiprocessing's forkserver before, the zygote after);
3. scores a control batch of ``--batch`` fast samples, then the same batch with ``--hangs`` of
   them hanging (``time.sleep(3600)``) under ``timeout_s = --timeout`` (each killed and its
   worker replaced).

Cost per timeout = (hung batch − control batch − hangs × timeout / workers) / hangs: the time a
timeout costs beyond the timeout itself (worker replacement). With one worker the samples run
one after the other, so the arithmetic is exact. The sides alternate (A B, B A, …); the script
prints each run, the medians, the ratio before ÷ after, and the load average at the start and
the end.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BEFORE = "80057c8"  # the last commit with the multiprocessing-forkserver pool
TREES = ("dataproto", "stages", "flows")

SCORER = """import time


def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    if solution_str == "sleep":
        time.sleep(3600)
    return float(solution_str)
"""

DRIVER = """from flows.cli.app import app  # noqa: F401  (the ppoflow entry script's import: torch, Prefect)

if __name__ == "__main__":
    import sys

    sys.path.insert(0, {bench!r})
    from reward_isolation import child_main

    child_main(sys.argv[1:])
"""


# --- inside one measured process ---------------------------------------------------------------


def _descendants(root: int) -> list[tuple[int, int, int]]:
    """(pid, parent pid, depth) of every live descendant of ``root``, parents first."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z":
            children.setdefault(int(fields[1]), []).append(int(entry.name))
    found, frontier = [], [(root, 0)]
    while frontier:
        pid, depth = frontier.pop(0)
        for child in sorted(children.get(pid, [])):
            found.append((child, pid, depth + 1))
            frontier.append((child, depth + 1))
    return found


def _memory_kib(pid: int) -> dict[str, int]:
    fields = {}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in ("Rss", "Pss"):
            fields[name.lower()] = int(value.split()[0])
    return fields


def _role(pid: int, depth: int) -> str:
    if depth > 1:
        return "worker"
    cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    for marker, role in (
        (b"stages.reward.zygote", "zygote"),
        (b"forkserver", "forkserver"),
        (b"resource_tracker", "resource tracker"),
    ):
        if marker in cmdline:
            return role
    return "other"


def _calls(solutions: list[str]) -> list[dict]:
    return [
        {"data_source": "bench", "solution_str": s, "ground_truth": "", "extra_info": None}
        for s in solutions
    ]


def child_main(argv: list[str]) -> None:
    """One measurement (module docstring); prints one JSON line."""
    from stages.reward.custom import ScorerRef
    from stages.reward.pool import ScorerPool

    parser = argparse.ArgumentParser()
    for name in ("--scorer", "--workers", "--batch", "--hangs", "--timeout"):
        parser.add_argument(name, required=True)
    args = parser.parse_args(argv)
    workers, batch, hangs, timeout = (
        int(args.workers),
        int(args.batch),
        int(args.hangs),
        float(args.timeout),
    )
    scorer = ScorerRef(name="compute_score", path=args.scorer)
    start = time.perf_counter()
    pool = ScorerPool(scorer, workers, startup_timeout_s=600.0)
    startup = time.perf_counter() - start
    memory = [
        {"role": _role(pid, depth), **_memory_kib(pid)}
        for pid, _, depth in _descendants(os.getpid())
    ]
    fast = [str(i) for i in range(batch)]
    every = max(1, batch // hangs)
    hung = ["sleep" if i % every == 1 and i // every < hangs else s for i, s in enumerate(fast)]
    try:
        pool.map(_calls(fast[: 2 * workers]), timeout)  # warm
        start = time.perf_counter()
        pool.map(_calls(fast), timeout)
        control = time.perf_counter() - start
        restarts = pool.restarts
        start = time.perf_counter()
        outcomes = pool.map(_calls(hung), timeout)
        hung_wall = time.perf_counter() - start
    finally:
        pool.close()
    timeouts = sum(o.status == "timeout" for o in outcomes)
    print(
        json.dumps(
            {
                "startup_s": startup,
                "control_s": control,
                "hung_s": hung_wall,
                "timeouts": timeouts,
                "restarts": pool.restarts - restarts,
                "per_timeout_s": (hung_wall - control - hangs * timeout / workers) / hangs,
                "memory": memory,
            }
        )
    )


# --- the driver of the comparison ------------------------------------------------------------


def _export(rev: str, into: Path) -> Path:
    if rev == "worktree":
        return REPO
    into.mkdir(parents=True)
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", rev, *TREES], check=True, capture_output=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


def _measure(tree: Path, driver: Path, scorer: Path, args: argparse.Namespace) -> dict:
    env = {**os.environ, "PYTHONPATH": str(tree), "OMP_NUM_THREADS": "1"}
    command = [sys.executable, str(driver), "--scorer", str(scorer)]
    for name in ("workers", "batch", "hangs", "timeout"):
        command += [f"--{name}", str(getattr(args, name))]
    done = subprocess.run(command, env=env, cwd=tree, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"measurement in {tree} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _memory_summary(memory: list[dict]) -> str:
    workers = [m for m in memory if m["role"] == "worker"]
    servers = [m for m in memory if m["role"] != "worker"]
    mean = lambda key, rows: statistics.mean(m[key] for m in rows) / 1024  # noqa: E731
    parts = [f"worker RSS {mean('rss', workers):.1f} MiB PSS {mean('pss', workers):.1f} MiB"]
    parts += [f"{m['role']} RSS {m['rss'] / 1024:.1f} PSS {m['pss'] / 1024:.1f}" for m in servers]
    total = sum(m["pss"] for m in memory) / 1024
    return "; ".join(parts) + f"; all processes PSS {total:.1f} MiB"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", default=BEFORE, help="revision measured first in each pair")
    parser.add_argument("--after", default="HEAD", help="revision, or 'worktree'")
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--hangs", type=int, default=8)
    parser.add_argument("--timeout", type=float, default=1.0)
    args = parser.parse_args()
    load_start = os.getloadavg()
    results: dict[str, list[dict]] = {"before": [], "after": []}
    with tempfile.TemporaryDirectory(prefix="reward-isolation-") as tmp:
        root = Path(tmp)
        trees = {
            "before": _export(args.before, root / "before"),
            "after": _export(args.after, root / "after"),
        }
        scorer = root / "bench_scorer.py"
        scorer.write_text(SCORER)
        driver = root / "driver.py"
        driver.write_text(DRIVER.format(bench=str(Path(__file__).resolve().parent)))
        for pair in range(args.pairs):
            order = ("before", "after") if pair % 2 == 0 else ("after", "before")
            for side in order:
                result = _measure(trees[side], driver, scorer, args)
                results[side].append(result)
                print(
                    f"pair {pair + 1} {side:<6} start-up {result['startup_s']:6.2f} s  control "
                    f"{result['control_s']:6.3f} s  hung {result['hung_s']:6.2f} s  "
                    f"({result['timeouts']} timeouts, {result['restarts']} restarts)  per timeout "
                    f"{result['per_timeout_s'] * 1e3:8.1f} ms  | {_memory_summary(result['memory'])}",
                    flush=True,
                )
    load_end = os.getloadavg()
    print(
        f"\n{args.batch} samples, {args.hangs} hang, timeout {args.timeout:g} s, {args.workers} worker(s); "
        f"before = {args.before}, after = {args.after}"
    )
    for key, label, scale, unit in (
        ("per_timeout_s", "cost per timeout", 1e3, "ms"),
        ("hung_s", "hung batch", 1.0, "s"),
        ("startup_s", "pool start-up", 1.0, "s"),
    ):
        before = statistics.median(r[key] for r in results["before"])
        after = statistics.median(r[key] for r in results["after"])
        print(
            f"{label:<18} median before {before * scale:9.2f} {unit}  after {after * scale:9.2f} {unit}  "
            f"ratio {before / after:8.1f}x"
        )
    for side in ("before", "after"):
        print(f"memory {side:<6} (last run): {_memory_summary(results[side][-1]['memory'])}")
    print(
        f"load average (1/5/15 min): start {load_start[0]:.2f}/{load_start[1]:.2f}/{load_start[2]:.2f}, "
        f"end {load_end[0]:.2f}/{load_end[1]:.2f}/{load_end[2]:.2f}; {os.cpu_count()} cores"
    )


if __name__ == "__main__":
    main()
