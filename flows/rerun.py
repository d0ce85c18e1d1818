"""Re-running stages of a past step into a new run branch: ``ppoflow rerun``.

``rerun(run_dir, step, from_stage, to_stage, overrides)`` recomputes stage ``from_stage`` of step
``step`` and every enabled stage after it (up to ``to_stage``) under the run's config plus
``overrides``, into a new run directory. The original run is only read, never written:

1. the new run gets the parent's resolved config with the overrides applied, a ``rerun.json``
   naming the parent, and a copy of the parent's cache records (small ArtifactRefs), so a stage
   whose cache key did not change is a cache hit on the parent's artifact;
2. the step's input is the parent's ``step_<k>/input`` artifact (same prompts, uids, KL β);
3. the stages before ``from_stage`` are not run: their artifacts are loaded from the parent's
   journal (``flows.stage_task.reuse_stage``, fingerprints checked), so their key fingerprints —
   and therefore the cache keys downstream — are those of the original step. A stage the parent
   skipped but the new config enables (e.g. ``ref_log_prob`` after turning KL on) is computed;
4. the stages from ``from_stage`` on run as cached stage tasks (``flows.step_flow.run_step``):
   with unchanged config and inputs they hit the cache, otherwise they compute. ``--refresh``
   recomputes them regardless;
5. the step's metrics (the stages', and data / timing / throughput and the health checks'
   ``health/*`` when the batch reached the advantage stage; a check that trips is a warning in
   the log, never a stop) are compared with the parent's journal: ``metric_diff`` (flows/rerun_diff.py; with ``--to``,
   only the metrics the re-run produced; metrics of the stages after it are not changes);
6. with ``mlflow`` in ``trainer.logger``, the branch is an MLflow run (``log_branch_run``, flows/rerun_diff.py)
   in the parent's experiment (``trainer.project_name``) and, unless
   ``ppoflow.mlflow_tracking_uri`` or ``MLFLOW_TRACKING_URI`` names another, in the store the
   parent's run_info.json records (else the project store, flows/sinks/mlflow_store.py); run name
   ``<experiment_name>-rerun-step<K>-<from>``; tags ``ppoflow.parent_run_dir``,
   ``ppoflow.parent_mlflow_run_id`` and ``mlflow.parentRunId`` (when the parent recorded its
   run, and it is in the same store, so the MLflow UI nests the branch under it),
   ``ppoflow.rerun.*`` (step, from, to, overrides) and the training runs' tags
   (flows/runs/identity.py); the branch config as params; the step's metrics at step K; and the
   metric diff as the table artifact ``metric_diff.json`` (metric, original, re-run, delta).
   The branch directory gets a run_info.json naming that run.

Nothing of the parent is written (a parent on a read-only disk can be branched): the parent's
artifact retention finds the branch from the branch's ``rerun.json`` (beside the parent, or
through this machine's branch index, where the re-run notes it: flows/runs/branches.py). Every
check that needs only the parent (stage names, the step and its journal, the overrides, the
step input and the reused artifacts) is made before anything is written; a re-run that fails
after that (a missing checkpoint, a scorer that fails, an interrupt) removes what it wrote
(:func:`removed_on_failure`), so a failed or refused re-run leaves no branch directory.

Engines are built lazily (:class:`LazyEngines`): only a stage that actually computes touches
one. Weight-reading stages need the weights at the start of step k: the initial model for step
1, else the checkpoint saved after step k − 1 (``trainer.save_freq``) under
``trainer.default_local_dir`` (the parent's, unless an override points elsewhere); if it is
missing the stage fails naming the checkpoint and how to get one, and it is checked against
its step's manifest before the engine is built (``verify_checkpoint``, every file hashed: a
damaged or moved checkpoint is one ``CheckpointIntegrityError`` line naming the file). The
weights fingerprints of the cache keys are the parent journal's ``weights``. The rollout of a
step whose batch was launched ahead by older weights θ_v (``ppoflow.schedule`` one_step_off /
fully_async: the step input's ``policy_version`` v < k − 1) runs on an actor with the weights
after step v (the checkpoint saved after step v), keyed by the weights its parent record names
(:func:`rollout_launched_ahead`), so re-running it computes what the run computed.
"""

