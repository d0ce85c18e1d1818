"""ppoflow's demo training vs TRL's GRPOTrainer on the same work, interleaved.

    make bench-trl-env     # once: .venv-bench with TRL 1.16 (never a ppoflow dependency)
    .venv/bin/python bench/vs_trl.py [--pairs 3] [--steps 12] [--size demo|compute] [--override KEY=VALUE …]
        [--before DIR] [--processes 1|2]

The same work on both sides: the demo task's data and the tiny model written by ppoflow's own
commands into a temp directory, 64 prompts × 4 samples per step, at most 16 response tokens
(``--size compute``: a 3.2M-parameter model, 16 prompts × 8 samples of at most 64 tokens,
prompts of 12–35 tokens; :data:`SIZES`), one optimizer step per generation round in
micro-batches of 16, AdamW at lr 3e-4 (betas
0.9 / 0.999, weight decay 0.01, gradient clip 1.0, constant lr), no KL, fp32, 2 torch threads,
CPU. ppoflow runs ``ppoflow train configs/demo-cpu.yaml`` (as ``python -m flows``, the
``ppoflow`` executable) as a user would (MLflow and console
logging, 2 reward workers, Prefect's temporary server), without validation or checkpoints; TRL
runs bench/trl_grpo_demo.py in the bench environment. Each run is a fresh process; the sides
alternate (ppoflow, TRL, ppoflow, TRL, …).

Per run: steady s/step (the median gap between consecutive step ends from step 3 on: ppoflow's
``step_<k>/journal.json`` written at the step's end, TRL's ``on_step_end``), spawn → first step
end, last step end → exit, the peak RSS of the largest process (GNU ``time``'s maximum
resident set over the process and the children it waited for), and the peak PSS of the whole
process tree (sampled every 0.25 s: shared pages split between the processes mapping them, so
the sum is what the tree costs the machine), and the CPU seconds (user + system, read at the same
samples) of the side's main process (ppoflow's trainer, TRL's one process) and of its whole tree
at the first step's end (the last sample before it): where the first step's wall time went.
Printed: the medians per side,
the per-pair ratios ppoflow ÷ TRL (< 1: ppoflow faster), ppoflow's stage breakdown (its
``timing_s/*`` metrics), and the load average. ``--before DIR`` adds a third side in each round,
ppoflow from another source tree (an older commit's worktree), and the ratios ppoflow ÷ before.
``--processes 2`` runs each side data-parallel over the 2 cores, one thread per process:
ppoflow's Ray worker group of 2 CPU ranks, TRL under ``torchrun``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[1]
PPOFLOW_PY = REPO / ".venv" / "bin" / "python"
BENCH_PY = REPO / ".venv-bench" / "bin" / "python"
#: how often the process tree's PSS is sampled (s); each sample reads every process's smaps
PSS_EVERY_S = 0.25


@dataclass(frozen=True)
class Size:
    """One work size: the model and data commands' options and each side's settings for it."""

    model_options: tuple[str, ...]
    data_options: tuple[str, ...]
    ppoflow_overrides: tuple[str, ...]
    trl_options: tuple[str, ...]


SIZES = {
    # the demo's work: configs/demo-cpu.yaml as shipped
    "demo": Size((), (), (), ()),
    # compute-bound: a 3.2M-parameter model, 16 prompts × 8 samples of up to 64 tokens, prompts
    # of varied length (answers of 1–24 letters: 12–35 prompt tokens)
    "compute": Size(
        ("--hidden-size", "256", "--layers", "4", "--intermediate-size", "768"),
        ("--answer-length", "1", "--max-answer-length", "24"),
        (
            "data.train_batch_size=16",
            "actor_rollout_ref.rollout.n=8",
            "data.max_response_length=64",
            "actor_rollout_ref.actor.ppo_mini_batch_size=16",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16",
        ),
        ("--samples", "8", "--completions", "128", "--micro", "16", "--max-tokens", "64"),
    ),
}
STAGE_TIMERS = ("gen", "reward", "old_log_prob", "adv", "update_actor", "step")


@dataclass
class Run:
    """One side's process: step end times (wall clock), spawn and exit times, peak RSS of its
    largest process, peak PSS of its whole process tree."""

    spawned: float
    exited: float
    step_ends: list[float]
    peak_rss_mib: float
    peak_tree_pss_mib: float
    timings: dict[str, float] = field(default_factory=dict)  # ppoflow: median timing_s/*
    #: (wall clock, main process's CPU s, whole tree's CPU s) at each sample
    cpu: list[tuple[float, float, float]] = field(default_factory=list)

    @property
    def s_per_step(self) -> float:
        gaps = [b - a for a, b in zip(self.step_ends[2:], self.step_ends[3:], strict=False)]
        return statistics.median(gaps)

    @property
    def to_first_step(self) -> float:
        return self.step_ends[0] - self.spawned

    @property
    def exit_after_last(self) -> float:
        return self.exited - self.step_ends[-1]

    @property
    def cpu_to_first_step(self) -> tuple[float, float]:
        """(main process, whole tree) CPU seconds at the last sample before the first step's end."""
        before = [(main, tree) for wall, main, tree in self.cpu if wall <= self.step_ends[0]]
        return before[-1] if before else (math.nan, math.nan)


