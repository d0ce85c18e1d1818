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
from dataclasses import dataclass
from time import perf_counter
from typing import Any

from dataproto import DataProto
from dataproto.artifact import ArtifactRef, load_artifact, read_manifest
from flows.cache.keys import artifact_key_fingerprints
from flows.dag import batch_keys
from flows.gen_rounds import next_step_input
from flows.runs.store import StageRecord, relative_to_root, resolve_in_root
from flows.stage_task import StageOutcome, artifact_digest, reuse_stage, run_stage
from stages.engines.rollout_replica import build_replica
from stages.rollout import ROLLOUT_STAGE
from stages.schedules import POLICY_SCHEDULES, pace_of, with_policy_version
from stages.stage import StageContext

#: the record reason of a rollout restored from a checkpoint
RESTORED_ORIGIN = "the rollout launched before the checkpoint"
#: step metrics of the schedule (catalog: stages/metrics/catalog.py)
WAIT_METRIC, SYNC_METRIC = "timing_s/rollout_wait", "timing_s/param_sync"
#: the part of the step's wall time spent here (train_step adds it to the stages' timing_s/step)
STEP_METRIC = "timing_s/step"


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
    """A step's rollout launched ahead: the step input as stored, and the rollout's outcome."""

    step: int
    batch: DataProto
    input_ref: ArtifactRef
    outcome: Future


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
        if restored is not None:
            for state in restored["launches"]:
                self.pending[state["step"]] = self._restore(state)

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
        """The launched rollouts as a checkpoint records them (waits for them): each one's step,
        input artifact and stage record, in step order."""
        self._wait()
        root = self.run.store.root
        return {
            "launches": [
                {
                    "step": launch.step,
                    "input": {
                        "path": relative_to_root(launch.input_ref.path, root),
                        "fingerprint": launch.input_ref.fingerprint,
                    },
                    "record": launch.outcome.result().record.to_json(root),
                }
                for launch in sorted(self.pending.values(), key=lambda launch: launch.step)
            ]
        }

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
        store, cfg = self.run.store, self.run.cfg
        batch = with_policy_version(self.next_input(step), self.version)
        input_ref = store.save_input(step, batch, artifact_digest(cfg))
        ctx = StageContext(
            config=cfg, engines={**self.run.engines, "actor": self.replica}, step=step, metrics={}
        )
        outcome = self.lane.submit(
            run_stage,
            ROLLOUT_STAGE,
            batch,
            ctx,
            store,
            step,
            fingerprints=artifact_key_fingerprints(input_ref.fingerprint, batch_keys(batch)),
            weights_fingerprint=self.weights,
            refresh=self.refresh,
            retries=1,
        )
        return Launch(step, batch, input_ref, outcome)

    def _restore(self, state: dict[str, Any]) -> Launch:
        """A launched rollout a checkpoint recorded: its input loaded and checked against the
        recorded fingerprint, its delta loaded through ``reuse_stage`` (verified, derived keys
        rebuilt)."""
        store = self.run.store
        path = resolve_in_root(state["input"]["path"], store.root)
        manifest = read_manifest(path)
        if manifest["fingerprint"] != state["input"]["fingerprint"]:
            raise ValueError(
                f"{path}: holds fingerprint {manifest['fingerprint'][:16]}…, but the checkpoint "
                f"recorded {state['input']['fingerprint'][:16]}… for step {state['step']}'s input "
                "(the run directory was changed after the checkpoint)"
            )
        batch = load_artifact(path, verify="full")
        input_ref = ArtifactRef(path, manifest["fingerprint"], len(batch), 0)
        record = StageRecord.from_json(state["record"], store.root)
        fingerprints = artifact_key_fingerprints(input_ref.fingerprint, batch_keys(batch))
        outcome = reuse_stage(ROLLOUT_STAGE, record, RESTORED_ORIGIN, "full", batch, fingerprints)
        return Launch(state["step"], batch, input_ref, done(outcome))


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
