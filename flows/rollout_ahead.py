"""The rollouts launched ahead: step k + 1 … k + D generate on the replica while step k trains.

The schedules whose rollout runs apart (``stages.schedules``: ``one_step_off``, verl's
``one_step_off_policy``, D = 1 and a sync every step; ``fully_async``, verl's
``fully_async_policy``, D = ⌊(1 + s)·T⌋ and a sync every T steps), in step k of the training
loop (:meth:`RolloutAhead.take`):

1. take batch k: its rollout, launched D steps earlier, waited for (``timing_s/rollout_wait``;
   in a run's first step it is launched now, after a sync with θ_0);
2. when ``k − 1`` is a multiple of T, sync the replica with the actor's weights θ_{k−1}
   (``timing_s/param_sync``): at once when the replica is idle, else as a job queued behind the
   rollouts still running, with a copy of the weights taken now;
3. launch every batch up to k + D not launched yet: draw its prompts, tag each row with the
   version of the weights the replica will hold when it runs (``policy_version``), store it
   (``step_<j>/input``) and queue its rollout stage on the replica's lane — one thread that runs
   the replica's jobs in order — with the replica as the stage's ``actor`` engine:
   ``flows.stage_task.run_stage`` as in any step, so its artifact, record and cache key (whose
   weights fingerprint is the lineage of the weights it reads) are a stage's;
4. the caller trains step k on batch k (``run_step`` merges the rollout's outcome, ``ahead``).

**Partial rollouts** (``async_training.partial_rollout``, flows/partial_rollout.py): a batch
that a sync would find in flight (``stages.schedules.partial_cuts``) is launched as its first
segment only; after each such sync (step 2) its next segment is queued on the replica's new
weights, the last one as the batch's rollout stage.

The syncs and launches are queued in an order fixed by the step count, never by timing, so a run
whose every job runs at once in the main thread (:class:`InlineLane`) computes the same batches
and ends with the same weights. Validation generates on the replica too: it waits for the
launched rollouts, syncs the newest weights, and the launches after it (until the next sync)
read those (their ``policy_version`` says so).

**Checkpoints.** A checkpoint after step k waits for the launched rollouts and records them
(:meth:`RolloutAhead.state`: each one's step, input artifact and stage record); the loader
position it saves is already past them. :meth:`RolloutAhead` takes them back on resume, so the
resumed run trains on the very batches the interrupted run generated (loaded and verified, not
generated again) and neither drops nor repeats a prompt; the checkpoint falls on a step that
ends a sync period (``trainer.save_freq`` a multiple of T), so the next step syncs the
checkpoint's weights as the uninterrupted run does.
"""

from __future__ import annotations

import contextvars
import functools
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from time import perf_counter
from typing import Any

from dataproto import DataProto
from dataproto.artifact import ArtifactRef, load_artifact, read_manifest, save_artifact
from flows.cache.keys import artifact_key_fingerprints
from flows.dag import batch_keys
from flows.gen_rounds import next_step_input
from flows.partial_rollout import FinishingEngine, PartialRollout
from flows.runs.store import StageRecord, relative_to_root, resolve_in_root
from flows.stage_task import StageOutcome, artifact_digest, reuse_stage, run_stage
from stages.engines.rollout_replica import build_replica
from stages.rollout import ROLLOUT_STAGE, generation_prompts, sampling_seed
from stages.schedules import (
    POLICY_SCHEDULES,
    Pace,
    pace_of,
    partial_cuts,
    partial_rollouts,
    with_policy_version,
)
from stages.stage import StageContext

#: where a checkpoint keeps a partial rollout's segments done: ``step_<j>/rollout_partial``
PARTIAL_ARTIFACT = "rollout_partial"
#: the record reason of a rollout restored from a checkpoint
RESTORED_ORIGIN = "the rollout launched before the checkpoint"
#: step metrics of the schedule (catalog: stages/metrics/catalog.py)
WAIT_METRIC, SYNC_METRIC = "timing_s/rollout_wait", "timing_s/param_sync"
#: the part of the step's wall time spent here (train_step adds it to the stages' timing_s/step)
STEP_METRIC = "timing_s/step"
#: rows of launched rollouts a resume dropped as stale (:func:`restored_for`), verl's name
DROPPED_METRIC = "fully_async/count/dropped_stale_samples"


