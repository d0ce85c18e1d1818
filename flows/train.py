"""The training flow: one Prefect flow run for the whole training, the PPO step's stages as tasks.

``train(config, overrides, run_dir)`` reads like verl's ``fit`` without its branches:

1. resolve and validate the config, create and lock the run directory (``RunStore``);
2. load the tokenizer and the train / validation datasets, build the loader;
3. build the engines once (``flows.engines``: actor, ref, critic, reward pool), open the metric
   sinks ``trainer.logger`` lists (``flows.sinks.fanout``: MLflow with experiment =
   ``trainer.project_name``, run = ``trainer.experiment_name``, in the project store
   ``<ppoflow.artifact_dir>/mlflow.db`` unless ``ppoflow.mlflow_tracking_uri`` or
   ``MLFLOW_TRACKING_URI`` names another (flows/sinks/mlflow_store.py), tagged with the version,
   commit, run dir and config digest (flows/runs/identity.py); W&B; TensorBoard), log the config
   to them, save it as ``<run_dir>/config.json`` (only now: a failed start keeps a run's
   config), and write ``<run_dir>/run_info.json`` (the MLflow run id, store and experiment);
4. ``val_before_train``; then for each step: the step input (uid per prompt, repeat n; with a
   ``ppoflow.schedule`` whose rollout runs apart, the batch launched ahead with its rollout,
   flows/rollout_ahead.py), the step
   flow's stages (``run_step.fn`` inside this flow run: a subflow run per step would cost far
   more than the 3 % of a demo step allowed, flows/step_flow.py), the
   step metrics (stage metrics, data, timing, throughput, ``training/*``, ``ppoflow/cache_hits``)
   → the sinks, validation every ``test_freq`` steps and at the last step (the generations as an
   MLflow table), a checkpoint every ``save_freq`` steps (with the run's identity and the step's
   metrics, :func:`save_checkpoint`), the retention pass (``ppoflow.artifacts``: older steps'
   artifacts pruned, flows/runs/retention.py), a markdown summary of the step as a Prefect artifact keyed ``<experiment>-<run tag>-step-<k>``
   (``flows.sinks.step_report``); the sinks' metrics and the report are sent on a background thread
   while the next step computes (``flows.sinks.publisher``);
5. a summary; the engines and the reward pool are closed in ``finally``.

Steps 1–3 are flows/train_run.py's (``open_run``, ``resume``). They may happen before the flow
run exists: ``ppoflow train`` / ``resume`` open the run while Prefect's temporary server is still
starting (``open_run_ahead``), and the flow takes that run over when it is called with the same
config object and run directory (``take_opened_run``); a flow run that cannot start closes it
(``close_untaken_run``).

The flow's first statement logs ``ppoflow: loading config …`` through Prefect's run logger, so
a deployment run shows a line of ppoflow's as soon as the flow starts; the run directory, every
step's progress line, the validation lines and the summary follow on the same logger
(``flows.sinks.progress``), beside the console output.

With ``trainer.resume_mode`` auto (a tracker in ``default_local_dir``) or resume_path, step 3
also restores the checkpoint (engines, RNG states, loader position, KL controller) and the run
continues at step N + 1, in the run directory given (``ppoflow resume RUN_DIR`` gives the
checkpoint's own: the journals of steps ≤ N stay, steps N + 1… are written again) or else a new
one. When the run logs to the store the checkpoint recorded, the checkpoint's MLflow run
continues (marked RUNNING again, then FINISHED or FAILED), tagged ``ppoflow.resumed_from_step``;
the journaled steps ≤ N that it lacks are replayed into it and the steps it holds already are not
logged again, so after a ``kill -9`` and a resume every step is in its history exactly once
(flows/sinks/mlflow_logger.py). In another store the resume starts a new MLflow run there, with steps
≤ N replayed.

The KL controller (KL in the reward) is run state: its β enters each step input as
``meta_info.kl_coef`` and it is updated from the advantage stage's ``actor/reward_kl_penalty``
after the step, so a cached advantage stage updates it too. Weight fingerprints for the cache
keys follow ``flows.engines.WeightsLineage``.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from prefect import get_run_logger
from prefect.runtime import flow_run

from dataproto import DataProto
from dataproto import keys as K
from flows.gen_rounds import StepPlanInput, step_input_of
from flows.process.own_process import prepare_own_process
from flows.process.prefect_server import describe_prefect
from flows.process.server_guard import server_lost
from flows.process.startup import current_startup
from flows.process.stop_signals import (
    is_stop,
    latch_stop_signals,
    raise_if_stop_requested,
    signals_deferred,
)
from flows.rollout_ahead import DROPPED_METRIC
from flows.runs.checkpoints import (
    save_run_checkpoint,
    tracking_state,
)
from flows.runs.identity import (
    CACHE_HITS,
    cache_hits,
    mlflow_identity,
)
from flows.runs.store import StageRecord
from flows.sinks.generations_dump import dump_rollout, dump_validation
from flows.sinks.progress import SCORE
from flows.sinks.publisher import Publisher
from flows.sinks.step_report import flow_run_tag, publish_step_report, report_key
from flows.sinks.train_generations import PAGE, step_page, table_due, train_generation_rows
from flows.sinks.train_generations import TABLE as TRAIN_TABLE
from flows.step_flow import StepFlow, StepResult, describe_source, run_step
from flows.train_run import (
    TrainRun,
    close_run_engines,
    open_run,
    record_run_info,
    resolve_config,
    take_opened_run,
)
from flows.validate import validate
from stages.advantage import KL_METRIC
from stages.config import PPORunConfig
from stages.health.monitor import HealthOutcome, stop_error
from stages.metrics import (
    compute_data_metrics,
    compute_throughput_metrics,
    compute_timing_metrics,
)
from stages.metrics.signal import batch_signal_metrics
from stages.ppo import PPO_STAGES
from stages.schedules import partial_metrics, partial_rollouts, staleness_metrics
from stages.stage import StageContext

#: Prefect retries of the stages that write no weights (rollout, reward, log-probs, advantage)
IDEMPOTENT_RETRIES = 1


@dataclass
class TrainResult:
    """What ``train`` returns: where the run is and how it went."""

    run_dir: str
    mlflow_run_id: str | None
    steps: int
    val_before: float | None = None
    val_after: float | None = None
    history: list[dict[str, float]] = field(default_factory=list)
    #: ``training/global_step`` and the validation metrics before the first step (the plots'
    #: step-0 point); only ``training/global_step`` without val_before_train
    before_training: dict[str, float] = field(default_factory=dict)


# --- one step ----------------------------------------------------------------------------------


def step_metrics(
    result: StepResult, cfg: PPORunConfig, step: int, epoch: int, gen_rounds: int = 1
) -> dict[str, float]:
    """The step's metrics: the stages' own, data, timing, throughput, learning signal (with the
    step's ``gen_rounds`` generation rounds) and ``training/*``."""
    tensors = result.batch.batch
    token_num = tensors[K.ATTENTION_MASK].sum(-1).tolist()  # (B,) prompt + response tokens
    batch = DataProto(
        batch=tensors,
        non_tensor_batch=result.batch.non_tensor_batch,
        meta_info={**result.batch.meta_info, K.GLOBAL_TOKEN_NUM: token_num},
    )
    timing = {
        name.removeprefix("timing_s/"): value
        for name, value in result.metrics.items()
        if name.startswith("timing_s/")
    }
    metrics = dict(result.metrics)
    metrics.update(compute_data_metrics(batch, use_critic=cfg.derived.use_critic))
    metrics.update(compute_timing_metrics(batch, timing))
    metrics.update(compute_throughput_metrics(batch, timing, cfg.derived.dp_size))
    metrics.update(batch_signal_metrics(result.batch, gen_rounds))
    metrics.update(staleness_metrics(result.batch, step))
    if partial_rollouts(cfg):
        metrics.update(partial_metrics(result.batch))
    metrics.update({"training/global_step": float(step), "training/epoch": float(epoch)})
    metrics[CACHE_HITS] = cache_hits(result.records)
    return metrics


class StepOutput(NamedTuple):
    """What :func:`train_step` hands on: the step's metrics, its stage records, and the rows of
    its training-generations table (flows/sinks/train_generations.py; empty when not due)."""

    metrics: dict[str, float]
    records: list[StageRecord]
    generations: list[dict[str, Any]]
    #: the line of a health check with action ``stop`` that tripped at the step, or None
    health_stop: str | None = None


def train_step(run: TrainRun, step: int) -> StepOutput:
    """Load the next prompts (or generate DAPO's rounds), run the step's stages, update the run
    state; the step's metrics, its stage records and its generations table's rows."""
    cfg, epoch = run.cfg, run.loader.epoch
    options = {
        "weights_fingerprints": run.lineage.fingerprint,
        "refresh": () if cfg.ppoflow.cache else [stage.name for stage in PPO_STAGES],
        "retries": IDEMPOTENT_RETRIES,
        "run_weight_writers": True,
    }
    weights_at_start = run.lineage.state_dict()
    launched: dict[str, Any] = {}
    if run.ahead is not None:  # the rollout ran ahead, while earlier steps trained
        taken = run.ahead.take(step, run.total_steps)  # flows/rollout_ahead.py
        planned = StepPlanInput(PPO_STAGES, taken.batch, taken.metrics, 1)
        launched = {"saved_input": taken.input_ref, "ahead": taken.ahead}
    else:
        planned = step_input_of(run, step, options)  # flows/gen_rounds.py
    result = run_step.fn(  # a plain call, not a subflow run: flows/step_flow.py says why
        planned.stages,
        planned.batch,
        StageContext(config=cfg, engines=run.engines, step=step, metrics=planned.metrics),
        run.store,
        step,
        **options,
        **launched,
    )
    # the generation rounds' own step times (summed by merge_round_metrics) are part of the step
    result.metrics["timing_s/step"] += planned.metrics.get("timing_s/step", 0.0)
    run.lineage.advance(PPO_STAGES, result.records)
    if run.kl_ctrl is not None:
        run.kl_ctrl.update(current_kl=result.metrics[KL_METRIC], n_steps=len(result.batch))
    metrics = step_metrics(result, cfg, step, epoch, planned.gen_rounds)
    if run.ahead is not None or run.dropped_stale:  # once after a resume that dropped, on policy
        metrics[DROPPED_METRIC], run.dropped_stale = float(run.dropped_stale), 0
    health = check_health(run, step, metrics, result.batch)
    result.journal.metrics, result.journal.weights = metrics, weights_at_start
    run.store.write_journal(result.journal)
    dump_rollout(cfg.trainer.rollout_data_dir, result.batch, run.tokenizer, step)
    generations = []
    if table_due(step, cfg.trainer.test_freq, run.total_steps):
        groups = cfg.ppoflow.log_train_generations
        generations = train_generation_rows(result.batch, run.tokenizer, step, groups)
    return StepOutput(metrics, result.records, generations, health.stop)


#: each key a PPO stage writes → that stage's name (the health checks name the writer of a bad key)
STAGE_OF_KEY = {ref.name: stage.name for stage in PPO_STAGES for ref in stage.produces}


def check_health(run: TrainRun, step: int, metrics: dict[str, float], batch) -> HealthOutcome:
    """Run the health checks on the finished step (stages/health): their ``health/*`` metrics
    join ``metrics``; each warning is a line on the console and in the flow run's log; the
    checks that cannot run are said once (a warning where the user configured them)."""
    outcome = run.health.check_step(step, metrics, batch, STAGE_OF_KEY)
    for name, why in outcome.not_run_configured.items():
        run.progress.warning(f"health check {name} did not run at step {step}: {why}")
    for name, why in outcome.not_run.items():
        logging.getLogger(__name__).info(
            "health check %s did not run at step %d: %s", name, step, why
        )
    for line in outcome.warnings:
        run.progress.warning(line)
    return outcome


def run_validation(run: TrainRun, step: int) -> tuple[float, dict[str, float]]:
    """Validate and print at ``step`` (generations table → the sinks); returns (mean score,
    val metrics), which the caller logs with the step's metrics."""
    engines = run.engines if run.ahead is None else run.ahead.validation_engines(step)
    result = validate(run.cfg, engines, run.val_set, run.tokenizer, step)
    dump_validation(run.cfg.trainer.validation_data_dir, result.scored, run.tokenizer, step)
    run.progress.validation(step, result.mean_score, result.metrics)
    if result.generations:
        table = f"val_generations/step_{step:06d}.json"  # zero-padded: the files sort by step
        run.sinks.log_table(result.generations, table)
    return result.mean_score, result.metrics


def save_checkpoint(run: TrainRun, step: int, metrics: dict[str, float]) -> None:
    """Checkpoint step ``step`` (flows/runs/checkpoints.py) with the run's identity and the step's
    metrics as they are about to be published, then rewrite run_info.json."""
    identity = {
        "run_dir": run.store.root,
        **mlflow_identity(run.sinks, run.cfg.trainer.project_name),
    }
    state = {**run.run_state(), **tracking_state(identity, metrics)}
    with (
        signals_deferred()
    ):  # a stop signal waits for the checkpoint (flows/process/stop_signals.py)
        save_run_checkpoint(
            run.cfg.trainer.default_local_dir, step, run.engines, state, run.cfg.trainer
        )
        record_run_info(run)


def plot_history(run: TrainRun, result: TrainResult) -> list[dict[str, float]]:
    """The metrics the end-of-run plots draw: a resumed run's earlier steps (its replay
    history), the point before training, then this run's steps."""
    earlier = [] if run.resumed is None else [dict(m) for m in run.resumed.history.values()]
    return [*earlier, result.before_training, *result.history]


def publish_step(
    run: TrainRun,
    step: int,
    records: list[StageRecord],
    metrics: dict,
    mlflow_run_id: str | None,
    val_score: float | None = None,
    generations: list[dict[str, Any]] | None = None,
) -> None:
    """The step's metrics → the metric sinks, its training-generations table's rows (if any) →
    the sinks' tables with the same groups' sample page (flows/runs/sample_page.py), its
    markdown report → a Prefect artifact keyed
    ``<experiment>-<flow run tag>-step-<kkkkkk>`` with the run directory, a link to the MLflow
    run and ``val_score`` (the
    step's validation score, None when it did not validate); on the publishing thread,
    flows/sinks/publisher.py."""
    run.log(metrics, step)
    if generations:
        run.sinks.log_table(generations, TRAIN_TABLE.format(step=step))
        try:
            page = step_page(run.store, step, run.tokenizer, [row["uid"] for row in generations])
        except (ValueError, OSError) as err:  # a page is a view: the run goes on without it
            logging.getLogger(__name__).warning("step %d's sample page not logged: %s", step, err)
        else:
            run.sinks.log_text(page, PAGE.format(step=step))
    key = report_key(run.cfg.trainer.experiment_name, flow_run_tag(), step)
    mlflow_sink = run.sinks.sinks.get("mlflow")
    tracking_uri = getattr(mlflow_sink, "tracking_uri", None)  # the store the run logs to
    publish_step_report(
        step,
        records,
        metrics,
        mlflow_run_id,
        key=key,
        run_dir=run.store.root,
        val_score=val_score,
        tracking_uri=tracking_uri,
    )


def close_quietly(publisher: Publisher) -> None:
    """Stop the publishing thread while a failure propagates, without masking it; not a warning
    when Prefect's temporary server was lost (its report could not be sent: the run's one line
    says why, flows/process/server_guard.py)."""
    try:
        publisher.close()
    except Exception as err:
        level = logging.INFO if server_lost() is not None else logging.WARNING
        logging.getLogger(__name__).log(level, "publishing the last step failed too: %s", err)


def is_due(step: int, freq: int, last: int) -> bool:
    """verl's cadence: every ``freq`` steps (freq > 0) and at the last step."""
    return freq > 0 and (step % freq == 0 or step == last)


# --- the flow ----------------------------------------------------------------------------------


def _train(config, overrides: Sequence[str] = (), run_dir: str | None = None) -> TrainResult:
    """Train with PPO-family RL (module docstring).

    Args:
        config: a config file, a config name in configs/ (``demo-cpu``, ``grpo``), or a
            resolved config object.
        overrides: ``key.path=value`` strings, values parsed as YAML (as on the command line).
        run_dir: the run directory (local path or fsspec URL); default
            ``<ppoflow.artifact_dir>/<experiment_name>-<time>``.
    """
    prepare_own_process()  # a deployment's worker did not start through the ppoflow executable
    log = get_run_logger()  # the flow run's logs in the Prefect UI
    log.info("ppoflow: loading config %s", describe_source(config, overrides))
    startup = current_startup()  # the command line's, else one that only logs
    startup.logger = log
    if startup.pending == "Prefect":  # begun by the command line before the flow started
        startup.end(describe_prefect(flow_run.get_name()))
    run = take_opened_run(startup, config, overrides, run_dir)
    if run is None:
        run = open_run(resolve_config(config, overrides), run_dir, startup)
    cfg = run.cfg
    startup.ready()
    run.progress.logger = log  # step and validation lines also go to the flow run's logs
    log.info("ppoflow: run directory %s, %d steps", run.store.root, run.total_steps)
    result = TrainResult(run.store.root, None, run.total_steps)
    result.before_training = {"training/global_step": float(run.start_step - 1)}
    status = "FAILED"
    publisher = Publisher()
    try:
        with latch_stop_signals():  # a stop whose exception was swallowed still ends the run
            _train_steps(run, result, publisher)
        status = "FINISHED"
    except BaseException as err:
        if is_stop(err):  # SIGTERM / SIGINT (flows/process/stop_signals.py)
            status = "KILLED"
        raise
    finally:
        run.progress.close()  # stop the live bar, also when the run failed
        close_quietly(publisher)
        close_run_engines(run)
        result.mlflow_run_id = run.sinks.run_ids.get("mlflow")
        try:
            if result.history:  # also the steps of a run that failed part-way
                run.sinks.log_plots(plot_history(run, result))
        finally:
            run.sinks.close(status)
            if run.lock is not None:
                run.lock.release()
    run.progress.summary(summary_rows(result, cfg))
    return result


def _train_steps(run: TrainRun, result: TrainResult, publisher: Publisher) -> None:
    """The training loop of :func:`_train`: validation before training, the steps with their
    validations, checkpoints, retention and publishing; a latched stop signal ends it at a step
    boundary (flows/process/stop_signals.py ``raise_if_stop_requested``)."""
    cfg = run.cfg
    result.mlflow_run_id = run.sinks.run_ids.get("mlflow")
    if cfg.trainer.val_before_train:
        result.val_before, val_metrics = run_validation(run, run.start_step - 1)
        run.log(val_metrics, run.start_step - 1)
        result.before_training.update(val_metrics)
    last = run.start_step - 1 if cfg.trainer.val_only else run.total_steps
    for step in range(run.start_step, last + 1):
        raise_if_stop_requested()
        metrics, records, generations, health_stop = train_step(run, step)
        val_score = None
        save_due = is_due(step, cfg.trainer.save_freq, run.total_steps)
        if is_due(step, cfg.trainer.test_freq, run.total_steps):
            publisher.wait()  # validation logs through the same sinks
            try:
                result.val_after, val_metrics = run_validation(run, step)
            except Exception:
                if save_due:  # the step's training is kept (without its validation)
                    save_checkpoint(run, step, metrics)
                raise
            val_score = result.val_after
            metrics.update(val_metrics)
        if save_due:
            save_checkpoint(run, step, metrics)
        run.retention.after_step(step)
        publisher.submit(
            publish_step, run, step, records, metrics, result.mlflow_run_id, val_score, generations
        )
        run.progress.step(step, metrics)
        result.history.append(metrics)
        if health_stop is not None:  # the step is saved and logged: stop here
            publisher.close()
            raise stop_error(health_stop, step)
    publisher.close()
    record_run_info(run)


def summary_rows(result: TrainResult, cfg: PPORunConfig) -> dict[str, Any]:
    last = result.history[-1] if result.history else {}
    return {
        "steps": str(len(result.history)),
        "val score before": result.val_before,
        "val score after": result.val_after,
        "last train score": last.get(SCORE),
        "MLflow run": result.mlflow_run_id or "-",
        "checkpoints": str(cfg.trainer.default_local_dir) if cfg.trainer.save_freq > 0 else "-",
        "run dir": result.run_dir,
    }


def training_run_name() -> str:
    """The training flow run's name in Prefect: the run directory's name
    (``grpo-tiny-20261204-220653-344813``) when it is known as the flow starts — the run the command
    line opened ahead, else the ``run_dir`` parameter — else ``train-<config file stem>`` (a
    deployment's run directory is made inside the flow); ``ppo-train`` for a config object."""
    opened = current_startup().opened
    run_dir = opened[1].store.root if opened is not None else flow_run.parameters.get("run_dir")
    if run_dir:
        return str(run_dir).rstrip("/").rsplit("/", 1)[-1]
    config = flow_run.parameters.get("config")
    if isinstance(config, str | os.PathLike):
        return f"train-{os.path.splitext(os.path.basename(config))[0]}"
    return "ppo-train"


train = StepFlow(
    fn=_train,
    name="ppo-train",
    flow_run_name=training_run_name,
    validate_parameters=False,
    persist_result=False,
)