from __future__ import annotations

import functools
import json
import logging
import shutil
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import fsspec

from dataproto import keys as K
from dataproto.artifact import ArtifactError, Verify, load_artifact, read_manifest
from flows.cache.keys import artifact_key_fingerprints
from flows.dag import batch_keys
from flows.engines import (
    WeightsLineage,
    build_reward,
    build_role,
    close_engines,
    reference_handle,
    roles_for,
)
from flows.partial_rollout import NoSegmentWeights, is_partial_key
from flows.process.device import apply_device
from flows.rerun_diff import (
    MetricChange,
    compared_names,
    log_branch_run,
    metric_diff,
)
from flows.rerun_rounds import check_round, planned_stages, round_view
from flows.runs.branches import index_dir, note_branch, parent_chain, remove_notes
from flows.runs.checkpoints import DATA_ROLE, STATE_FILE
from flows.runs.retention import pruned_error
from flows.runs.store import (
    CONFIG_FILE,
    RERUN_FILE,
    RunStore,
    StageRecord,
    StepJournal,
    lies_in,
)
from flows.stage_task import StageOutcome, check_reusable, run_stage
from flows.step_flow import StepFlow, StepResult, run_step
from flows.train import STAGE_OF_KEY, step_metrics
from stages.config import PPORunConfig, apply_overrides, validate_config
from stages.engines.checkpoint import checkpoint_dir
from stages.engines.checkpoint_manifest import verify_checkpoint
from stages.health.monitor import HealthMonitor
from stages.metrics.signal import GEN_ROUNDS
from stages.ppo import PPO_STAGES
from stages.reward.stage import LOOP_ENGINE, MODEL_ENGINE
from stages.rollout import ROLLOUT_STAGE
from stages.schedules import POLICY_VERSION
from stages.stage import Stage, StageContext

log = logging.getLogger(__name__)

#: the flow-computed last stage of the stage table (docs/architecture.md) (data, timing, throughput metrics)
METRICS_STAGE = "metrics"
STAGE_NAMES: tuple[str, ...] = (*(stage.name for stage in PPO_STAGES), METRICS_STAGE)
# --- which stages --------------------------------------------------------------------------------


def check_stage_name(name: str, option: str) -> str:
    """``name`` if it is a stage of the stage table (docs/architecture.md), else a ValueError listing them."""
    if name not in STAGE_NAMES:
        raise ValueError(f"{option} {name!r} is not a stage; stages are {list(STAGE_NAMES)}")
    return name


def stage_window(
    from_stage: str, to_stage: str | None, planned: Sequence[Stage] = PPO_STAGES
) -> tuple[tuple[Stage, ...], list[str]]:
    """(the stages of ``planned`` the re-run plans, up to ``to_stage``; the names of those before
    ``from_stage``). ``planned``: the step's stages (a step of dynamic sampling plans its training
    or its round's generation stages, flows/rerun_rounds.py).

    >>> stages, before = stage_window("advantage", "advantage")
    >>> [s.name for s in stages][-1], before[:2]
    ('advantage', ['rollout', 'baseline_rollout'])
    """
    check_stage_name(from_stage, "--from")
    to_stage = check_stage_name(to_stage or METRICS_STAGE, "--to")
    if STAGE_NAMES.index(to_stage) < STAGE_NAMES.index(from_stage):
        raise ValueError(
            f"--to {to_stage!r} comes before --from {from_stage!r}; stages run in the order "
            f"{list(STAGE_NAMES)}"
        )
    names = list(STAGE_NAMES[: STAGE_NAMES.index(to_stage) + 1])
    stages = tuple(stage for stage in planned if stage.name in names)
    return stages, list(STAGE_NAMES[: STAGE_NAMES.index(from_stage)])


