"""Time the demo-size PPO step as a Prefect subflow run against the same step as a plain call.

Run from the repository root (under the training lock, as every bench):

    flock /tmp/ppoflow-train.lock .venv/bin/python bench/prefect_subflow.py
    flock /tmp/ppoflow-train.lock .venv/bin/python bench/prefect_subflow.py --pairs 12
    flock /tmp/ppoflow-train.lock .venv/bin/python bench/prefect_subflow.py --quick   # smoke run

One training run of configs/demo-cpu.yaml (64 prompts × n 4 = 256 sequences, R = 16, the tiny
model and the demo task written to a temp dir, as ``ppoflow make-demo-data`` and ``ppoflow
make-tiny-model`` write them) inside one Prefect flow run, as ``ppoflow train`` runs it: the
engines are built once by ``flows.train.open_run``, then each step is ``flows.train.train_step``
(the step input, the step's stages as cached Prefect tasks with every weight writer computed,
the step metrics), with the step's ``run_step`` called in one of three ways:

* ``fn``: ``run_step.fn(...)``, what ``train_step`` does: the step function as a plain call in
  the training flow run;
* ``subflow``: ``run_step(...)``, Prefect's subflow call: a child flow run ``step-<k>`` holding
  the stage task runs; like every flow run it starts a heartbeat thread
  (``flows.heartbeat_frequency``, default 180 s) and joins it at the end;
* ``subflow-no-heartbeat``: the same subflow call with heartbeats off for the child (Prefect's
  settings copied once with ``flows.heartbeat_frequency`` None and entered around each call),
  the cheapest subflow there is.

Steps run interleaved, A B A B …, one variant per step (so each step trains on the next
prompts with the weights the previous step left, as in a real run); the first ``--warmup``
rounds are discarded. Printed: every step's seconds; per variant the median step; per round
the ratio of each variant to ``fn`` (its median, min and max); and, timed directly inside the
same steps, the subflow's own cost: the ``run_step`` call's seconds minus the seconds of the
function body it runs (``run_step.fn`` wrapped for the bench). The 1-minute load average is
printed before and after. Prefect's temporary server (PREFECT_HOME in a temp dir) serves the
API, as for ``ppoflow train`` without ``PREFECT_API_URL``.
"""

from __future__ import annotations

import argparse
import functools
import logging
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
# set before prefect / mlflow are imported: both read their settings on import (the reward
# workers re-import this module and inherit the variable, so `or` keeps them from making another)
os.environ.setdefault(
    "PREFECT_HOME",
    os.environ.get("PREFECT_HOME") or tempfile.mkdtemp(prefix="ppoflow-bench-prefect-"),
)
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")  # no network calls
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch
from prefect.context import SettingsContext, get_settings_context
from prefect.settings import PREFECT_FLOWS_HEARTBEAT_FREQUENCY

import flows.train as train_module
from flows.cli.train import QUIET_LOGGERS
from flows.engines import close_engines
from flows.step_flow import StepFlow, run_step
from flows.train import train_step
from flows.train_run import TrainRun, open_run, resolve_config
from stages.data import make_demo_data, make_tiny_model

TARGET_OVERHEAD = 0.03  # issue 17: a subflow per step is kept if it costs at most 3 % of a step

VARIANTS = ("subflow", "subflow-no-heartbeat", "fn")

QUICK = [
    "data.train_batch_size=8",
    "data.max_response_length=8",
    "actor_rollout_ref.rollout.n=2",
    "actor_rollout_ref.actor.ppo_mini_batch_size=8",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
]


class BodyTimer:
    """Seconds spent inside ``run_step``'s function body during the current step."""

    def __init__(self) -> None:
        self.seconds = 0.0

    def wrap(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)  # Prefect reads the parameters from the wrapped signature
        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - start

        return timed


def without_heartbeats(caller: Callable[..., Any]) -> Callable[..., Any]:
    """``caller`` run in the current settings with ``flows.heartbeat_frequency`` None (copied
    once: a settings copy costs ~30 ms on the 2-core machine)."""
    context = get_settings_context()
    updates = {PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}
    quiet = context.settings.copy_with_update(updates=updates)

    @functools.wraps(caller)
    def call(*args: Any, **kwargs: Any) -> Any:
        with SettingsContext(profile=context.profile, settings=quiet):
            return caller(*args, **kwargs)

    return call


def callers(body: Callable[..., Any]) -> dict[str, Callable[..., Any]]:
    """What ``train_step`` calls in place of ``run_step.fn`` for each variant (``body``: the
    timed ``run_step.fn``)."""
    return {
        "fn": body,
        "subflow": run_step,
        "subflow-no-heartbeat": without_heartbeats(run_step),
    }


@contextmanager
def step_called_as(caller: Callable[..., Any]) -> Iterator[None]:
    """``flows.train.train_step`` calling ``caller`` where it calls ``run_step.fn``."""
    original = train_module.run_step
    train_module.run_step = SimpleNamespace(fn=caller)
    try:
        yield
    finally:
        train_module.run_step = original


@contextmanager
def timed_body(timer: BodyTimer) -> Iterator[None]:
    """``run_step.fn`` (what the flow engine calls, and the ``fn`` variant) timed by ``timer``."""
    original = run_step.fn
    run_step.fn = timer.wrap(original)
    try:
        yield
    finally:
        run_step.fn = original


def write_inputs(root: Path) -> tuple[Path, Path]:
    """The demo task's parquet files and the tiny model under ``root``."""
    make_demo_data(root / "data")
    return root / "data", make_tiny_model(root / "model")


