"""A sweep's branches N at a time (``--parallel N``) against one after another, interleaved.

    .venv/bin/python bench/sweep_parallel.py [--pairs 3] [--size demo compute]
        [--from rollout advantage] [--points 4] [--parallel 2]

For each size (bench/vs_trl.py's ``SIZES``: the demo's work, and the compute-bound 3.2M-parameter
model with 64-token responses), a parent run of 2 steps is trained once (checkpoint every step,
no validation), then ``ppoflow rerun PARENT --step 2 --from STAGE --sweep …`` runs as a user runs
it, once with ``--parallel N`` and once without, in turn, ``--pairs`` times; each sweep's
wall time is its whole process (start-up included). The sweep is over the rollout temperature
(``--from rollout``: generation, reward, log-probs and the update per branch) or over the
clip ratio (``--from advantage``: the update only), ``--points`` values. Printed per cell:
the median wall time of each side, the median of the per-pair ratios parallel ÷ in turn
(< 1: parallel faster) with their range, and the load average.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PPOFLOW_PY = REPO / ".venv" / "bin" / "python"


def _sizes() -> dict:
    spec = importlib.util.spec_from_file_location("vs_trl", REPO / "bench" / "vs_trl.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["vs_trl"] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module.SIZES


#: the swept key and its values per --from stage
AXES = {
    "rollout": ("actor_rollout_ref.rollout.temperature", ("0.7", "1.0", "1.3", "1.6", "0.85", "1.15")),
    "advantage": ("actor_rollout_ref.actor.clip_ratio", ("0.1", "0.15", "0.25", "0.3", "0.35", "0.4")),
}  # fmt: skip


def ppoflow(*args: str, cwd: Path) -> str:
    done = subprocess.run(
        [str(PPOFLOW_PY), "-m", "flows", *args], cwd=cwd, capture_output=True, text=True
    )
    if done.returncode != 0:
        raise SystemExit(f"ppoflow {' '.join(args[:2])} failed: {done.stderr.strip()[-2000:]}")
    return done.stdout.strip().splitlines()[-1]


def parent_run(work: Path, size) -> str:
    """Data, model and a 2-step run of ``size`` under ``work``; the run directory."""
    ppoflow("make-demo-data", "outputs/demo/data", *size.data_options, cwd=work)
    ppoflow("make-tiny-model", "outputs/demo/model", *size.model_options, cwd=work)
    return ppoflow(
        "train", str(REPO / "configs" / "demo-cpu.yaml"), *size.ppoflow_overrides,
        "trainer.total_training_steps=2", "trainer.save_freq=1", "trainer.test_freq=0",
        "trainer.val_before_train=false", cwd=work,
    )  # fmt: skip


def timed_sweep(run: str, stage: str, points: int, parallel: int, out: Path, cwd: Path) -> float:
    key, values = AXES[stage]
    began = time.perf_counter()
    ppoflow(
        "rerun", run, "--step", "2", "--from", stage,
        "--sweep", f"{key}={','.join(values[:points])}",
        "--run-dir", str(out), "--parallel", str(parallel), cwd=cwd,
    )  # fmt: skip
    return time.perf_counter() - began


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--size", nargs="+", default=["demo", "compute"])
    parser.add_argument("--from", dest="stages", nargs="+", default=["rollout", "advantage"])
    parser.add_argument("--points", type=int, default=4, choices=range(2, 7))
    parser.add_argument("--parallel", type=int, default=2)
    args = parser.parse_args()
    sizes = _sizes()
    rows = []
    with tempfile.TemporaryDirectory(prefix="sweep-parallel-") as tmp:
        for name in args.size:
            work = Path(tmp) / name
            work.mkdir()
            run = parent_run(work, sizes[name])
            for stage in args.stages:
                at_once, in_turn = [], []
                for pair in range(args.pairs):
                    out = work / f"{stage}-{pair}"
                    at_once.append(timed_sweep(run, stage, args.points, args.parallel, Path(f"{out}-p"), work))  # fmt: skip
                    in_turn.append(timed_sweep(run, stage, args.points, 1, Path(f"{out}-s"), work))
                    print(f"{name} --from {stage} pair {pair + 1}: --parallel {args.parallel} "
                          f"{at_once[-1]:.1f} s, in turn {in_turn[-1]:.1f} s", flush=True)  # fmt: skip
                ratios = sorted(a / b for a, b in zip(at_once, in_turn, strict=True))
                rows.append((name, stage, statistics.median(at_once), statistics.median(in_turn), ratios))  # fmt: skip
    print(f"\n{args.points} branches, --parallel {args.parallel} vs in turn, {args.pairs} pairs, "
          f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f}")  # fmt: skip
    print(f"{'size':<8} {'--from':<10} {'parallel s':>10} {'in turn s':>10} {'ratio':>6}  pairs")
    for name, stage, a, b, ratios in rows:
        print(f"{name:<8} {stage:<10} {a:>10.1f} {b:>10.1f} {statistics.median(ratios):>6.2f}  "
              f"{ratios[0]:.2f}–{ratios[-1]:.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