def reusable_records(journal: StepJournal, before: Sequence[str]) -> dict[str, Any]:
    """The parent's records of the stages before ``--from`` that have an artifact to reuse."""
    return {
        record.stage: record
        for record in journal.stages
        if record.stage in before and record.status != "skipped" and record.artifact
    }


# --- engines, built only when a stage computes --------------------------------------------------


class LazyEngines(Mapping[str, Any]):
    """``StageContext.engines`` whose entries are built on first access.

    ``builders`` maps an engine name to a function returning a dict of engines (one builder may
    make several, e.g. the reward loop and reward model). ``built`` lists the names built so far,
    so a caller can show that a cached re-run touched no model.
    """

    def __init__(self, builders: Mapping[str, Callable[[], dict[str, Any]]]) -> None:
        self._builders = dict(builders)
        self._engines: dict[str, Any] = {}
        self.built: list[str] = []

    def __getitem__(self, name: str) -> Any:
        if name not in self._engines:
            if name not in self._builders:
                raise KeyError(name)
            made = self._builders[name]()
            self._engines.update(made)
            self.built.extend(sorted(made))
        return self._engines[name]

    def __contains__(self, name: object) -> bool:
        return name in self._builders

    def __iter__(self) -> Iterator[str]:
        return iter(self._builders)

    def __len__(self) -> int:
        return len(self._builders)

    def close(self) -> None:
        close_engines(self._engines)


def checkpoint_root(cfg: PPORunConfig) -> Path:
    """``trainer.default_local_dir``: the parent's, unless the re-run's overrides move it."""
    return Path(cfg.trainer.default_local_dir)


def missing_checkpoint_error(role: str, step: int, directory: Path) -> FileNotFoundError:
    root = directory.parent.parent
    kept = sorted(p.name for p in root.glob("global_step_*")) if root.is_dir() else []
    return FileNotFoundError(
        f"re-running a stage that uses the {role} weights of step {step} needs the checkpoint "
        f"saved after step {step - 1}, but {directory} does not exist (checkpoints there: "
        f"{kept or 'none'}). Train with trainer.save_freq dividing {step - 1} (e.g. "
        "trainer.save_freq=1) and enough trainer.max_actor_ckpt_to_keep, or re-run from a "
        "stage that uses no weights (reward, advantage)"
    )


def role_builder(
    cfg: PPORunConfig, role: str, step: int, total_steps: Callable[[], int]
) -> Callable[[], dict[str, Any]]:
    """Builds ``role`` with the weights at the start of ``step`` (module docstring);
    ``total_steps()`` is the run's step count (the lr schedule's length)."""

    def build() -> dict[str, Any]:
        apply_device(cfg)
        directory = checkpoint_dir(checkpoint_root(cfg), step - 1, role)
        restore = step > 1 and role != "ref"  # the reference policy never changes
        if restore and not directory.is_dir():
            raise missing_checkpoint_error(role, step, directory)
        if restore:
            verify_checkpoint(checkpoint_root(cfg), step - 1, (role,))
        engine = build_role(cfg, role, total_steps())
        try:
            if restore:
                engine.call_all("load_checkpoint", directory=str(directory))
        except BaseException:
            engine.close()
            raise
        return {role: engine}

    return build