def bench_overrides(root: Path, steps: int, quick: bool) -> list[str]:
    data, model = write_inputs(root / "inputs")
    return [
        f"data.train_files=[{data / 'train.parquet'}]",
        f"data.val_files=[{data / 'val.parquet'}]",
        f"actor_rollout_ref.model.path={model}",
        f"ppoflow.artifact_dir={root / 'runs'}",
        f"trainer.default_local_dir={root / 'checkpoints'}",
        f"ppoflow.mlflow_tracking_uri=sqlite:///{root / 'mlflow.db'}",
        "trainer.logger=[mlflow]",
        f"trainer.total_training_steps={steps}",
        "trainer.val_before_train=false",
        "trainer.test_freq=0",
        "trainer.save_freq=0",
        *(QUICK if quick else []),
    ]


def run_rounds(
    run: TrainRun, variants: list[str], rounds: int
) -> dict[str, list[tuple[float, float]]]:
    """``rounds`` rounds of one step per variant in the given order; per variant the list of
    (step seconds, run_step call seconds − body seconds)."""
    timer = BodyTimer()
    times: dict[str, list[tuple[float, float]]] = defaultdict(list)
    step = 0
    with timed_body(timer):
        table = {name: callers(run_step.fn)[name] for name in variants}
        for index in range(1, rounds + 1):
            line = []
            for name in variants:
                step += 1
                timer.seconds = 0.0
                call_seconds = CallTimer(table[name])
                with step_called_as(call_seconds):
                    start = time.perf_counter()
                    train_step(run, step)
                    seconds = time.perf_counter() - start
                times[name].append((seconds, call_seconds.seconds - timer.seconds))
                line.append(f"{name} {seconds:.3f} s")
            print(f"  round {index}: " + ", ".join(line), flush=True)
    return times


class CallTimer:
    """A caller that also keeps the seconds of its last call."""

    def __init__(self, caller: Callable[..., Any]) -> None:
        self.caller, self.seconds = caller, 0.0

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return self.caller(*args, **kwargs)
        finally:
            self.seconds = time.perf_counter() - start


def _bench(config: str, overrides: list[str], variants: list[str], rounds: int) -> dict:
    run = open_run(resolve_config(config, overrides), None)
    try:
        return run_rounds(run, variants, rounds)
    finally:
        close_engines(run.engines)
        run.sinks.close("FINISHED")


bench_flow = StepFlow(fn=_bench, name="bench-subflow", persist_result=False)


def report(times: dict[str, list[tuple[float, float]]], warmup: int) -> dict[str, float]:
    """Print the figures (module docstring); each subflow variant's overhead (median per-round
    ratio to ``fn`` − 1), empty without ``fn``."""
    kept = {name: rows[warmup:] for name, rows in times.items()}
    for name, rows in kept.items():
        steps = [seconds for seconds, _ in rows]
        own = [extra for _, extra in rows]
        print(
            f"{name:>20}: median step {statistics.median(steps):.3f} s "
            f"(min {min(steps):.3f}, max {max(steps):.3f}); run_step call − body: "
            f"median {1000 * statistics.median(own):.1f} ms "
            f"(min {1000 * min(own):.1f}, max {1000 * max(own):.1f})"
        )
    if "fn" not in kept:
        return {}
    base = [seconds for seconds, _ in kept["fn"]]
    overheads = {}
    for name, rows in kept.items():
        if name == "fn":
            continue
        ratios = [seconds / plain for (seconds, _), plain in zip(rows, base, strict=True)]
        own = statistics.median(extra for _, extra in rows) / statistics.median(base)
        print(
            f"{name:>20} / fn per round: median {statistics.median(ratios):.4f} "
            f"(min {min(ratios):.4f}, max {max(ratios):.4f}); ratio of medians "
            f"{statistics.median(s for s, _ in rows) / statistics.median(base):.4f}; "
            f"direct cost / median fn step {100 * own:.2f} %"
        )
        overheads[name] = statistics.median(ratios) - 1
    return overheads


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=10, help="rounds kept (after the warm-up)")
    parser.add_argument("--warmup", type=int, default=1, help="rounds discarded first")
    parser.add_argument(
        "--variants",
        default="subflow,subflow-no-heartbeat,fn",
        help="comma-separated, run in this order each round: subflow, subflow-no-heartbeat, fn",
    )
    parser.add_argument("--quick", action="store_true", help="8 × 2, R = 8: a smoke run")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    args = parser.parse_args()
    variants = args.variants.split(",")
    unknown = sorted(set(variants) - set(VARIANTS))
    if unknown or args.pairs < 1 or args.warmup < 0:
        parser.error(f"unknown variants {unknown} or --pairs < 1 / --warmup < 0")
    torch.set_num_threads(args.threads)
    for name, level in QUIET_LOGGERS.items():
        logging.getLogger(name).setLevel(level)
    rounds = args.warmup + args.pairs
    print(
        f"torch threads={torch.get_num_threads()}, {os.cpu_count()} CPUs, "
        f"load average before {os.getloadavg()[0]:.2f}; {rounds} rounds of {variants}"
    )
    prefect_home = Path(os.environ["PREFECT_HOME"])
    try:
        with tempfile.TemporaryDirectory(prefix="ppoflow-bench-subflow-") as root:
            overrides = bench_overrides(Path(root), rounds * len(variants), args.quick)
            times = bench_flow("configs/demo-cpu.yaml", overrides, variants, rounds)
        print(f"load average after {os.getloadavg()[0]:.2f}")
        for name, overhead in report(times, args.warmup).items():
            mark = "ok" if overhead <= TARGET_OVERHEAD else "ABOVE the 3 % target"
            print(f"{name} overhead (median per-round ratio − 1) {100 * overhead:.2f} %: {mark}")
    finally:
        if prefect_home.name.startswith("ppoflow-bench-prefect-"):
            shutil.rmtree(prefect_home, ignore_errors=True)


if __name__ == "__main__":
    main()
