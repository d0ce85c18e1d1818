"""ppoflow vs TRL on the same work over a matrix of shapes, interleaved pairs per cell.

    make bench-trl-env     # once: .venv-bench with TRL 1.16 (never a ppoflow dependency)
    .venv/bin/python bench/vs_trl_matrix.py [--pairs 3] [--steps 10] [--size demo compute]
        [--micro 16 whole] [--prompts fixed varied] [--old reuse recompute] [--threads 1 2]

Each cell is one combination of the axes; both sides do the same work there (bench/vs_trl.py
says how each side is run and measured):

- ``--size``: bench/vs_trl.py's ``SIZES`` (the demo's 0.33M-parameter model, 64 prompts × 4
  samples of up to 16 tokens; the compute one, 3.2M parameters, 16 prompts × 8 samples of up to
  64 tokens);
- ``--micro``: the update in micro-batches of 16 rows, or the whole batch as one (ppoflow's
  ``ppo_micro_batch_size_per_gpu`` and ``log_prob_micro_batch_size_per_gpu``, TRL's
  ``--micro``);
- ``--prompts``: every prompt of one length (one-letter answers), or lengths drawn from 12–35
  tokens (answers of 1–24 letters);
- ``--old``: ppoflow's old log-probs reused from the rollout (``bypass_mode=true``) or
  recomputed by the actor (``false``); TRL, with one update per generation, never recomputes
  them (it takes the update's own, detached), so this axis moves ppoflow's side only;
- ``--threads``: torch threads of each side's one process.

Printed per cell: the median steady s/step of each side, the median of the per-pair ratios
ppoflow ÷ TRL (< 1: ppoflow faster) with their range, the same for spawn → first step end, and
ppoflow's stage split (median ``timing_s/*``). The load average closes the table.
"""

from __future__ import annotations

import argparse
import importlib.util
import itertools
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _vs_trl():
    spec = importlib.util.spec_from_file_location("vs_trl", REPO / "bench" / "vs_trl.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["vs_trl"] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


VS = _vs_trl()
#: rows per step of each size (prompts × samples): the whole-batch micro-batch
ROWS = {"demo": 256, "compute": 128}
PROMPTS = {"fixed": ("--answer-length", "1"), "varied": ("--answer-length", "1", "--max-answer-length", "24")}  # fmt: skip
OLD = {"reuse": "true", "recompute": "false"}


def inputs(work: Path, size, prompts: str) -> None:
    """The demo data (``prompts``' lengths) and the model of ``size``, under ``work/demo``."""
    commands = (
        ["make-demo-data", f"{work}/demo/data", *PROMPTS[prompts]],
        ["make-tiny-model", f"{work}/demo/model", *size.model_options],
    )
    for command in commands:
        subprocess.run([str(VS.PPOFLOW_PY), "-m", "flows.cli", *command], check=True, cwd=REPO, capture_output=True)  # fmt: skip


def cell_sides(name: str, micro: str, old: str) -> tuple[list[str], tuple[str, ...]]:
    """(ppoflow's overrides, TRL's options) of a cell."""
    size = VS.SIZES[name]
    overrides = [*size.ppoflow_overrides, f"algorithm.rollout_correction.bypass_mode={OLD[old]}"]
    options = size.trl_options
    if micro == "whole":
        rows = ROWS[name]
        overrides += [
            f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={rows}",
            f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={rows}",
        ]
        options = (*options, "--micro", str(rows))
    return overrides, options


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--size", nargs="+", default=["demo", "compute"], choices=sorted(ROWS))
    parser.add_argument("--micro", nargs="+", default=["16", "whole"], choices=["16", "whole"])
    parser.add_argument("--prompts", nargs="+", default=["fixed", "varied"], choices=sorted(PROMPTS))  # fmt: skip
    parser.add_argument("--old", nargs="+", default=["reuse", "recompute"], choices=sorted(OLD))
    parser.add_argument("--threads", nargs="+", type=int, default=[1, 2], choices=[1, 2])
    args = parser.parse_args()
    if not VS.BENCH_PY.exists():
        sys.exit(f"error: {VS.BENCH_PY} does not exist; run `make bench-trl-env` first")
    if args.steps < 5:
        sys.exit("error: --steps must be at least 5 (steady s/step is measured from step 3)")
    rows = []
    with tempfile.TemporaryDirectory(prefix="vs-trl-matrix-") as tmp:
        for name, prompts in itertools.product(args.size, args.prompts):
            work = Path(tmp) / f"{name}-{prompts}"
            inputs(work, VS.SIZES[name], prompts)
            for micro, old, threads in itertools.product(args.micro, args.old, args.threads):
                overrides, options = cell_sides(name, micro, old)
                cell = f"{name} micro={micro} prompts={prompts} old={old} threads={threads}"
                ours, theirs = [], []
                for pair in range(args.pairs):
                    tag = f"{micro}-{old}-{threads}-{pair}"
                    ours.append(VS.run_ppoflow(work, args.steps, tag, overrides, threads=threads))
                    theirs.append(VS.run_trl(work, args.steps, tag, options, threads=threads))
                    print(f"{cell} pair {pair + 1}: ppoflow {ours[-1].s_per_step:.3f} s/step, "
                          f"TRL {theirs[-1].s_per_step:.3f}", flush=True)  # fmt: skip
                rows.append((cell, ours, theirs))
    print(f"\n{args.pairs} pairs × {args.steps} steps per cell, {os.cpu_count()} cores, "
          f"load average {os.getloadavg()[0]:.2f}")  # fmt: skip
    for cell, ours, theirs in rows:
        step = sorted(a.s_per_step / b.s_per_step for a, b in zip(ours, theirs, strict=True))
        first = sorted(a.to_first_step / b.to_first_step for a, b in zip(ours, theirs, strict=True))
        split = {
            key: statistics.median(run.timings[key] for run in ours)
            for key in VS.STAGE_TIMERS
            if all(key in run.timings for run in ours)
        }
        print(f"{cell}\n  s/step ppoflow {statistics.median(a.s_per_step for a in ours):.3f}, "
              f"TRL {statistics.median(b.s_per_step for b in theirs):.3f}: ratio "
              f"{statistics.median(step):.2f} ({step[0]:.2f}–{step[-1]:.2f}); first step ratio "
              f"{statistics.median(first):.2f} ({first[0]:.2f}–{first[-1]:.2f})\n  ppoflow stages: "
              + ", ".join(f"{k} {v:.3f}" for k, v in split.items()))  # fmt: skip


if __name__ == "__main__":
    main()