def lazy_engines(cfg: PPORunConfig, step: int) -> LazyEngines:
    """Every engine ``cfg`` may need, none built yet; the tokenizer and the train set (for the
    step count) are read at most once, and only when an engine is built."""
    from flows.train_run import load_datasets
    from stages.data import load_tokenizer

    @functools.cache
    def tokenizer() -> Any:
        return load_tokenizer(cfg.actor_rollout_ref.model.tokenizer_path)

    @functools.cache
    def total_steps() -> int:
        if cfg.trainer.total_training_steps:
            return int(cfg.trainer.total_training_steps)
        train_set, _ = load_datasets(cfg, tokenizer())
        return cfg.resolve_total_training_steps(len(train_set))

    def reward() -> dict[str, Any]:
        return build_reward(cfg, tokenizer())

    builders: dict[str, Callable[[], dict[str, Any]]] = {
        role: role_builder(cfg, role, step, total_steps) for role in roles_for(cfg)
    }
    builders.update({LOOP_ENGINE: reward, MODEL_ENGINE: reward})
    if cfg.derived.use_reference_policy and cfg.derived.reference_in_actor:
        builders["ref"] = lambda: reference_handle(cfg, engines)  # the actor's base
    engines = LazyEngines(builders)
    return engines


def weights_at_start(journal: StepJournal, parent_cfg: PPORunConfig, step: int) -> dict[str, str]:
    """role → weights fingerprint at the start of ``step``: the journal's, else the checkpoint
    after step − 1 (its lineage), else (step 1) the initial models'."""
    if journal.weights:
        return dict(journal.weights)
    if step == 1:
        return WeightsLineage.from_config(parent_cfg).state_dict()
    state = checkpoint_dir(checkpoint_root(parent_cfg), step - 1, DATA_ROLE) / STATE_FILE
    if state.is_file():
        return dict(json.loads(state.read_text(encoding="utf-8"))["weights_lineage"])
    return {}


def weights_lookup(weights: dict[str, str], step: int) -> Callable[[Stage], str]:
    def fingerprint(stage: Stage) -> str:
        if stage.engine not in weights:
            raise KeyError(
                f"stage {stage.name!r} reads the {stage.engine} weights, but step {step} of the "
                "parent run records no weights fingerprint and has no checkpoint of the step "
                "before; re-run from a stage after it"
            )
        return weights[stage.engine]

    return fingerprint


# --- the flow ------------------------------------------------------------------------------------


@dataclass
class RerunResult:
    """What a re-run made: the new run dir, the step's stage records and metrics, the metric
    diff."""

    run_dir: str
    parent_dir: str
    step: int
    records: list[StageRecord]
    metrics: dict[str, float]
    changes: list[MetricChange]
    unchanged: int
    engines_built: list[str] = field(default_factory=list)
    mlflow_run_id: str | None = None  # the branch's MLflow run (None without an MLflow sink)


def branch_info(
    parent_root: str,
    step: int,
    from_stage: str,
    to_stage: str | None,
    overrides: Sequence[str],
    gen_round: int | None = None,
) -> dict[str, Any]:
    """What a branch records of how it was made (its run info's ``branch``, and its MLflow
    run's tags, flows/rerun_diff.py)."""
    info: dict[str, Any] = {
        "parent_run_dir": parent_root,
        "step": step,
        "from": from_stage,
        "to": to_stage or METRICS_STAGE,
        "overrides": list(overrides),
    }
    if gen_round is not None:
        info["round"] = gen_round
    return info


def default_rerun_dir(parent_dir: str, step: int, from_stage: str) -> str:
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S-%f")
    return f"{parent_dir.rstrip('/')}-rerun-step{step}-{from_stage}-{stamp}"


def parent_step(parent: RunStore, step: int) -> StepJournal:
    """The parent's finished journal of ``step``; a clear error when there is none, or when it
    names an artifact outside the parent (``RunStore.check_journal_paths``)."""
    steps = parent.steps()
    if step not in steps:
        raise ValueError(f"{parent.root} has no step {step}; its steps are {steps or 'none'}")
    journal = parent.check_journal_paths(parent.read_journal(step))
    if journal.status != "done" or journal.input_artifact is None:
        raise ValueError(
            f"step {step} of {parent.root} did not finish (journal status {journal.status!r}); "
            "re-run a finished step"
        )
    if journal.pruned is not None:
        raise pruned_error(journal, parent.root)
    return journal


