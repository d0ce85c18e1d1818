"""The demo training's step time with artifacts written in the background vs inside each stage.

    .venv/bin/python bench/background_writes.py [--pairs 3] [--steps 12] [--override KEY=VALUE …]

``ppoflow train configs/demo-cpu.yaml`` as in bench/vs_trl.py (the demo's data and tiny model
written into a temp directory, no validation or checkpoints, fresh processes), once with
``ppoflow.artifacts.write_in_background=true`` (the default: the fingerprint computed in memory,
the files written by one writer thread while the step goes on, the step ending when its writes
have; flows/runs/artifact_writer.py) and once with ``false`` (the baseline: every artifact written
inside its stage), alternating in the same run. Per run: steady s/step (the median gap between
consecutive step ends from step 3 on) and the median ``timing_s/*`` of the stages. Printed: the
medians per side, the per-pair ratios baseline ÷ background (> 1: background faster), and the
load average.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from vs_trl import PPOFLOW_PY, REPO, STAGE_TIMERS, Run, run_ppoflow

SIDES = {"inline": "false", "background": "true"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--override", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args()
    if args.steps < 5:
        sys.exit("error: --steps must be at least 5 (steady s/step is measured from step 3)")
    runs: dict[str, list[Run]] = {side: [] for side in SIDES}
    with tempfile.TemporaryDirectory(prefix="background-writes-") as tmp:
        work = Path(tmp)
        for command in (["make-demo-data", f"{work}/demo/data"], ["make-tiny-model", f"{work}/demo/model"]):  # fmt: skip
            subprocess.run([str(PPOFLOW_PY), "-m", "flows.cli", *command], check=True, cwd=REPO, capture_output=True)  # fmt: skip
        for index in range(args.pairs):
            for position, (side, value) in enumerate(SIDES.items()):
                extra = [*args.override, f"ppoflow.artifacts.write_in_background={value}"]
                runs[side].append(run_ppoflow(work, args.steps, 2 * index + position, extra))
            print(f"pair {index + 1}: " + ", ".join(
                f"{side} {runs[side][-1].s_per_step:.3f} s/step" for side in SIDES), flush=True)  # fmt: skip
    print(f"\n{args.pairs} pairs × {args.steps} steps, load average {os.getloadavg()[0]:.2f}")
    for side, side_runs in runs.items():
        stages = {
            name: statistics.median(run.timings[name] for run in side_runs)
            for name in STAGE_TIMERS
            if all(name in run.timings for run in side_runs)
        }
        print(f"  {side:<10} s/step {statistics.median(r.s_per_step for r in side_runs):.3f}   "
              + ", ".join(f"{k} {v:.3f}" for k, v in stages.items()))  # fmt: skip
    ratios = sorted(
        a.s_per_step / b.s_per_step for a, b in zip(runs["inline"], runs["background"], strict=True)
    )
    print(f"  ratio inline ÷ background, s/step: {statistics.median(ratios):.3f} "
          f"(pairs {ratios[0]:.3f}–{ratios[-1]:.3f})")  # fmt: skip


if __name__ == "__main__":
    main()
