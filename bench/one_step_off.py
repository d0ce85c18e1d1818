"""Schedules that generate while training against on policy: samples per second, each side's
idle time, and learning.

    OMP_NUM_THREADS=1 flock /tmp/ppoflow-train.lock .venv-vllm/bin/python bench/one_step_off.py \
        [--backend vllm|hf] [--shapes 64x16,64x64,16x64] [--steps 12] [--pairs 3] \
        [--schedules on_policy,one_step_off,fully_async,partial]
    ... bench/one_step_off.py --curve [--steps 150] [--seeds 1,2,3] [--test-freq 10]

Both sides run configs/demo-cpu.yaml (GRPO, n = 4, the tiny model) through ``ppoflow train`` on
a fresh demo dataset, one process per run, every thread count 1 (2-core machine: the trainer on
one core, the rollout on the other once it runs apart):

- **on_policy** (the baseline): the actor generates, then trains (vLLM in the trainer's process
  with ``--backend vllm``, HF ``generate`` on the actor's module with ``hf``);
- **one_step_off**: ``ppoflow.schedule=one_step_off``, the rollout of step k + 1 on the
  backend's replica (vLLM's engine core in its own process; HF in a process of its own) while
  step k trains;
- **fully_async**: ``ppoflow.schedule=fully_async`` with s = 0, T = 2 (2 batches ahead, a sync
  every 2 steps), whole batches (``partial_rollout=false``);
- **partial**: the same with partial rollouts (each sync cuts the batch in flight).

``--schedules`` picks them (default: on_policy and one_step_off); each is compared with
on_policy, which always runs.

**Throughput** (default): for each shape ``PROMPTSxTOKENS`` (prompts per step × response
tokens), ``--pairs`` pairs of runs of ``--steps`` steps, the two sides interleaved (on, off, on,
off…). Per run, from each step's journal (``ppoflow inspect --json``), steps 2… (step 1 starts
the engines): samples/s = rows trained ÷ Σ ``timing_s/step``; the trainer's idle share = Σ the
time it waited for the rollout ÷ Σ step time (on policy: ``timing_s/gen``, the generation it
waits through; one step off: ``timing_s/rollout_wait``); the rollout's idle share = 1 − Σ
``timing_s/gen`` ÷ Σ step time. The table gives medians over the pairs and the median of the
per-pair ratios off ÷ on.

**Learning** (``--curve``): each side once per seed for ``--steps`` steps with greedy
validation every ``--test-freq`` steps; the validation score per trained sample, the mean and
the spread (max − min) over the seeds, per schedule.

Both sides run ``algorithm.rollout_correction.bypass_mode=--bypass`` (default true: the old
log-probs are the rollout's, no recompute pass, one step off's default and on-policy ``hf``'s),
so the work per step is the same and only the schedule differs.

The load average is printed at the start and the end. Record the figures in bench/README.md.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import tempfile
from pathlib import Path

from demo_runs import make_demo, train_demo

N = 4  # rollout.n of demo-cpu.yaml
_FULLY_ASYNC = [
    "ppoflow.schedule=fully_async",
    "async_training.staleness_threshold=0",
    "async_training.trigger_parameter_sync_step=2",
]
#: name → the overrides that choose it
SCHEDULES = {
    "on_policy": ["ppoflow.schedule=on_policy"],
    "one_step_off": ["ppoflow.schedule=one_step_off"],
    "fully_async": [*_FULLY_ASYNC, "async_training.partial_rollout=false"],
    "partial": [*_FULLY_ASYNC, "async_training.partial_rollout=true"],
}
VALIDATION = re.compile(r"validation @ step (\d+): score (-?[0-9.]+)")


def train(root: Path, name: str, schedule: str, extra: list[str], env) -> tuple[str, list[dict]]:
    """One training of a schedule: (its console output, each step's metrics in step order)."""
    return train_demo(root, name, "configs/demo-cpu.yaml", [*SCHEDULES[schedule], *extra], env)


def throughput(steps: list[dict], rows: int) -> dict[str, float]:
    """samples/s and each side's idle share over steps 2… (module docstring): the trainer waits
    for the generation on policy, for the replica (``timing_s/rollout_wait``) otherwise."""
    timed = steps[1:]
    wall = sum(m["timing_s/step"] for m in timed)
    gen = sum(m["timing_s/gen"] for m in timed)
    waited = sum(m.get("timing_s/rollout_wait", m["timing_s/gen"]) for m in timed)
    return {
        "samples_per_s": rows * len(timed) / wall,
        "trainer_idle": waited / wall,
        "rollout_idle": max(0.0, 1 - gen / wall),
        "step_s": wall / len(timed),
        "gen_s": gen / len(timed),
    }


def shape_overrides(shape: str, args) -> tuple[list[str], int]:
    prompts, tokens = (int(part) for part in shape.split("x"))
    return [
        f"algorithm.rollout_correction.bypass_mode={args.bypass}",
        f"data.train_batch_size={prompts}",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={prompts}",
        f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={min(16, prompts * N)}",
        f"data.max_response_length={tokens}",
        f"actor_rollout_ref.rollout.name={args.backend}",
        f"trainer.total_training_steps={args.steps}",
        "trainer.test_freq=-1",
        "trainer.val_before_train=false",
    ], prompts * N


def bench_throughput(root: Path, args, env) -> None:
    print(
        f"backend {args.backend}; {args.steps} steps per run (step 1 not timed); {args.pairs} pairs"
    )
    header = (
        f"{'shape':>8} {'schedule':>13} {'samples/s':>10} {'step s':>7} {'gen s':>6} "
        f"{'trainer idle':>13} {'rollout idle':>13} {'vs on':>7}"
    )
    print(header)
    schedules = chosen(args)
    for shape in args.shapes.split(","):
        extra, rows = shape_overrides(shape, args)
        results: dict[str, list[dict]] = {name: [] for name in schedules}
        for pair in range(args.pairs):
            for schedule in schedules:
                name = f"{shape}-{schedule}-{pair}"
                _, steps = train(root, name, schedule, extra, env)
                results[schedule].append(throughput(steps, rows))
        for schedule in schedules:
            runs = results[schedule]
            ratios = [
                run["samples_per_s"] / on["samples_per_s"]
                for on, run in zip(results["on_policy"], runs, strict=True)
            ]

            def median(key: str, runs=runs) -> float:
                return statistics.median(run[key] for run in runs)

            ratio = f"{statistics.median(ratios):>6.2f}×" if schedule != "on_policy" else ""
            pairs = f"  ({', '.join(f'{r:.2f}' for r in ratios)})" if ratio else ""
            print(
                f"{shape:>8} {schedule:>13} {median('samples_per_s'):>10.1f} "
                f"{median('step_s'):>7.2f} {median('gen_s'):>6.2f} "
                f"{median('trainer_idle'):>12.0%} {median('rollout_idle'):>12.0%} {ratio:>7}{pairs}"
            )


def chosen(args) -> list[str]:
    """``--schedules``, on_policy first (the baseline every other one is compared with)."""
    names = [name for name in args.schedules.split(",") if name]
    unknown = [name for name in names if name not in SCHEDULES]
    if unknown:
        raise SystemExit(f"--schedules: {unknown} unknown; choose from {list(SCHEDULES)}")
    return ["on_policy", *(name for name in names if name != "on_policy")]


def bench_curve(root: Path, args, env) -> None:
    rows = 64 * N  # demo-cpu.yaml's batch
    print(
        f"backend {args.backend}; {args.steps} steps, validation every {args.test_freq}; "
        f"seeds {args.seeds}"
    )
    schedules = chosen(args)
    curves: dict[str, dict[int, list[float]]] = {name: {} for name in schedules}
    for seed in args.seeds.split(","):
        for schedule in schedules:
            out, _ = train(
                root,
                f"curve-{schedule}-{seed}",
                schedule,
                [
                    f"trainer.seed={seed}",
                    f"algorithm.rollout_correction.bypass_mode={args.bypass}",
                    f"trainer.total_training_steps={args.steps}",
                    f"trainer.test_freq={args.test_freq}",
                    f"actor_rollout_ref.rollout.name={args.backend}",
                ],
                env,
            )
            for step, score in VALIDATION.findall(out):
                curves[schedule].setdefault(int(step), []).append(float(score))
    print(f"{'trained samples':>16} " + " ".join(f"{s + ' mean (spread)':>28}" for s in schedules))
    for step in sorted(curves["on_policy"]):
        cells = []
        for schedule in schedules:
            scores = curves[schedule].get(step, [])
            spread = max(scores) - min(scores) if scores else float("nan")
            mean = statistics.fmean(scores) if scores else float("nan")
            cells.append(f"{mean:>19.3f} ({spread:.3f})")
        print(f"{step * rows:>16} " + " ".join(f"{cell:>28}" for cell in cells))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--backend", choices=("vllm", "hf"), default="vllm")
    parser.add_argument("--shapes", default="64x16,64x64,16x64")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--curve", action="store_true", help="learning per sample instead")
    parser.add_argument("--seeds", default="1,2,3")
    parser.add_argument("--test-freq", type=int, default=10)
    parser.add_argument("--bypass", choices=("true", "false"), default="true")
    parser.add_argument("--schedules", default="on_policy,one_step_off")
    args = parser.parse_args()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    print(f"load average at start: {os.getloadavg()}")
    with tempfile.TemporaryDirectory(prefix="one-step-off-") as tmp:
        root = Path(tmp)
        make_demo(root, env)
        (bench_curve if args.curve else bench_throughput)(root, args, env)
    print(f"load average at end: {os.getloadavg()}")


if __name__ == "__main__":
    main()