def load_step_input(journal: StepJournal, origin: str, verify: Verify) -> Any:
    """The step's input artifact, after checking it holds the fingerprint the journal recorded.

    Raises:
        ArtifactError: the file holds other content (a swapped or replaced input), named.
    """
    manifest = read_manifest(journal.input_artifact)
    if manifest["fingerprint"] != journal.input_fingerprint:
        raise ArtifactError(
            f"{journal.input_artifact}: holds fingerprint {manifest['fingerprint'][:16]}…, but "
            f"the journal of {origin} records {str(journal.input_fingerprint)[:16]}… for step "
            f"{journal.step}'s input (the artifact was replaced or swapped); restore it or "
            "re-run another step"
        )
    return load_artifact(journal.input_artifact, verify=verify)


def open_branch(parent: RunStore, cfg: PPORunConfig, new_dir: str, info: dict) -> RunStore:
    """The new run dir: config, ``rerun.json``, and a copy of the parent's cache records; the
    branch looks for cache hits' artifacts in its own directory, then in its parent chain."""
    store = RunStore(new_dir, parents=[parent.root, *parent_chain(parent.root)])
    fs, path = fsspec.core.url_to_fs(store.root)
    if fs.exists(path) and not fs.isdir(path):
        raise ValueError(f"{store.root} is a file; choose a new directory as --run-dir")
    if store.steps() or store.exists(RERUN_FILE) or store.exists(CONFIG_FILE):
        raise ValueError(f"{store.root} already holds a run; choose another --run-dir")
    if any(lies_in(store.root, run) for run in store.parents):
        raise ValueError(
            f"{store.root} lies inside the run {parent.root} (or a run it branched from), which "
            "a re-run only reads; choose a --run-dir outside it"
        )
    store.save_config(cfg)
    store.save_json(RERUN_FILE, info)
    if Path(parent.cache_dir).is_dir():
        shutil.copytree(parent.cache_dir, store.cache_dir, dirs_exist_ok=True)
    return store


@contextmanager
def removed_on_failure(root: str) -> Iterator[None]:
    """Run the block; when it raises, remove what it added under the run directory ``root``:
    the directory itself when the block made it, else the entries it added (a ``--run-dir``
    that existed keeps what it held; a path that was a file is left alone). A refused or
    failed re-run leaves no branch."""
    fs, path = fsspec.core.url_to_fs(root)
    existed, was_dir = fs.exists(path), fs.isdir(path)
    before = {entry.rstrip("/") for entry in fs.ls(path, detail=False)} if was_dir else set()
    try:
        yield
    except BaseException:
        with suppress(OSError):
            if not existed:
                if fs.exists(path):
                    fs.rm(path, recursive=True)
            elif was_dir:
                for entry in fs.ls(path, detail=False):
                    if entry.rstrip("/") not in before:
                        fs.rm(entry, recursive=True)
        raise


def note_in_index(store: RunStore, step: int) -> list[Path]:
    """Note the branch in this machine's branch index for its parent chain (so their retention
    keeps the step's artifacts, flows/runs/branches.py); the notes written. An index that
    cannot be written is one warning: the branch is then found only beside its parent."""
    chain = list(store.parents)
    try:
        return note_branch(store.root, step, chain)
    except OSError as err:
        log.warning(
            "could not note the branch %s in the branch index %s (%s); the artifact retention "
            "of %s finds it only when it lies beside that run",
            store.root,
            index_dir(),
            err,
            chain[0],
        )
        return []


def launched_ahead_version(step_input: Any, step: int) -> int | None:
    """The policy version v that generated the step's batch when it is older than the step's
    own weights (a rollout launched ahead, flows/rollout_ahead.py: v < step − 1), else None."""
    versions = step_input.non_tensor_batch.get(POLICY_VERSION)
    if versions is None or len(versions) == 0 or int(versions[0]) == step - 1:
        return None
    return int(versions[0])


