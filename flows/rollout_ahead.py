"""One step off: the rollout of step k + 1 runs on the replica while step k trains.

The schedule of ``ppoflow.schedule = one_step_off`` (``stages.schedules``; verl's
``one_step_off_policy``), in step k of the training loop (:meth:`RolloutAhead.take`):

1. take batch k: the rollout launched in step k − 1 (waited for, ``timing_s/rollout_wait``),
   or, in a run's first step, launched now and waited for;
2. sync the replica with the actor's weights θ_{k−1} (``timing_s/param_sync``; skipped when it
   holds them already);
3. launch batch k + 1 (when there is a step k + 1): draw its prompts, store its input
   (``step_<k+1>/input``) and run its rollout stage on a thread, with the replica as the stage's
   ``actor`` engine — ``flows.stage_task.run_stage`` as in any step, so its artifact, record and
   cache key (whose weights fingerprint is the lineage of the weights synced) are a stage's;
4. the caller trains step k on batch k (``run_step`` merges the rollout's outcome, ``ahead``).

So batches 1 and 2 come from θ_0 and batch k ≥ 2 from θ_{k−2}: every sample's ``policy_version``
column says which (``stages.schedules.policy_version``). The schedule is fixed by the step
count, not by timing: a run in which every launch is waited for at once computes the same
batches, so the overlap changes no weight.

**Checkpoints.** A checkpoint after step k waits for the rollout of step k + 1 and records it
(:meth:`RolloutAhead.state`: its input artifact and its stage record); the loader position it
saves is already past batch k + 1. :meth:`RolloutAhead.restore` takes that record back, so the
resumed run trains step k + 1 on the very batch the interrupted run generated (loaded and
verified, not generated again) and neither drops nor repeats a prompt.
"""

from __future__ import annotations

import contextvars
import functools
import threading
from collections.abc import Callable, Collection
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
from stages.ppo import PPO_STAGES
from stages.rollout import ROLLOUT_STAGE
from stages.schedules import POLICY_SCHEDULES
from stages.stage import StageContext

#: the record reason of a rollout restored from a checkpoint
RESTORED_ORIGIN = "the rollout launched before the checkpoint (one step off)"
#: step metrics of the schedule (catalog: stages/metrics/catalog.py)
WAIT_METRIC, SYNC_METRIC = "timing_s/rollout_wait", "timing_s/param_sync"
#: the part of the step's wall time spent here (train_step adds it to the stages' timing_s/step)
STEP_METRIC = "timing_s/step"


