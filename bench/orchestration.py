"""Time the PPO step's orchestration: the stage functions in a plain Python loop vs the step flow.

Run from the repository root:

    .venv/bin/python bench/orchestration.py                # demo size (64 × 4) and 256 × 4
    .venv/bin/python bench/orchestration.py --quick        # 8 prompts × 2, R=8: a smoke run
    .venv/bin/python bench/orchestration.py --only demo --rounds 8

Sizes (configs/demo-cpu.yaml on the tiny model and the demo task, written to a temp dir):
``demo`` 64 prompts × n 4 = 256 sequences, R = 16 (the demo's step); ``large`` 256 × 4 = 1,024
sequences (ppo_mini_batch_size stays 32, so 8 updates per step instead of 2).

Per step, both variants run inside one Prefect flow run, as ``ppoflow train`` runs its steps:

* plain: for each enabled stage (``flows.dag.plan_step`` over ``stages.ppo.PPO_STAGES``) call
  ``stage.fn(batch, ctx)``, merge its delta (``batch | delta``), reorder the batch by the balance
  permutation; then ``flows.train.step_metrics``. No artifacts, no Prefect tasks, no MLflow.
* flow: what ``flows.train.train_step`` and its loop do: ``run_step.fn`` (each stage a cached
  Prefect task whose delta is saved as an artifact under a ``RunStore``, the step journal
  rewritten after each stage) with every stage refreshed (the cache off, so both variants do the
  same model work), the weights lineage advanced, ``step_metrics``, and the step's publishing
  (``MLflowLogger.log_metrics`` to SQLite in the run dir and ``publish_step_report``, a Prefect
  markdown artifact) handed to the background thread of ``flows.sinks.publisher.Publisher`` as the
  train loop does; only the wait for the previous step's publishing counts on the step.

Like for like: each variant has its own model engines built from the same initial weights (the
reward scorer pool is shared), gets the same step input and the same torch seed per round, so
both generate the same responses and apply the same updates (the bench checks the responses and
advantages are equal each round). Rounds alternate which variant goes first; round 1 is a
warm-up and is discarded; figures are medians over the other rounds. Two overheads are printed:
measured = median over rounds of (flow step / plain step − 1), which on a busy machine carries the
noise of two whole steps; accounted = median over rounds of (the flow's own parts, timed directly,
/ plain step), which leaves out indirect costs such as the Prefect server process's CPU time.

The flow's extra time is split into parts, timed by wrapping the functions the flow calls:
the step input's artifact, the stage artifacts (``save_artifact``: write + sha256), the cache
keys, the input selection, the journal writes, the rest of each Prefect task run (task-run
bookkeeping, the cache record write, delta checks), the rest of the step flow (merges, reorder,
fingerprints), and the wait for the previous step's publishing. Prefect's temporary server starts on the first flow
call as in a normal run (``PREFECT_HOME`` in a temp dir); its one-off start-up is printed apart.
"""

from __future__ import annotations

import argparse
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
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
# set before prefect / mlflow are imported: both read their settings on import
# (a temp PREFECT_HOME made here is removed at the end: main; the reward workers re-import this
# module when they start, and inherit the variable, so `or` keeps them from making another)
os.environ.setdefault(
    "PREFECT_HOME",
    os.environ.get("PREFECT_HOME") or tempfile.mkdtemp(prefix="ppoflow-bench-prefect-"),
)
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")  # no network calls
# Prefect's default (20 s) is too short for the temporary server on a busy 2-core machine
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch
from prefect.results import ResultStore
from prefect.task_engine import SyncTaskRunEngine
from transformers.utils import logging as hf_logging