def rollout_launched_ahead(
    cfg: PPORunConfig,
    journal: StepJournal,
    step_input: Any,
    store: RunStore,
    version: int,
    refresh: bool,
    verify: Verify,
) -> StageOutcome:
    """The rollout of a step whose batch weights θ_v generated: on an actor built with the
    weights after step v (the initial model for v = 0, else the checkpoint saved after step v,
    which the run must have), keyed by the weights fingerprint the parent's rollout recorded;
    the step's other weight-reading stages read the step's own weights, as in the parent. A
    partial rollout (several weights, flows/partial_rollout.py) is reused, never generated
    again (:class:`~flows.partial_rollout.NoSegmentWeights`)."""
    step, record = journal.step, journal.record(ROLLOUT_STAGE.name)
    partial = is_partial_key(record.key_parts["weights"])  # reused, or one error line
    # else the weights at the start of step v + 1: θ_v
    engines = {"actor": NoSegmentWeights(step)} if partial else lazy_engines(cfg, version + 1)
    try:
        return run_stage(
            ROLLOUT_STAGE,
            step_input,
            StageContext(config=cfg, engines=engines, step=step),
            store,
            step,
            fingerprints=artifact_key_fingerprints(
                journal.input_fingerprint, batch_keys(step_input)
            ),
            weights_fingerprint=record.key_parts["weights"],
            refresh=refresh,
            verify=verify,
            previous=record,
        )
    finally:
        if not partial:
            engines.close()


def run_branch_step(
    store: RunStore,
    cfg: PPORunConfig,
    parent_cfg: PPORunConfig,
    journal: StepJournal,
    stages: tuple[Stage, ...],
    before: list[str],
    step_input: Any,
    reuse: dict[str, Any],
    origin: str,
    refresh: bool,
    verify: Verify,
) -> tuple[StepResult, dict[str, float], list[str]]:
    """Run the step's stages into the branch ``store`` and write its journal: (the step's
    result, its metrics, the engines built)."""
    step = journal.step
    ahead = {}
    if ROLLOUT_STAGE.name in {stage.name for stage in stages} and ROLLOUT_STAGE.name not in reuse:
        version = launched_ahead_version(step_input, step)
        if version is not None:
            ahead[ROLLOUT_STAGE.name] = rollout_launched_ahead(
                cfg, journal, step_input, store, version, refresh, verify
            )
    engines = lazy_engines(cfg, step)
    try:
        result = run_step.fn(
            stages,
            step_input,
            StageContext(config=cfg, engines=engines, step=step),
            store,
            step,
            weights_fingerprints=weights_lookup(weights_at_start(journal, parent_cfg, step), step),
            refresh=[s.name for s in stages if s.name not in before] if refresh else (),
            verify=verify,
            reuse=reuse,
            reuse_origin=origin,
            previous=journal,
            ahead=ahead,
        )
    finally:
        engines.close()
    metrics = dict(result.metrics)
    if K.ADVANTAGES in result.batch.batch:
        epoch = int(journal.metrics.get("training/epoch", 0))
        rounds = int(journal.metrics.get(GEN_ROUNDS, 1))  # the parent's generation rounds
        metrics = step_metrics(result, cfg, step, epoch, rounds)
        # the training's checks, as metrics and lines
        health = HealthMonitor(cfg).check_step(step, metrics, result.batch, STAGE_OF_KEY)
        for line in [*health.warnings, *([health.stop] if health.stop else [])]:
            log.warning(line)
    result.journal.metrics, result.journal.weights = metrics, dict(journal.weights)
    store.write_journal(result.journal)
    return result, metrics, list(engines.built)