class Lane:
    """One daemon thread running the replica's jobs in the order they were submitted, each in a
    copy of the submitting thread's context (so the Prefect flow run is its parent)."""

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._open = 0  # jobs submitted and not finished; only the submitting thread adds
        self._lock = threading.Lock()
        threading.Thread(target=self._work, name="ppoflow-rollout-lane", daemon=True).start()

    def submit(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Future:
        """``fn(*args, **kwargs)`` after every job submitted before; its result or exception in
        the returned future."""
        future: Future = Future()
        with self._lock:
            self._open += 1
        self._jobs.put((future, contextvars.copy_context(), fn, args, kwargs))
        return future

    def idle(self) -> bool:
        """No job queued or running (exact while only the caller submits)."""
        with self._lock:
            return self._open == 0

    def _work(self) -> None:
        while True:
            future, context, fn, args, kwargs = self._jobs.get()
            result, error = None, None
            if future.set_running_or_notify_cancel():
                try:
                    result = context.run(fn, *args, **kwargs)
                except BaseException as err:  # handed to the future's reader
                    error = err
            with self._lock:  # idle before the reader wakes
                self._open -= 1
            if error is not None:
                future.set_exception(error)
            elif future.running():
                future.set_result(result)


class InlineLane:
    """A :class:`Lane` that runs each job at once in the submitting thread: the same schedule
    with no overlap (the tests' serial reference)."""

    def submit(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Future:
        future: Future = Future()
        try:
            future.set_result(fn(*args, **kwargs))
        except BaseException as err:
            future.set_exception(err)
        return future

    def idle(self) -> bool:
        return True


def done(value: Any) -> Future:
    future: Future = Future()
    future.set_result(value)
    return future


@dataclass
class Launch:
    """A step's rollout launched ahead: the step input as stored, and the rollout's outcome —
    for a partial rollout (flows/partial_rollout.py) None until its last segment is queued,
    its earlier segments' jobs in ``segments``."""

    step: int
    batch: DataProto
    input_ref: ArtifactRef
    outcome: Future | None
    partial: PartialRollout | None = None
    segments: list[Future] = field(default_factory=list)

    def cuts(self, pace: Pace, response_length: int) -> dict[int, int]:
        """Sync step → the segment it starts (1, 2, …): the syncs still to interrupt it."""
        if self.partial is None:
            return {}
        syncs = [sync for sync, _ in partial_cuts(self.step, pace, response_length)]
        return {
            sync: index
            for index, sync in enumerate(syncs, 1)
            if index >= len(self.partial.segments)
        }


@dataclass
class Taken:
    """What :meth:`RolloutAhead.take` hands the step: its input (as stored), the rollout's outcome
    for ``run_step(ahead=...)``, and the schedule's metrics of the step."""

    batch: DataProto
    input_ref: ArtifactRef
    ahead: dict[str, StageOutcome]
    metrics: dict[str, float]


class RolloutAhead:
    """The rollouts a training run launches ahead (module docstring).

    Args:
        run: the training run (``flows.train_run.TrainRun``); its actor engine's rank 0 gives
            the weights (``ActorWorker.full_weights``) on any worker backend.
        next_input: step → the step's input batch (draws the loader's next prompts).
        refresh: whether the rollout recomputes on a cache hit (``ppoflow.cache`` false).
        restored: :meth:`state` as a checkpoint saved it, or None.
    """

    def __init__(
        self,
        run: Any,
        next_input: Callable[[int], DataProto],
        refresh: bool = False,
        restored: dict[str, Any] | None = None,
    ) -> None:
        self.run, self.next_input, self.refresh = run, next_input, refresh
        self.pace = pace_of(run.cfg)
        self.lane = Lane()  # the tests' serial reference replaces the class: InlineLane
        self.replica = build_replica(run.cfg, run.tokenizer)
        self.weights: str | None = None  # lineage of the last sync queued (launches read it)
        self.version = 0  # the policy version of those weights
        self.pending: dict[int, Launch] = {}
        self.partial = partial_rollouts(run.cfg)
        self.response_length = run.cfg.actor_rollout_ref.rollout.response_length
        if restored is not None:
            root = restored.get("root", run.store.root)
            for state in restored["launches"]:
                self.pending[state["step"]] = self._restore(state, root)

    def take(self, step: int, last: int) -> Taken:
        """Steps 1–3 of the module docstring for step ``step`` of a run ending at ``last``."""
        begun = perf_counter()
        if step not in self.pending:  # a run's first step
            self._sync(step)
            self.pending[step] = self._launch(step)
        launch = self.pending.pop(step)
        outcome = launch.outcome.result()
        waited = perf_counter() - begun
        start = perf_counter()
        if self.pace.syncs_at(step):
            self._sync(step)
        self._resume_partials(step)
        synced = perf_counter() - start
        for ahead in range(step + 1, min(step + self.pace.depth, last) + 1):
            if ahead not in self.pending:
                self.pending[ahead] = self._launch(ahead)
        metrics = {WAIT_METRIC: waited, SYNC_METRIC: synced, STEP_METRIC: perf_counter() - begun}
        return Taken(launch.batch, launch.input_ref, {ROLLOUT_STAGE.name: outcome}, metrics)

    def validation_engines(self, step: int) -> dict[str, Any]:
        """The run's engines with the replica as ``actor``, holding the actor's weights after
        step ``step`` (after the launched rollouts, which keep the weights they were launched
        with): validation generates on the replica, the trainer's engine generates nothing."""
        self._wait()
        self._sync(step + 1)
        return {**self.run.engines, "actor": self.replica}

    def state(self) -> dict[str, Any]:
        """The launched rollouts as a checkpoint records them (waits for the jobs queued): each
        one's step, input artifact and stage record — or, for a partial rollout with segments
        still to come, the segments done (their columns stored as ``step_<j>/rollout_partial``),
        in step order."""
        self._wait()
        return {
            "pace": [self.pace.depth, self.pace.sync_every],
            "launches": [self._launch_state(self.pending[step]) for step in sorted(self.pending)],
        }

    def _launch_state(self, launch: Launch) -> dict[str, Any]:
        root = self.run.store.root
        state = {"step": launch.step, "input": _ref_state(launch.input_ref, root)}
        if launch.outcome is not None:
            return {**state, "record": launch.outcome.result().record.to_json(root)}
        columns, segments = launch.partial.state()
        path = self.run.store.artifact_path(launch.step, PARTIAL_ARTIFACT)
        ref = save_artifact(columns, path, stage=PARTIAL_ARTIFACT, overwrite=True)
        return {**state, "partial": {"columns": _ref_state(ref, root), "segments": segments}}

    def close(self) -> None:
        """Stop the replica; rollouts still running are abandoned (its process is killed)."""
        if not self.lane.idle():
            self.replica.kill()
        self.pending.clear()
        self.replica.close()

    # --- the steps -----------------------------------------------------------------------------

    def _wait(self) -> None:
        """Until every job on the lane ran (the launched rollouts and the syncs between)."""
        self.lane.submit(lambda: None).result()
        for launch in self.pending.values():
            for job in launch.segments:
                job.result()
            if launch.outcome is not None:
                launch.outcome.result()

    def _sync(self, step: int) -> None:
        """Queue the sync with the actor's weights now, θ_{step−1} (nothing when the replica
        holds them or will): at once when the lane is idle, else with a copy of them."""
        weights = self.run.lineage.current["actor"]
        if weights == self.weights:
            return
        full = self.run.engines["actor"].call_all("full_weights")[0]  # rank 0's
        if self.lane.idle():
            self.replica.sync(full.items())
        else:  # the rollouts queued before it read the older weights: sync a copy, in turn
            copy = {name: tensor.clone() for name, tensor in full.items()}
            self.lane.submit(self.replica.sync, copy.items())
        self.weights, self.version = weights, step - 1

    def _launch(self, step: int) -> Launch:
        """Store step ``step``'s input and queue its rollout: the whole of it, or with partial
        rollouts and syncs to fall while it is in flight, its first segment."""
        cfg = self.run.cfg
        batch = with_policy_version(self.next_input(step), self.version)
        input_ref = self.run.store.save_input(step, batch, artifact_digest(cfg))
        cuts = partial_cuts(step, self.pace, self.response_length) if self.partial else ()
        if not cuts:
            return Launch(step, batch, input_ref, self._rollout_stage(step, batch, input_ref))
        launch = Launch(step, batch, input_ref, None, self._partial(step, batch, cuts))
        self._queue_segment(launch)
        return launch

    def _rollout_stage(
        self,
        step: int,
        batch: DataProto,
        input_ref: ArtifactRef,
        partial: PartialRollout | None = None,
    ) -> Future:
        """The rollout stage of step ``step`` queued on the lane, on the replica, or for a partial
        rollout on its :class:`FinishingEngine` keyed by every segment's weights."""
        actor = self.replica if partial is None else FinishingEngine(partial, self.replica)
        ctx = StageContext(
            config=self.run.cfg, engines={**self.run.engines, "actor": actor}, step=step, metrics={}
        )
        return self.lane.submit(
            run_stage,
            ROLLOUT_STAGE,
            batch,
            ctx,
            self.run.store,
            step,
            fingerprints=artifact_key_fingerprints(input_ref.fingerprint, batch_keys(batch)),
            weights_fingerprint=self.weights if partial is None else partial.weights_key(),
            refresh=self.refresh,
            retries=1,
        )

    def _partial(
        self, step: int, batch: DataProto, cuts: tuple[tuple[int, int], ...]
    ) -> PartialRollout:
        """Step ``step``'s rollout in segments ending at the ``cuts``' columns, seeded as the
        rollout stage seeds it."""
        from stages.engines.roles import sampling_settings

        settings = sampling_settings(self.run.cfg, self.run.tokenizer, validate=False)
        ctx = StageContext(config=self.run.cfg, engines={}, step=step, metrics={})
        return PartialRollout(
            generation_prompts(batch),
            sampling_seed(ctx, batch),
            tuple(column for _, column in cuts),
            settings.stop_ids,
            settings.pad_token_id,
        )

    def _queue_segment(self, launch: Launch) -> None:
        """Queue the next segment of ``launch``'s partial rollout on the replica's weights of now
        (the last sync queued): an earlier one as a lane job, the last as the rollout stage."""
        partial = launch.partial
        index = partial.plan(self.version, self.weights)
        if index < len(partial.ends):
            launch.segments.append(self.lane.submit(partial.generate, self.replica, index))
        else:
            launch.outcome = self._rollout_stage(
                launch.step, launch.batch, launch.input_ref, partial
            )

    def _resume_partials(self, step: int) -> None:
        """After step ``step``'s sync: the next segment of each partial rollout it interrupts, in
        step order."""
        for ahead in sorted(self.pending):
            launch = self.pending[ahead]
            if step in launch.cuts(self.pace, self.response_length):
                self._queue_segment(launch)

    def _restore(self, state: dict[str, Any], root: str) -> Launch:
        """A launched rollout a checkpoint of the run in ``root`` recorded: its input loaded and
        checked against the recorded fingerprint, its delta loaded through ``reuse_stage``
        (verified, derived keys rebuilt) — or a partial rollout's segments done, loaded and
        checked the same way."""
        step = state["step"]
        batch, input_ref = _load_recorded(state["input"], root, f"step {step}'s input")
        if "partial" in state:
            columns, _ = _load_recorded(
                state["partial"]["columns"], root, f"step {step}'s partial rollout"
            )
            cuts = partial_cuts(step, self.pace, self.response_length)
            partial = self._partial(step, batch, cuts)
            partial.restore(columns, state["partial"]["segments"])
            return Launch(step, batch, input_ref, None, partial)
        record = StageRecord.from_json(state["record"], root)
        fingerprints = artifact_key_fingerprints(input_ref.fingerprint, batch_keys(batch))
        outcome = reuse_stage(ROLLOUT_STAGE, record, RESTORED_ORIGIN, "full", batch, fingerprints)
        return Launch(step, batch, input_ref, done(outcome))


def _ref_state(ref: ArtifactRef, root: str) -> dict[str, str]:
    return {"path": relative_to_root(ref.path, root), "fingerprint": ref.fingerprint}


def _load_recorded(state: dict[str, str], root: str, what: str) -> tuple[DataProto, ArtifactRef]:
    """The artifact a checkpoint recorded (:func:`_ref_state`), checked against its recorded
    fingerprint and verified in full."""
    path = resolve_in_root(state["path"], root)
    manifest = read_manifest(path)
    if manifest["fingerprint"] != state["fingerprint"]:
        raise ValueError(
            f"{path}: holds fingerprint {manifest['fingerprint'][:16]}…, but the checkpoint "
            f"recorded {state['fingerprint'][:16]}… for {what} (the run directory was changed "
            "after the checkpoint)"
        )
    batch = load_artifact(path, verify="full")
    return batch, ArtifactRef(path, manifest["fingerprint"], len(batch), 0)


def restored_for(
    cfg: Any, restored: dict[str, Any] | None, root: str
) -> tuple[dict[str, Any] | None, dict[int, DataProto], int]:
    """What a resumed run under ``cfg`` does with the rollouts its checkpoint launched ahead
    (``restored``, :meth:`RolloutAhead.state`, written by the run in directory ``root``):
    ``(launches to restore, with their run's directory as "root"; inputs to generate again by
    step; rows dropped)``.

    Resumed with the schedule and pace that launched them (a checkpoint written before the pace
    was recorded counts as that), they are restored: the resumed run trains on them as the
    uninterrupted run does. Resumed on policy or at another pace (another ``ppoflow.schedule``,
    ``staleness_threshold`` or ``trigger_parameter_sync_step``), they are dropped as stale —
    generated by weights that schedule would not have used for them, with syncs it would not
    make — and counted (``fully_async/count/dropped_stale_samples``, rows); their inputs (the
    prompts and uids as launched, ``step_<j>/input``) are generated again at their steps
    (flows/gen_rounds.py ``next_step_input``), so no prompt is lost or repeated."""
    if not restored or not restored["launches"]:
        return restored, {}, 0
    recorded = restored.get("pace")
    if POLICY_SCHEDULES.get(cfg.ppoflow.schedule).rollout_apart:
        pace = pace_of(cfg)
        if recorded is None or tuple(recorded) == (pace.depth, pace.sync_every):
            return {**restored, "root": root}, {}, 0
    requeued = {
        state["step"]: _load_recorded(state["input"], root, f"the input of step {state['step']}")[0]
        for state in restored["launches"]
    }
    return None, requeued, sum(len(batch) for batch in requeued.values())


def open_rollout_ahead(run: Any, startup: Any) -> RolloutAhead | None:
    """The run's :class:`RolloutAhead` when its schedule's rollout runs apart
    (``stages.schedules``), else None: built in the start-up phase ``replica`` (its processes
    start while the libraries' output still goes to the run's log), after the resume, whose
    checkpoint may hold launched rollouts (``run.restored_ahead``)."""
    cfg = run.cfg
    if not POLICY_SCHEDULES.get(cfg.ppoflow.schedule).rollout_apart:
        return None
    backend, pace = cfg.actor_rollout_ref.rollout.name, pace_of(cfg)
    with startup.phase("replica", f"starting the {backend} rollout replica") as shown:
        ahead = RolloutAhead(
            run,
            functools.partial(next_step_input, run),
            refresh=not cfg.ppoflow.cache,
            restored=run.restored_ahead,
        )
        shown["text"] = (
            f"{cfg.ppoflow.schedule}: {backend} rollout on a copy of the policy, "
            f"{pace.depth} batch{'es' * (pace.depth > 1)} ahead, synced every "
            f"{'step' if pace.sync_every == 1 else f'{pace.sync_every} steps'}"
        )
    return ahead