import flows.cache.keys as cache_keys_module
import flows.runs.store as run_store_module
import flows.stage_task as stage_task_module
from dataproto import DataProto
from dataproto import keys as K
from flows.cache.code_fingerprint import stage_code
from flows.cli.train import QUIET_LOGGERS
from flows.dag import batch_keys, plan_step
from flows.engines import (
    WeightsLineage,
    build_engines,
    build_role,
    close_engines,
    roles_for,
    seed_everything,
)
from flows.runs.store import RunStore
from flows.sinks.mlflow_logger import MLflowLogger
from flows.sinks.publisher import Publisher
from flows.sinks.step_report import publish_step_report
from flows.stage_task import timer_name
from flows.step_flow import StepFlow, StepResult, run_step
from flows.train import IDEMPOTENT_RETRIES, step_metrics
from flows.train_run import load_datasets, resolve_config
from stages.algos.kl_control import get_kl_controller
from stages.config import PPORunConfig
from stages.data import StatefulPromptLoader, load_tokenizer, make_demo_data, make_tiny_model
from stages.ppo import PPO_STAGES, make_step_input
from stages.stage import Stage, StageContext

TARGET_OVERHEAD = 0.03  # at the demo size (issue 7)

SIZES: dict[str, list[str]] = {
    "demo": [],
    "large": ["data.train_batch_size=256"],
    "quick": [
        "data.train_batch_size=8",
        "data.max_response_length=8",
        "actor_rollout_ref.rollout.n=2",
        "actor_rollout_ref.actor.ppo_mini_batch_size=8",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=16",
    ],
}

# flow parts that are not inside a stage's run_stage call (step-level bookkeeping)
STEP_PARTS = ("save_input", "journal", "step flow rest", "step metrics", "publish wait")
# parts inside run_stage besides the stage function
STAGE_PARTS = (
    "artifact save",
    "cache key",
    "code manifest",
    "select inputs",
    "prefect result write",
    "prefect cache lookup",
    "prefect set_state",
    "prefect task rest",
)


#: parts timed inside "cache key": the stage code's fingerprint, the user files' digests
SUB_PARTS = ("cache key: code", "cache key: files")


# --- timing ------------------------------------------------------------------------------------


