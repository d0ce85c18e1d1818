"""The training run's set-up: resolve the config, lock the run directory, read the model and the
data, build the engines, resume a checkpoint, open the metric sinks (steps 1–3 of flows/train.py).

:func:`open_run` does it all and returns the :class:`TrainRun` the training flow steps; the
command line may call it before the flow run exists (:func:`open_run_ahead`), while Prefect's
temporary server starts, and the flow then takes that run over (:func:`take_opened_run`); a flow
run that cannot start closes it (:func:`close_untaken_run`). :func:`resume` restores a checkpoint
into an opened run (engines, RNG states, loader position, KL controller, the steps' history for
the sinks).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from dataproto import DataProto
from flows.cache.code_fingerprint import code_change_notice, run_code
from flows.cache.keys import plugin_names
from flows.engines import WeightsLineage, build_engines, close_engines, seed_everything
from flows.process.device import apply_device
from flows.process.startup import Startup, current_startup, describe_model, describe_sinks
from flows.rollout_ahead import open_rollout_ahead, restored_for
from flows.runs.checkpoints import (
    checkpoint_metrics,
    checkpoint_run,
    controller_state,
    restore_controller,
    restore_run_checkpoint,
    resume_checkpoint,
)
from flows.runs.identity import (
    mlflow_identity,
    resume_history,
    run_info,
    run_tags,
)
from flows.runs.lock import RunLock, lock_run_dir
from flows.runs.retention import Retention
from flows.runs.store import RunStore
from flows.sinks.fanout import MetricSinks, ResumedRun, open_sinks, start_sinks_ahead
from flows.sinks.progress import Progress
from stages.agent.rollout import tool_schemas
from stages.algos.kl_control import get_kl_controller
from stages.config import PPORunConfig, apply_overrides, load_config
from stages.data import StatefulPromptLoader, load_tokenizer
from stages.data.from_config import load_split, train_loader
from stages.health.monitor import HealthMonitor
from stages.metrics.sinks import shows_progress
from stages.ppo import PPO_STAGES


def resolve_config(config: str | os.PathLike | PPORunConfig, overrides=()) -> PPORunConfig:
    """A validated config from a path (or a config name) plus ``key=value`` overrides."""
    overrides = list(overrides or ())
    if isinstance(config, PPORunConfig):
        return apply_overrides(config, overrides) if overrides else config
    return load_config(config, overrides)


def default_run_dir(cfg: PPORunConfig) -> str:
    """``<ppoflow.artifact_dir>/<experiment_name>-<UTC time>``."""
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S-%f")
    return f"{cfg.ppoflow.artifact_dir.rstrip('/')}/{cfg.trainer.experiment_name}-{stamp}"


def load_datasets(cfg: PPORunConfig, tokenizer: Any) -> tuple[Any, Any]:
    """(train, validation) ``PromptDataset`` from data.train_files / data.val_files and the
    other ``data.*`` keys (``stages.data.from_config.load_split``)."""
    return (  # every row's route checked against the scorers here, before step 1
        load_split(cfg.data, tokenizer, "train", cfg.reward, tool_schemas(cfg)),
        load_split(cfg.data, tokenizer, "val", cfg.reward, tool_schemas(cfg)),
    )


@dataclass
class TrainRun:
    """Everything one training run holds between steps."""

    cfg: PPORunConfig
    store: RunStore
    tokenizer: Any
    val_set: Any
    loader: StatefulPromptLoader
    total_steps: int
    engines: dict[str, Any] = field(default_factory=dict)
    sinks: MetricSinks = field(default_factory=lambda: MetricSinks({}, None))
    kl_ctrl: Any = None
    lineage: WeightsLineage | None = None
    progress: Progress | None = None
    start_step: int = 1
    resumed: ResumedRun | None = None  # the checkpoint this run continues from
    lock: RunLock | None = None  # the run directory's, released when the run ends
    retention: Retention | None = None  # prunes old steps' artifacts (flows/runs/retention.py)
    #: the rollouts launched ahead (flows/rollout_ahead.py), None on policy
    ahead: Any = None
    #: the launched rollouts a resumed checkpoint recorded (``RolloutAhead.state``)
    restored_ahead: dict[str, Any] | None = None
    #: step → input of the launched rollouts a resume dropped as stale, generated again at their
    #: steps (flows/rollout_ahead.py ``restored_for``), and how many rows it dropped
    requeued: dict[int, DataProto] = field(default_factory=dict)
    dropped_stale: int = 0
    #: the run's health checks (stages/health), run on each finished step
    health: HealthMonitor | None = None

    def log(self, metrics: dict[str, float], step: int) -> None:
        self.sinks.log_metrics(metrics, step)

    def run_state(self) -> dict[str, Any]:
        return {
            "loader": self.loader.state_dict(),
            "kl_ctrl": controller_state(self.kl_ctrl),
            "weights_lineage": self.lineage.state_dict(),
            "rollout_ahead": None if self.ahead is None else self.ahead.state(),
            "code_files": dict(run_code(PPO_STAGES, plugin_names(self.cfg)).files),
        }


def open_run(cfg: PPORunConfig, run_dir: str | None, startup: Startup | None = None) -> TrainRun:
    """Steps 1–3 of the module docstring (engines and the metric sinks opened last), in the
    start-up phases model, data, engines, MLflow (flows/process/startup.py; default: only logged)."""
    startup = startup or current_startup()
    apply_device(cfg)
    seed_everything(cfg.trainer.seed)
    store = RunStore(run_dir or default_run_dir(cfg))
    lock = lock_run_dir(store.root, store.is_local)  # before anything is written there
    if lock is None:
        startup.say(f"{store.root} is a URL: not locked against a second training")
    try:
        run = _open_locked(cfg, store, startup)
    except BaseException:
        if lock is not None:
            lock.release()
        raise
    run.lock = lock
    return run


def _open_locked(cfg: PPORunConfig, store: RunStore, startup: Startup) -> TrainRun:
    """:func:`open_run` once the run directory is this process's to write. The sinks that open
    ahead (MLflow's process) start first and come up beside the other phases.
    ``config.json`` is written after the tokenizer, the datasets, the engines and the resumed
    checkpoint were read, so a start refused on bad input leaves a finished run's config as it
    was."""
    for path in store.remove_temp_files():
        startup.say(f"removed {path}, left by an interrupted write")
    sink_dir = store.root if store.is_local else None
    started = start_sinks_ahead(cfg, sink_dir)
    try:
        return _open_started(cfg, store, startup, started)
    except BaseException:
        MetricSinks(started, sink_dir).close("FAILED")  # closing twice is a no-op
        raise


def _open_started(
    cfg: PPORunConfig, store: RunStore, startup: Startup, started: dict[str, Any]
) -> TrainRun:
    model = cfg.actor_rollout_ref.model
    with startup.phase("model", f"reading the tokenizer of {model.tokenizer_path}") as shown:
        tokenizer = load_tokenizer(model.tokenizer_path)
        shown["text"] = describe_model(model.path)
    with startup.phase("data", "reading and tokenizing the datasets") as shown:
        train_set, val_set = load_datasets(cfg, tokenizer)
        shown["text"] = f"{len(train_set)} train / {len(val_set)} val prompts"
    loader = train_loader(cfg.data, train_set)
    total = cfg.resolve_total_training_steps(len(train_set))
    run = TrainRun(cfg, store, tokenizer, val_set, loader, total)
    run.progress = Progress(total, enabled=shows_progress(cfg.trainer.logger))
    run.lineage = WeightsLineage.from_config(cfg)
    run.health = HealthMonitor(cfg)
    if cfg.algorithm.use_kl_in_reward:
        run.kl_ctrl = get_kl_controller(cfg.algorithm.kl_ctrl)
    run.engines = build_engines(cfg, tokenizer, total, startup)
    run.retention = Retention.open(store, cfg)
    try:
        resume(run, startup)
        run.ahead = open_rollout_ahead(run, startup)  # a schedule's rollout replica, if apart
        store.save_config(cfg)  # only now: a start that failed keeps the run's config.json
        resumed_step = None if run.resumed is None else run.resumed.step
        tags = run_tags(cfg, store.root, resumed_step)
        sinks_phase = "MLflow" if "mlflow" in cfg.trainer.logger else "metrics"
        with startup.phase(sinks_phase, "opening the metric sinks") as shown:
            run.sinks = open_sinks(
                cfg, store.root if store.is_local else None, tags, run.resumed, started
            )
            started.clear()  # open_sinks owns them now
            record_run_info(run)
            shown["text"] = describe_sinks(run.sinks, cfg.trainer.project_name)
    except BaseException:
        close_run_engines(run)
        raise
    return run


def close_run_engines(run: TrainRun) -> None:
    """The rollout replica (a rollout still running on it is abandoned), then every engine."""
    ahead, run.ahead = run.ahead, None
    try:
        if ahead is not None:
            ahead.close()
    finally:
        close_engines(run.engines)


def open_run_ahead(cfg: PPORunConfig, run_dir: str, startup: Startup) -> TrainRun:
    """:func:`open_run` before the flow run exists, for the flow to take over
    (:func:`take_opened_run`): the command line opens the run while Prefect's temporary server is
    still starting on the other core, instead of after it. Kept on ``startup`` with the run
    directory it was opened for (its config object is ``run.cfg``)."""
    run = open_run(cfg, run_dir, startup)
    startup.opened = (run_dir, run)
    return run


def take_opened_run(
    startup: Startup, config: Any, overrides: Sequence[str], run_dir: str | None
) -> TrainRun | None:
    """The run :func:`open_run_ahead` opened, when the flow was called with that same config
    object, no overrides and the same run directory (it is then the flow's to close); else None."""
    if startup.opened is None:
        return None
    opened_dir, run = startup.opened
    if run.cfg is not config or list(overrides or ()) or run_dir != opened_dir:
        return None
    startup.opened = None
    return run


def close_untaken_run(startup: Startup) -> None:
    """Close a run :func:`open_run_ahead` opened that no flow took over (the flow run could not
    start): its engines, its metric sinks (the MLflow run ends FAILED) and the run directory's
    lock. A no-op once a flow has taken it."""
    if startup.opened is None:
        return
    run = startup.opened[1]
    startup.opened = None
    try:
        close_run_engines(run)
    finally:
        try:
            run.sinks.close("FAILED")
        finally:
            if run.lock is not None:
                run.lock.release()


def record_run_info(run: TrainRun) -> None:
    """``<run_dir>/run_info.json`` (flows/runs/identity.py ``run_info``): written when the run
    opens, at each checkpoint and at the end, so an MLflow run id that an outage delayed gets
    there too."""
    step = None if run.resumed is None else run.resumed.step
    identity = mlflow_identity(run.sinks, run.cfg.trainer.project_name)
    run.store.save_run_info(run_info(run.cfg, run.store.root, identity, step))


def resume(run: TrainRun, startup: Startup | None = None) -> None:
    """Continue from a checkpoint when ``trainer.resume_mode`` finds one (flows/runs/checkpoints.py):
    engines, loader position, KL controller, weights lineage; the next step is N + 1; and
    ``run.resumed``, the MLflow run to continue with the history to fill in (module docstring)."""
    startup = startup or current_startup()
    checkpoint, skipped = resume_checkpoint(run.cfg.trainer)  # verified, newest valid under auto
    for notice in skipped:
        startup.say(notice)
    if checkpoint is None:
        return
    root, step = checkpoint.root, checkpoint.step
    state = restore_run_checkpoint(checkpoint, run.engines)
    run.loader.load_state_dict(state["loader"])
    restore_controller(run.kl_ctrl, state["kl_ctrl"])
    run.lineage.current.update(state["weights_lineage"])
    run.start_step = step + 1
    recorded = checkpoint_run(state)
    origin = recorded["run_dir"] or run.store.root  # an older checkpoint names no run
    run.restored_ahead, run.requeued, run.dropped_stale = restored_for(
        run.cfg, state.get("rollout_ahead"), origin
    )
    run.resumed = ResumedRun(
        step,
        recorded["mlflow_run_id"],
        recorded["mlflow_tracking_uri"],
        resume_history(origin, step, checkpoint_metrics(state)),
    )
    startup.say(f"resumed from {root}/global_step_{step} ({checkpoint.files} files verified)")
    if run.requeued:
        steps = ", ".join(str(j) for j in sorted(run.requeued))
        startup.say(
            f"the checkpoint's rollouts launched ahead for steps {steps} ({run.dropped_stale} rows) "
            f"were generated at another pace than ppoflow.schedule={run.cfg.ppoflow.schedule}'s "
            "now: dropped as stale, their prompts generated again at those steps"
        )
    current = run_code(PPO_STAGES, plugin_names(run.cfg)).files
    notice = code_change_notice(state.get("code_files"), current)
    if notice is not None:
        startup.say(notice)