def tree_sample(root: psutil.Process) -> tuple[float, float, float]:
    """(PSS MiB, main CPU s, tree CPU s) of ``root``'s descendants (``root`` is GNU time, whose
    one child is the side's main process): the proportional set size, each shared page counted
    once across the tree, split between the processes that map it; user + system CPU seconds."""
    pss, main, tree = 0, 0.0, 0.0
    try:
        children = root.children()
        processes = [*children, *(p for child in children for p in child.children(recursive=True))]
    except psutil.Error:
        return 0.0, 0.0, 0.0
    for process in processes:
        try:
            pss += process.memory_full_info().pss
            times = process.cpu_times()
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
        tree += times.user + times.system
        if process in children:
            main = times.user + times.system
    return pss / 2**20, main, tree


def timed(
    command: list[str], env: dict[str, str], log: Path, cwd: Path = REPO
) -> tuple[float, float, float, float, list[tuple[float, float, float]]]:
    """(spawn wall time, exit wall time, peak RSS MiB, peak tree PSS MiB, CPU samples) of
    ``command`` under GNU time, run in ``cwd``; the tree is sampled every :data:`PSS_EVERY_S`
    seconds (:func:`tree_sample`), each CPU sample as (wall clock, main CPU s, tree CPU s)."""
    spawned = time.time()
    peak_pss = 0.0
    cpu: list[tuple[float, float, float]] = []
    with log.open("w") as out:
        process = subprocess.Popen(
            ["/usr/bin/time", "-v", *command],
            env=env,
            cwd=cwd,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        watched = psutil.Process(process.pid)
        while process.poll() is None:
            pss, main, tree = tree_sample(watched)
            peak_pss = max(peak_pss, pss)
            cpu.append((time.time(), main, tree))
            time.sleep(PSS_EVERY_S)
    exited = time.time()
    text = log.read_text()
    if process.returncode != 0:
        raise RuntimeError(f"{command[:3]} exited {process.returncode}; see {log}:\n{text[-3000:]}")
    peak = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", text).group(1))
    return spawned, exited, peak / 1024, peak_pss, cpu


def ppoflow_command(
    work: Path,
    steps: int,
    index: int | str,
    extra: list[str],
    python: Path = PPOFLOW_PY,
    threads: int = 2,
) -> tuple[list[str], dict[str, str], Path]:
    """(command, environment, run directory) of one ppoflow training as a user runs it
    (``ppoflow train configs/demo-cpu.yaml``, as ``python -m flows``) on the demo inputs in
    ``work/demo``, ``steps`` steps without validation or checkpoints, ``extra`` overrides last,
    ``threads`` torch threads; run from the repository."""
    run_dir = work / f"ppoflow-run-{index}"
    overrides = [
        f"data.train_files=[{work}/demo/data/train.parquet]",
        f"data.val_files=[{work}/demo/data/val.parquet]",
        f"actor_rollout_ref.model.path={work}/demo/model",
        f"trainer.total_training_steps={steps}",
        "trainer.test_freq=-1",
        "trainer.val_before_train=false",
        "trainer.save_freq=-1",
        f"trainer.default_local_dir={work}/checkpoints-{index}",
        f"ppoflow.artifact_dir={work}/runs",
        f"ppoflow.mlflow_tracking_uri=sqlite:///{work}/mlflow.db",
        *extra,
    ]
    command = [str(python), "-m", "flows", "train", "configs/demo-cpu.yaml", *overrides]
    command += ["--run-dir", str(run_dir)]
    env = {
        **os.environ,
        "OMP_NUM_THREADS": str(threads),
        "PREFECT_HOME": str(work / "prefect-home"),
    }
    return command, env, run_dir


def run_ppoflow(
    work: Path,
    steps: int,
    index: int | str,
    extra: list[str],
    python: Path = PPOFLOW_PY,
    source: Path | None = None,
    threads: int = 2,
) -> Run:
    """One ppoflow training, in the repository, with ``threads`` torch threads; ``source``: in
    that source tree instead, e.g. a git worktree of an older commit (``python -m`` puts the
    working directory first on ``sys.path``, and ``PYTHONPATH`` names it too, before the
    editable install)."""
    command, env, run_dir = ppoflow_command(work, steps, index, extra, python, threads)
    if source is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(source), env.get("PYTHONPATH")]))
    log = work / f"ppoflow-{index}.log"
    spawned, exited, peak, pss, cpu = timed(command, env, log, source or REPO)
    journals = [json.loads((run_dir / f"step_{k}" / "journal.json").read_text()) for k in range(1, steps + 1)]  # fmt: skip
    ends = [(run_dir / f"step_{k}" / "journal.json").stat().st_mtime for k in range(1, steps + 1)]
    timings = {
        name: statistics.median(j["metrics"][f"timing_s/{name}"] for j in journals[2:])
        for name in STAGE_TIMERS
        if all(f"timing_s/{name}" in j["metrics"] for j in journals[2:])
    }
    return Run(spawned, exited, ends, peak, pss, timings, cpu)