class PartTimer:
    """Seconds per named part of the current step (reset by :meth:`start_step`)."""

    def __init__(self) -> None:
        self.parts: dict[str, float] = defaultdict(float)

    def start_step(self) -> None:
        self.parts = defaultdict(float)

    def wrap(self, part: str | Callable[..., str], fn: Callable[..., Any]) -> Callable[..., Any]:
        """``fn`` adding its wall time to ``part`` (a name, or a function of the call's args)."""

        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                name = part(*args, **kwargs) if callable(part) else part
                self.parts[name] += time.perf_counter() - start

        timed.__name__ = getattr(fn, "__name__", "timed")
        return timed

    @contextmanager
    def measure(self, part: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.parts[part] += time.perf_counter() - start


@contextmanager
def instrumented_flow(timer: PartTimer) -> Iterator[None]:
    """Wrap the functions the step flow calls so their time lands in ``timer``.

    ``save_artifact`` is imported by name into flows.stage_task (stage deltas) and
    flows.runs.store (the step input), so each module's reference is wrapped separately. Prefect's
    own parts: the cache record write (``ResultStore._persist_result_record``), cache lookups
    (``_exists`` / ``_read``) and task-run state changes (``SyncTaskRunEngine.set_state``).
    """
    patches = [
        (stage_task_module, "save_artifact", "artifact save"),
        (stage_task_module, "stage_key_parts", "cache key"),
        (cache_keys_module, "code_part", "cache key: code"),
        (cache_keys_module, "files_part", "cache key: files"),
        (RunStore, "save_code_manifest", "code manifest"),
        (stage_task_module, "select_inputs", "select inputs"),
        (run_store_module, "save_artifact", "save_input"),
        (RunStore, "write_journal", "journal"),
        (ResultStore, "_persist_result_record", "prefect result write"),
        (ResultStore, "_exists", "prefect cache lookup"),
        (ResultStore, "_read", "prefect cache lookup"),
        (SyncTaskRunEngine, "set_state", "prefect set_state"),
    ]
    saved = [(owner, name, owner.__dict__[name]) for owner, name, _ in patches]
    try:
        for owner, name, part in patches:
            setattr(owner, name, timer.wrap(part, owner.__dict__[name]))
        yield
    finally:
        for owner, name, original in saved:
            setattr(owner, name, original)


def timed_stages(stages: tuple[Stage, ...], timer: PartTimer) -> tuple[Stage, ...]:
    """The stages with each ``fn`` timed under ``fn:<stage>`` (names, versions unchanged)."""
    return tuple(replace(stage, fn=timer.wrap(f"fn:{stage.name}", stage.fn)) for stage in stages)


# --- set-up ------------------------------------------------------------------------------------


@dataclass
class Variant:
    """One variant's engines and per-round step measurements."""

    name: str
    engines: dict[str, Any]
    steps: list[dict[str, float]] = field(default_factory=list)
    last_batch: DataProto | None = None


@dataclass
class Bench:
    """Everything one size's rounds share."""

    cfg: PPORunConfig
    loader: StatefulPromptLoader
    stages: tuple[Stage, ...]
    timer: PartTimer
    store: RunStore
    logger: MLflowLogger
    publisher: Publisher
    lineage: WeightsLineage
    kl_coef: float | None
    plain: Variant
    flow: Variant
    mismatches: list[str] = field(default_factory=list)


def write_demo_inputs(root: Path) -> tuple[Path, Path]:
    """The demo task's parquet files and the tiny model under ``root``; (data dir, model dir)."""
    make_demo_data(root / "data")
    return root / "data", make_tiny_model(root / "model")


def bench_config(size: str, data: Path, model: Path, root: Path, extra: list[str]) -> PPORunConfig:
    overrides = [
        f"data.train_files=[{data / 'train.parquet'}]",
        f"data.val_files=[{data / 'val.parquet'}]",
        f"actor_rollout_ref.model.path={model}",
        f"ppoflow.artifact_dir={root / 'runs'}",
        f"trainer.default_local_dir={root / 'checkpoints'}",
        "trainer.logger=[mlflow]",
        "trainer.total_training_steps=1000",
        *SIZES[size],
        *extra,
    ]
    return resolve_config("configs/demo-cpu.yaml", overrides)


def open_bench(cfg: PPORunConfig, root: Path) -> Bench:
    """Tokenizer, loader, two engine sets from the same weights, the run store and MLflow."""
    seed_everything(cfg.trainer.seed)
    tokenizer = load_tokenizer(cfg.actor_rollout_ref.model.tokenizer_path)
    train_set, _ = load_datasets(cfg, tokenizer)
    loader = StatefulPromptLoader(
        train_set, cfg.data.train_batch_size, shuffle=cfg.data.shuffle, seed=cfg.data.seed
    )
    total = cfg.trainer.total_training_steps
    flow = Variant("flow", build_engines(cfg, tokenizer, total))
    try:  # the plain loop's own model roles; the reward engines (stateless scorers) are shared
        plain = Variant("plain", dict(flow.engines))
        for role in roles_for(cfg):
            plain.engines[role] = build_role(cfg, role, total)
    except BaseException:
        close_bench_engines(cfg, plain.engines, flow.engines)
        raise
    store = RunStore(root / "run")
    store.save_config(cfg)
    logger = MLflowLogger(cfg.trainer.project_name, cfg.trainer.experiment_name, run_dir=store.root)
    logger.log_params(cfg)
    kl_coef = None
    if cfg.algorithm.use_kl_in_reward:  # β held fixed: both variants must see the same inputs
        kl_coef = float(get_kl_controller(cfg.algorithm.kl_ctrl).value)
    timer = PartTimer()
    return Bench(
        cfg,
        loader,
        timed_stages(PPO_STAGES, timer),
        timer,
        store,
        logger,
        Publisher(),
        WeightsLineage.from_config(cfg),
        kl_coef,
        plain,
        flow,
    )


def close_bench_engines(cfg: PPORunConfig, plain: dict[str, Any], flow: dict[str, Any]) -> None:
    """Close the plain loop's model roles, then every flow engine (the shared reward ones too)."""
    for role in roles_for(cfg):
        if role in plain and plain[role] is not flow.get(role):
            plain[role].close()
    close_engines(flow)


def close_bench(bench: Bench) -> None:
    close_bench_engines(bench.cfg, bench.plain.engines, bench.flow.engines)
    bench.publisher.close()
    bench.logger.close("FINISHED")


# --- the two variants of one step --------------------------------------------------------------


def reorder_plain(stage: Stage, batch: DataProto) -> DataProto:
    """The batch reordered by ``stage``'s permutation key, which is dropped (as the flow does)."""
    name = stage.reorders
    rest = DataProto(
        batch=batch.batch.exclude(name),
        non_tensor_batch=dict(batch.non_tensor_batch),
        meta_info=dict(batch.meta_info),
    )
    return rest.select_idxs(batch.batch[name])


def plain_step(bench: Bench, step_input: DataProto, step: int) -> dict[str, float]:
    """The stages in a plain loop; the parts' seconds (``fn:<stage>``, ``merge``, totals)."""
    timer, cfg = bench.timer, bench.cfg
    start = time.perf_counter()
    batch = step_input
    plan = plan_step(bench.stages, cfg, batch_keys(batch), step=step)
    ctx = StageContext(config=cfg, engines=bench.plain.engines, step=step)
    for stage in plan.stages:
        stage_start = time.perf_counter()
        delta = stage.fn(batch, ctx)
        with timer.measure("merge"):
            batch = batch | delta
            if stage.reorders is not None:
                batch = reorder_plain(stage, batch)
        ctx.metrics[f"timing_s/{timer_name(stage.name)}"] = time.perf_counter() - stage_start
    ctx.metrics["timing_s/step"] = time.perf_counter() - start
    timer.parts["stages+merges"] = ctx.metrics["timing_s/step"]
    with timer.measure("step metrics"):
        step_metrics(StepResult(batch, ctx.metrics, []), cfg, step, bench.loader.epoch)
    bench.plain.last_batch = batch
    return dict(timer.parts)


def publish(logger: MLflowLogger, step: int, records: list, metrics: dict[str, float]) -> None:
    """What ``flows.train.publish_step`` does on the publishing thread."""
    logger.log_metrics(metrics, step)
    publish_step_report(step, records, metrics, logger.run_id)


def flow_step(bench: Bench, step_input: DataProto, step: int) -> dict[str, float]:
    """What train_step and the train loop do per step; the parts' seconds."""
    timer, cfg = bench.timer, bench.cfg
    with instrumented_flow(timer), timer.measure("run_step"):
        result = run_step.fn(
            bench.stages,
            step_input,
            StageContext(config=cfg, engines=bench.flow.engines, step=step),
            bench.store,
            step,
            weights_fingerprints=bench.lineage.fingerprint,
            refresh=[stage.name for stage in bench.stages],
            retries=IDEMPOTENT_RETRIES,
        )
    bench.lineage.advance(bench.stages, result.records)
    with timer.measure("step metrics"):
        metrics = step_metrics(result, cfg, step, bench.loader.epoch)
    with timer.measure("publish wait"):  # the previous step's publishing, if still running
        bench.publisher.submit(publish, bench.logger, step, result.records, metrics)
    parts = timer.parts
    ran = [record for record in result.records if record.timing_s is not None]
    for record in ran:
        parts[f"stage:{record.stage}"] = record.timing_s
    in_stages = sum(record.timing_s for record in ran)
    parts["stages+merges"] = result.metrics["timing_s/step"]
    # timing_s/step stops before the step's last journal write: use the wall time of the call
    parts["step flow rest"] = parts["run_step"] - in_stages - parts["save_input"] - parts["journal"]
    fn_total = sum(value for name, value in parts.items() if name.startswith("fn:"))
    inner = sum(parts[part] for part in STAGE_PARTS if part != "prefect task rest")
    parts["prefect task rest"] = in_stages - fn_total - inner
    bench.flow.last_batch = result.batch
    return dict(parts)


def same_work(plain: DataProto, flow: DataProto) -> str | None:
    """None when both final batches hold equal responses and advantages, else what differs."""
    for key in (K.RESPONSES, K.ADVANTAGES):
        a, b = plain.batch[key], flow.batch[key]
        if a.shape != b.shape or not torch.equal(a, b):
            return f"{key} differ"
    return None


def run_rounds(bench: Bench, rounds: int) -> None:
    """``rounds`` steps of each variant, alternating which goes first; the same input and seed."""
    for index in range(1, rounds + 1):
        step_input = make_step_input(
            bench.loader.next_batch(),
            bench.cfg.actor_rollout_ref.rollout.n,
            temperature=bench.cfg.actor_rollout_ref.rollout.temperature,
            global_steps=index,
            kl_coef=bench.kl_coef,
        )
        order = [("plain", plain_step), ("flow", flow_step)]
        for name, step_fn in order if index % 2 else order[::-1]:
            seed_everything(bench.cfg.trainer.seed + index)
            bench.timer.start_step()
            start = time.perf_counter()
            parts = step_fn(bench, step_input, index)
            parts["total"] = time.perf_counter() - start
            getattr(bench, name).steps.append(parts)
        mismatch = same_work(bench.plain.last_batch, bench.flow.last_batch)
        if mismatch:
            bench.mismatches.append(f"round {index}: {mismatch}")
        print(
            f"  round {index}: plain {bench.plain.steps[-1]['total']:.3f} s, "
            f"flow {bench.flow.steps[-1]['total']:.3f} s",
            flush=True,
        )


bench_flow = StepFlow(
    fn=run_rounds,
    name="bench-orchestration",
    validate_parameters=False,
    persist_result=False,
)


def _empty() -> None:
    return None


empty_flow = StepFlow(fn=_empty, name="bench-empty", persist_result=False)


# --- report ------------------------------------------------------------------------------------


def median(steps: list[dict[str, float]], part: str) -> float:
    return statistics.median(step.get(part, 0.0) for step in steps)


def extra_seconds(plain: dict[str, float], flow: dict[str, float]) -> dict[str, float]:
    """The flow's own parts of one round (seconds): what the plain loop does not do.

    ``step flow rest`` holds the merges and the reorder, which the plain loop does too, so the
    plain loop's ``merge`` is subtracted; ``step metrics`` (both do it) is left out.
    """
    parts = {part: flow.get(part, 0.0) for part in STAGE_PARTS + STEP_PARTS}
    parts["step flow rest"] -= plain.get("merge", 0.0)
    del parts["step metrics"]
    return parts


def report(size: str, bench: Bench) -> tuple[float, float]:
    """Print the per-stage and per-part tables; return the median overhead ratios
    (measured: flow step / plain step − 1; accounted: Σ the flow's own parts / plain step)."""
    plain, flow = bench.plain.steps[1:], bench.flow.steps[1:]  # round 1 is the warm-up
    pairs = list(zip(plain, flow, strict=True))
    ratios = [f["total"] / p["total"] - 1 for p, f in pairs]
    accounted = [sum(extra_seconds(p, f).values()) / p["total"] for p, f in pairs]
    cfg = bench.cfg
    rows = cfg.data.train_batch_size * cfg.actor_rollout_ref.rollout.n
    print(
        f"\n{size}: {cfg.data.train_batch_size} prompts × n {cfg.actor_rollout_ref.rollout.n} = "
        f"{rows} sequences, R={cfg.data.max_response_length}; medians of {len(plain)} rounds "
        f"(warm-up discarded); seconds"
    )
    print(
        f"{'stage':14s} {'plain':>8s} {'flow':>8s} {'extra':>8s} {'extra %':>8s} "
        f"{'fn in flow':>10s}"
    )
    for stage in bench.stages:
        key = f"fn:{stage.name}"
        if key not in plain[0]:
            continue
        p, f = median(plain, key), median(flow, f"stage:{stage.name}")
        print(
            f"{stage.name:14s} {p:8.4f} {f:8.4f} {f - p:8.4f} {100 * (f - p) / p:7.1f}% "
            f"{median(flow, key):10.4f}"
        )
    print(f"{'merge/reorder':14s} {median(plain, 'merge'):8.4f}    (flow: in step flow rest)")
    for part in ("stages+merges", "step metrics", "total"):
        p, f = median(plain, part), median(flow, part)
        print(f"{part:14s} {p:8.4f} {f:8.4f} {f - p:8.4f} {100 * (f - p) / p:7.1f}%")
    step_s = median(plain, "total")
    print(f"flow's own parts (median s per step, % of the plain step {step_s:.3f} s):")
    extras = [extra_seconds(p, f) for p, f in pairs]
    for part in extras[0]:
        value = statistics.median(extra[part] for extra in extras)
        print(f"  {part:20s} {value:8.4f} {100 * value / step_s:6.2f}%")
    for part in SUB_PARTS:  # inside "cache key", not added again
        value = statistics.median(f.get(part, 0.0) for f in flow)
        print(f"    of which {part:11s} {value:8.4f} {100 * value / step_s:6.2f}%")
    overhead, own = statistics.median(ratios), statistics.median(accounted)
    print(
        f"overhead measured (median of flow / plain − 1): {100 * overhead:.2f}% "
        f"(per round: {', '.join(f'{100 * r:.1f}' for r in ratios)})"
    )
    print(
        f"overhead accounted (median of Σ own parts / plain step): {100 * own:.2f}% "
        f"(per round: {', '.join(f'{100 * r:.1f}' for r in accounted)})"
    )
    same = "yes" if not bench.mismatches else "NO: " + "; ".join(bench.mismatches)
    print(f"same model work (equal responses and advantages every round): {same}")
    return overhead, own


# --- main --------------------------------------------------------------------------------------


def quiet_logs() -> None:
    for name, level in QUIET_LOGGERS.items():
        logging.getLogger(name).setLevel(level)
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()


def prefect_startup() -> tuple[float, float]:
    """Seconds of the first empty flow run (starts the temporary server) and of a second one."""
    start = time.perf_counter()
    empty_flow()
    first = time.perf_counter() - start
    start = time.perf_counter()
    empty_flow()
    return first, time.perf_counter() - start


def main() -> None:
    prefect_home = Path(os.environ["PREFECT_HOME"])
    try:
        bench_main()
    finally:  # also after --help or an argument error (argparse exits)
        if prefect_home.name.startswith("ppoflow-bench-prefect-"):
            shutil.rmtree(prefect_home, ignore_errors=True)


def bench_main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="8 × 2, R=8, 3 rounds: smoke run")
    parser.add_argument("--only", choices=["demo", "large"], help="run one size")
    parser.add_argument("--rounds", type=int, default=6, help="rounds per size (first discarded)")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="extra config override"
    )
    args = parser.parse_args()
    if args.rounds < 2:
        parser.error(f"--rounds must be at least 2 (the first is a warm-up), got {args.rounds}")
    torch.set_num_threads(args.threads)
    quiet_logs()
    sizes = ["quick"] if args.quick else [args.only] if args.only else ["demo", "large"]
    rounds = 3 if args.quick else args.rounds
    print(f"torch threads={torch.get_num_threads()}, {os.cpu_count()} CPUs")
    start = time.perf_counter()
    files = {name for stage in PPO_STAGES for name in stage_code(stage).files}
    print(
        f"stage code fingerprints, once per process: {time.perf_counter() - start:.3f} s "
        f"({len(PPO_STAGES)} stages, {len(files)} source files)"
    )
    with tempfile.TemporaryDirectory(prefix="ppoflow-bench-orch-") as root:
        overheads = run_sizes(Path(root), sizes, rounds, args.set)
    if "demo" in overheads:
        for kind, value in zip(("measured", "accounted"), overheads["demo"], strict=True):
            mark = "ok" if value <= TARGET_OVERHEAD else "ABOVE"
            print(f"demo overhead {kind} {100 * value:.2f}% (target ≤ 3%): {mark}")


def run_sizes(
    root: Path, sizes: list[str], rounds: int, extra: list[str]
) -> dict[str, tuple[float, float]]:
    """Start Prefect, write the demo inputs, bench each size; {size: (measured, accounted)}."""
    first, second = prefect_startup()
    print(
        f"Prefect temporary server: first (empty) flow run {first:.2f} s, second {second:.2f} s "
        f"→ start-up ≈ {first - second:.2f} s (one-off, not in the step figures)"
    )
    data, model = write_demo_inputs(root / "inputs")
    overheads = {}
    for size in sizes:
        cfg = bench_config(size, data, model, root / size, extra)
        bench = open_bench(cfg, root / size)
        try:
            print(f"{size}: {rounds} rounds", flush=True)
            bench_flow(bench, rounds)
            overheads[size] = report(size, bench)
        finally:
            close_bench(bench)
    return overheads


if __name__ == "__main__":
    main()