def open_parent(run_dir: str) -> tuple[RunStore, PPORunConfig]:
    """The run to branch from and its validated config; ValueError when ``run_dir`` is not a
    run directory."""
    parent = RunStore(run_dir)
    if not parent.exists(CONFIG_FILE):
        raise ValueError(
            f"{parent.root} is not a ppoflow run directory (no {CONFIG_FILE}); pass the "
            "directory that ppoflow train printed last"
        )
    return parent, validate_config(parent.load_config(), f"{parent.root}/{CONFIG_FILE}")


def _rerun(
    run_dir: str,
    step: int,
    from_stage: str,
    to_stage: str | None = None,
    overrides: Sequence[str] = (),
    new_run_dir: str | None = None,
    refresh: bool = False,
    verify: Verify = "full",
    gen_round: int | None = None,
    mlflow_parent: str | None = None,
    log_mlflow: bool = True,
) -> RerunResult:
    """Re-run stages of step ``step`` of ``run_dir`` (module docstring); with ``gen_round``, of
    that generation round of a step with dynamic sampling (flows/rerun_rounds.py); with
    ``mlflow_parent``, the branch's MLflow run is nested under that run (a sweep's,
    flows/rerun_sweep.py). ``log_mlflow=False`` leaves the branch's MLflow run to the caller
    (a sweep's branch in a process of its own, flows/sweep_processes.py: the sweep's process
    logs it, so that one process writes the store)."""
    check_stage_name(from_stage, "--from")
    parent, parent_cfg = open_parent(run_dir)
    planned = planned_stages(parent_cfg, gen_round, from_stage)
    stages, before = stage_window(from_stage, to_stage, planned)
    cfg = apply_overrides(parent_cfg, list(overrides)) if overrides else parent_cfg
    parent_step(parent, step)  # the step finished (and its journal is the parent's)
    check_round(parent, step, gen_round)
    journal = parent_step(round_view(parent, gen_round), step)
    info = branch_info(parent.root, step, from_stage, to_stage, overrides, gen_round)
    origin = f"{parent.root} step {step}" + ("" if gen_round is None else f" round {gen_round}")
    step_input = load_step_input(journal, origin, verify)  # read before the branch is written,
    reuse = reusable_records(journal, before)
    check_reusable(reuse, origin, verify)  # so a damaged parent leaves no half-made branch
    label = from_stage if gen_round is None else f"round{gen_round}-{from_stage}"
    new_dir = new_run_dir or default_rerun_dir(parent.root, step, label)
    notes: list[Path] = []
    try:
        with removed_on_failure(new_dir):  # the parent is only read; a failure leaves no branch
            store = open_branch(parent, cfg, new_dir, info)
            notes = note_in_index(store, step)  # the parent's retention keeps the step meanwhile
            result, metrics, engines_built = run_branch_step(
                round_view(store, gen_round), cfg, parent_cfg, journal, stages, before,
                step_input, reuse, origin, refresh, verify,
            )  # fmt: skip
            original = dict(journal.metrics)
            if (to_stage or METRICS_STAGE) != METRICS_STAGE:  # stages after --to did not run
                original = {name: value for name, value in original.items() if name in metrics}
            changes = metric_diff(original, metrics)
            mlflow_run_id = None
            if log_mlflow and "mlflow" in cfg.trainer.logger:
                mlflow_run_id = log_branch_run(
                    cfg, parent, store, info, metrics, changes, mlflow_parent
                )
    except BaseException:
        remove_notes(notes)
        raise
    return RerunResult(
        run_dir=store.root,
        parent_dir=parent.root,
        step=step,
        records=result.records,
        metrics=metrics,
        changes=changes,
        unchanged=len(compared_names(original, metrics)) - len(changes),
        engines_built=engines_built,
        mlflow_run_id=mlflow_run_id,
    )


rerun = StepFlow(
    fn=_rerun,
    name="ppo-rerun",
    flow_run_name="rerun-step{step}-from-{from_stage}",
    validate_parameters=False,
    persist_result=False,
)
