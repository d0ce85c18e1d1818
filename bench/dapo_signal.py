"""DAPO's dynamic sampling on the demo task: learning per generated sample and per wall second,
and the share of samples that carry no learning signal, against the same run without it.

    OMP_NUM_THREADS=1 flock /tmp/ppoflow-train.lock .venv/bin/python bench/dapo_signal.py \
        [--steps 150] [--test-freq 10] [--reward dense|pass-fail] [--plot docs/img/FILE.png]

Both sides run ``configs/dapo-cpu.yaml`` (clip-higher, token-mean, overlong shaping, no KL) on a
fresh demo dataset and tiny model, through ``ppoflow train``:

- **off** (the baseline): ``algorithm.filter_groups.enable=false``, one generation batch of
  ``train_batch_size`` = 64 prompts × n = 4 per step, every group trained on;
- **on**: the config as shipped: rounds of ``gen_batch_size`` = 96 prompts × 4 until 64 groups
  with a spread of rewards are kept.

Each side runs ``--steps`` steps with greedy validation every ``--test-freq`` steps. Generated
samples per step = ``train/num_gen_batches`` × generation batch × n (from each step's journal);
wall seconds = the running sum of ``timing_s/step``. The table compares the validation score at
the same number of generated samples (the other side's score linearly interpolated between its
validations) and at the same wall time; ``signal/zero_adv_sample_frac`` (training samples whose
advantage is 0: their group's rewards had no spread) and the share of generated samples the
filter evicted show where the off side's steps carried nothing. The two sides run one after the
other (not interleaved: each is one long training); the load average is printed at the start
and the end. Record the figures in bench/README.md.

``--reward pass-fail`` scores with ``bench/scorers/demo_pass_fail.py`` instead of the demo's
dense score: 1 when the response starts with the answer, else 0 (the demo scorer's ``acc``), the
kind of reward dynamic sampling is made for. ``--plot`` draws the validation score against
generated samples and against wall seconds, and the zero-advantage share of each step's
training samples, for both sides (the README's figure).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import tempfile
from pathlib import Path

from demo_runs import REPO, make_demo, ppoflow

N = 4  # rollout.n of demo-cpu.yaml
VALIDATION = re.compile(r"validation @ step (\d+): score (-?[0-9.]+)")
PASS_FAIL = REPO / "bench" / "scorers" / "demo_pass_fail.py"
REWARDS = {
    "dense": [],
    "pass-fail": [
        f"reward.custom_reward_function.path={PASS_FAIL}",
        "reward.custom_reward_function.name=compute_score",
    ],
}


def run_side(name: str, extra: list[str], root: Path, args, env) -> dict:
    """One training: its validations {step: score} and per step (samples, seconds, metrics)."""
    run_dir = root / name
    out = ppoflow(
        "train", "configs/dapo-cpu.yaml",
        f"data.train_files=[{root}/data/train.parquet]",
        f"data.val_files=[{root}/data/val.parquet]",
        f"actor_rollout_ref.model.path={root}/model",
        f"trainer.total_training_steps={args.steps}", f"trainer.test_freq={args.test_freq}",
        "trainer.save_freq=-1", "trainer.logger=[console]",
        f"trainer.default_local_dir={root}/{name}-checkpoints",
        f"ppoflow.artifact_dir={root}/store", *extra, "--run-dir", str(run_dir),
        env=env,
    )  # fmt: skip
    validations = {int(step): float(score) for step, score in VALIDATION.findall(out)}
    inspected = json.loads(ppoflow("inspect", str(run_dir), "--json", env=env))
    gen_batch = int(inspected["config"]["data"]["gen_batch_size"] or 64)
    steps, samples, seconds = [], 0, 0.0
    for step in sorted(inspected["steps"], key=lambda s: s["step"]):
        metrics = step["metrics"]
        samples += int(metrics.get("train/num_gen_batches", 1)) * gen_batch * N
        seconds += float(metrics["timing_s/step"])
        steps.append({"step": step["step"], "samples": samples, "seconds": seconds, **metrics})
    return {"validations": validations, "steps": steps}


def at(side: dict, key: str) -> list[tuple[float, float]]:
    """(samples or seconds at the validation, score): step 0 is at 0."""
    position = {s["step"]: s[key] for s in side["steps"]}
    return [(position.get(step, 0.0), score) for step, score in sorted(side["validations"].items())]


def interpolate(points: list[tuple[float, float]], x: float) -> float | None:
    for (x0, y0), (x1, y1) in itertools.pairwise(points):
        if x0 <= x <= x1:
            return y0 if x1 == x0 else y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    return None


def mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--test-freq", type=int, default=10)
    parser.add_argument("--reward", choices=sorted(REWARDS), default="dense")
    parser.add_argument("--plot", type=Path, default=None, help="write the figure here (.png)")
    args = parser.parse_args()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    print(f"load average at start: {os.getloadavg()}")
    with tempfile.TemporaryDirectory(prefix="dapo-signal-") as tmp:
        root = Path(tmp)
        make_demo(root, env)
        sides = {
            "off": run_side(
                "off",
                ["algorithm.filter_groups.enable=false", "data.gen_batch_size=64",
                 *REWARDS[args.reward]],
                root, args, env,
            ),
            "on": run_side("on", REWARDS[args.reward], root, args, env),
        }  # fmt: skip
    print(f"load average at end: {os.getloadavg()}")
    for name, side in sides.items():
        last = side["steps"][-1]
        rounds = [s.get("train/num_gen_batches", 1.0) for s in side["steps"]]
        zero_adv = [s.get("signal/zero_adv_sample_frac", float("nan")) for s in side["steps"]]
        print(
            f"{name}: {len(side['steps'])} steps, {last['samples']} generated samples, "
            f"{last['seconds']:.0f} s of steps; rounds per step mean {mean(rounds):.2f} "
            f"max {max(rounds):.0f}; zero-advantage training samples mean {mean(zero_adv):.3f} "
            f"(steps 1-10: {mean(zero_adv[:10]):.3f}, last 10: {mean(zero_adv[-10:]):.3f})"
        )
        if name == "on":
            evicted = [
                s["training/filter_groups/evicted_samples"]
                / s["training/filter_groups/generated_samples"]
                for s in side["steps"]
            ]
            print(f"on: generated samples the filter evicted, mean per step {mean(evicted):.3f}")
    for key, unit in (("samples", "generated samples"), ("seconds", "wall s of steps")):
        print(f"\nvalidation score at the same {unit} (off = baseline)")
        print(f"{unit:>20} {'off':>8} {'on':>8} {'on − off':>9}")
        off, on = at(sides["off"], key), at(sides["on"], key)
        for x, score_off in off[1:]:
            score_on = interpolate(on, x)
            if score_on is None:
                continue
            print(f"{x:>20.0f} {score_off:>8.3f} {score_on:>8.3f} {score_on - score_off:>+9.3f}")
    if args.plot is not None:
        plot(sides, args, args.plot)
        print(f"\nfigure: {args.plot}")


def plot(sides: dict, args, path: Path) -> None:
    """Three panels: validation score per generated sample and per wall second of steps, and
    ``signal/zero_adv_sample_frac`` per step, off (baseline) against on."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
    styles = {
        "off": ("tab:gray", "no filtering (baseline)"),
        "on": ("tab:blue", "dynamic sampling"),
    }
    for name, side in sides.items():
        color, label = styles[name]
        for axis, key in zip(axes[:2], ("samples", "seconds"), strict=True):
            xs, ys = zip(*at(side, key), strict=True)
            axis.plot(xs, ys, marker="o", markersize=3, color=color, label=label)
        steps = [s["step"] for s in side["steps"]]
        zero = [s.get("signal/zero_adv_sample_frac", float("nan")) for s in side["steps"]]
        axes[2].plot(steps, zero, color=color, label=label, linewidth=1)
    axes[0].set(xlabel="generated samples", ylabel="greedy validation score")
    axes[1].set(xlabel="wall seconds of steps", ylabel="greedy validation score")
    axes[2].set(xlabel="step", ylabel="trained samples with zero advantage", ylim=(-0.02, 1.02))
    for axis in axes:
        axis.grid(alpha=0.3)
    axes[0].legend(loc="lower right", fontsize=8)
    fig.suptitle(
        f"DAPO dynamic sampling, demo task ({args.reward} reward), 64 groups × 4 per step, "
        f"{args.steps} steps, tiny model, 2-core CPU",
        fontsize=10,
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