def run_trl(
    work: Path,
    steps: int,
    index: int | str,
    options: tuple[str, ...] = (),
    processes: int = 1,
    threads: int = 2,
) -> Run:
    """One TRL training; ``processes`` > 1: that many data-parallel processes under torchrun,
    the ``threads`` split between them."""
    out = work / f"trl-{index}.jsonl"
    threads = max(1, threads // processes)
    launcher = [str(BENCH_PY)]
    if processes > 1:
        torchrun = BENCH_PY.parent / "torchrun"
        launcher = [str(torchrun), "--standalone", f"--nproc-per-node={processes}"]
    command = [
        *launcher,
        str(REPO / "bench" / "trl_grpo_demo.py"),
        "--model", str(work / "demo" / "model"),
        "--data", str(work / "demo" / "data" / "train.parquet"),
        "--steps", str(steps),
        "--out", str(out),
        "--threads", str(threads),
        *options,
    ]  # fmt: skip
    env = {
        **os.environ,
        "OMP_NUM_THREADS": str(threads),
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
    }
    env["HF_HOME"] = str(work / "hf-home")
    spawned, exited, peak, pss, cpu = timed(command, env, work / f"trl-{index}.log")
    records = [json.loads(line) for line in out.read_text().splitlines()]
    ends = [r["wall"] for r in records if "step" in r]
    return Run(spawned, exited, ends, peak, pss, cpu=cpu)


def describe(name: str, runs: list[Run]) -> str:
    def med(values) -> float:
        return statistics.median(values)

    return (
        f"  {name:<8} s/step {med(r.s_per_step for r in runs):6.3f}   spawn→first step "
        f"{med(r.to_first_step for r in runs):5.1f} s   last step→exit "
        f"{med(r.exit_after_last for r in runs):4.1f} s   peak RSS "
        f"{med(r.peak_rss_mib for r in runs):6.0f} MiB   process tree PSS "
        f"{med(r.peak_tree_pss_mib for r in runs):6.0f} MiB   CPU to first step: main "
        f"{med(r.cpu_to_first_step[0] for r in runs):4.1f} s, tree "
        f"{med(r.cpu_to_first_step[1] for r in runs):4.1f} s"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--size", choices=sorted(SIZES), default="demo")
    parser.add_argument(
        "--ppoflow-python",
        type=Path,
        default=PPOFLOW_PY,
        help="ppoflow's interpreter, e.g. .venv-vllm/bin/python with "
        "--override actor_rollout_ref.rollout.name=vllm (vLLM's CPU build)",
    )
    parser.add_argument(
        "--override",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an extra ppoflow override, e.g. algorithm.rollout_correction.bypass_mode=true",
    )
    parser.add_argument(
        "--before",
        type=Path,
        default=None,
        metavar="DIR",
        help="also run ppoflow from the source tree DIR (e.g. `git worktree add DIR REV`) in "
        "each round, before the current tree: before, ppoflow, TRL, …",
    )
    parser.add_argument(
        "--processes",
        type=int,
        choices=(1, 2),
        default=1,
        help="data-parallel processes per side, the 2 threads split between them: ppoflow's "
        "Ray worker group of that many CPU ranks (1 thread each), TRL under torchrun",
    )
    args = parser.parse_args()
    if not BENCH_PY.exists():
        sys.exit(f"error: {BENCH_PY} does not exist; run `make bench-trl-env` first")
    if args.steps < 5:
        sys.exit("error: --steps must be at least 5 (steady s/step is measured from step 3)")
    with tempfile.TemporaryDirectory(prefix="vs-trl-") as tmp:
        work = Path(tmp)
        size = SIZES[args.size]
        for command in (["make-demo-data", f"{work}/demo/data", *size.data_options], ["make-tiny-model", f"{work}/demo/model", *size.model_options]):  # fmt: skip
            subprocess.run([str(PPOFLOW_PY), "-m", "flows.cli", *command], check=True, cwd=REPO, capture_output=True)  # fmt: skip
        ours: list[Run] = []
        theirs: list[Run] = []
        before: list[Run] = []
        ranks = [] if args.processes == 1 else [
            "ppoflow.workers.backend=ray", f"trainer.n_gpus_per_node={args.processes}",
        ]  # fmt: skip
        overrides = [*size.ppoflow_overrides, *ranks, *args.override]
        for index in range(args.pairs):
            if args.before is not None:
                before.append(run_ppoflow(work, args.steps, f"before-{index}", overrides, args.ppoflow_python, args.before))  # fmt: skip
            ours.append(run_ppoflow(work, args.steps, index, overrides, args.ppoflow_python))
            theirs.append(run_trl(work, args.steps, index, size.trl_options, args.processes))
            print(f"pair {index + 1}: ppoflow {ours[-1].s_per_step:.3f} s/step, TRL "
                  f"{theirs[-1].s_per_step:.3f} s/step", flush=True)  # fmt: skip
    print(f"\n{args.size} size, {args.pairs} pairs × {args.steps} steps, load average "
          f"{os.getloadavg()[0]:.2f}")  # fmt: skip
    if args.processes > 1:
        print(f"  {args.processes} data-parallel processes per side, 1 thread each")
    if args.override or args.ppoflow_python != PPOFLOW_PY:
        print(f"  ppoflow: {args.ppoflow_python} {' '.join(args.override)}")
    if before:
        print(describe("before", before) + f"   ({args.before})")
    print(describe("ppoflow", ours))
    print(describe("TRL", theirs))
    comparisons = [("ppoflow ÷ TRL", ours, theirs)]
    if before:
        comparisons.append(("ppoflow ÷ before", ours, before))
    for label, side, baseline in comparisons:
        for what, key in (("s/step", "s_per_step"), ("spawn→first step", "to_first_step")):
            ratios = sorted(
                getattr(a, key) / getattr(b, key) for a, b in zip(side, baseline, strict=True)
            )
            print(f"  ratio {label}, {what}: {statistics.median(ratios):.2f} "
                  f"(pairs {ratios[0]:.2f}–{ratios[-1]:.2f})")  # fmt: skip
    breakdown = {
        name: statistics.median(run.timings[name] for run in ours)
        for name in STAGE_TIMERS
        if all(name in run.timings for run in ours)
    }
    print("  ppoflow stages (median timing_s/*): " + ", ".join(f"{k} {v:.3f}" for k, v in breakdown.items()))  # fmt: skip


if __name__ == "__main__":
    main()