def in_thread(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Future:
    """``fn(*args, **kwargs)`` on a daemon thread, in a copy of this thread's context (so the
    Prefect flow run is its parent); its result or exception in the returned future."""
    future: Future = Future()
    context = contextvars.copy_context()

    def body() -> None:
        if not future.set_running_or_notify_cancel():
            return
        try:
            future.set_result(context.run(fn, *args, **kwargs))
        except BaseException as err:
            future.set_exception(err)

    threading.Thread(target=body, name="ppoflow-rollout-ahead", daemon=True).start()
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
    """The one-step-off schedule of a training run (module docstring).

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
        refresh: Collection[str] = (),
        restored: dict[str, Any] | None = None,
    ) -> None:
        self.run, self.next_input, self.refresh = run, next_input, refresh
        self.replica = build_replica(run.cfg, run.tokenizer)
        self.replica_weights: str | None = None  # the lineage fingerprint of what it holds
        self.pending: Launch | None = None
        self.restored = restored

    def take(self, step: int, last: int) -> Taken:
        """Steps 1–3 of the module docstring for step ``step`` of a run ending at ``last``."""
        begun = start = perf_counter()
        ahead, batch, input_ref = self._batch_of(step)
        waited = perf_counter() - start
        start = perf_counter()
        self._sync()
        synced = perf_counter() - start
        self.pending = self._launch(step + 1) if step < last else None
        metrics = {WAIT_METRIC: waited, SYNC_METRIC: synced, STEP_METRIC: perf_counter() - begun}
        return Taken(batch, input_ref, {ROLLOUT_STAGE.name: ahead}, metrics)

    def validation_engines(self) -> dict[str, Any]:
        """The run's engines with the replica as ``actor``, synced with the actor's weights now
        (after waiting for the launched rollout, which keeps the weights it was launched with):
        validation generates on the replica, the trainer's engine generates nothing."""
        if self.pending is not None:
            self.pending.outcome.result()
        self._sync()
        return {**self.run.engines, "actor": self.replica}

    def state(self) -> dict[str, Any] | None:
        """The launched rollout as a checkpoint records it (waits for it): the step, its input
        artifact and the rollout's stage record; None when nothing is launched."""
        if self.pending is None:
            return None
        outcome: StageOutcome = self.pending.outcome.result()
        root, ref = self.run.store.root, self.pending.input_ref
        return {
            "step": self.pending.step,
            "input": {"path": relative_to_root(ref.path, root), "fingerprint": ref.fingerprint},
            "record": outcome.record.to_json(root),
        }

    def close(self) -> None:
        """Stop the replica; a rollout still running is abandoned (its process is killed)."""
        pending, self.pending = self.pending, None
        if pending is not None and not pending.outcome.done():
            self.replica.kill()
        self.replica.close()

    # --- the steps -----------------------------------------------------------------------------

    def _batch_of(self, step: int) -> tuple[StageOutcome, DataProto, ArtifactRef]:
        if self.restored is not None and self.restored["step"] == step:
            restored, self.restored = self.restored, None
            return self._restore(restored)
        if self.pending is None or self.pending.step != step:
            self._sync()
            self.pending = self._launch(step)
        launch, self.pending = self.pending, None
        return launch.outcome.result(), launch.batch, launch.input_ref

    def _sync(self) -> None:
        weights = self.run.lineage.current["actor"]
        if weights != self.replica_weights:
            full = self.run.engines["actor"].call_all("full_weights")[0]  # rank 0's
            self.replica.sync(full.items())
            self.replica_weights = weights

    def _launch(self, step: int) -> Launch:
        store, cfg = self.run.store, self.run.cfg
        batch = self.next_input(step)
        input_ref = store.save_input(step, batch, artifact_digest(cfg))
        ctx = StageContext(
            config=cfg, engines={**self.run.engines, "actor": self.replica}, step=step, metrics={}
        )
        outcome = in_thread(
            run_stage,
            ROLLOUT_STAGE,
            batch,
            ctx,
            store,
            step,
            fingerprints=artifact_key_fingerprints(input_ref.fingerprint, batch_keys(batch)),
            weights_fingerprint=self.replica_weights,
            refresh=ROLLOUT_STAGE.name in self.refresh,
            retries=1,
        )
        return Launch(step, batch, input_ref, outcome)

    def _restore(self, state: dict[str, Any]) -> tuple[StageOutcome, DataProto, ArtifactRef]:
        """The checkpoint's launched rollout: its input loaded and checked against the recorded
        fingerprint, its delta loaded through ``reuse_stage`` (verified, derived keys rebuilt)."""
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
        return outcome, batch, input_ref


def open_rollout_ahead(run: Any, startup: Any) -> RolloutAhead | None:
    """The run's :class:`RolloutAhead` when its schedule's rollout runs apart
    (``stages.schedules``), else None: built in the start-up phase ``replica`` (its processes
    start while the libraries' output still goes to the run's log), after the resume, whose
    checkpoint may hold a launched rollout (``run.restored_ahead``)."""
    cfg = run.cfg
    if not POLICY_SCHEDULES.get(cfg.ppoflow.schedule).rollout_apart:
        return None
    backend = cfg.actor_rollout_ref.rollout.name
    with startup.phase("replica", f"starting the {backend} rollout replica") as shown:
        ahead = RolloutAhead(
            run,
            functools.partial(next_step_input, run),
            refresh=() if cfg.ppoflow.cache else [stage.name for stage in PPO_STAGES],
            restored=run.restored_ahead,
        )
        shown["text"] = f"{cfg.ppoflow.schedule}: {backend} rollout on a copy of the policy"
    return ahead
