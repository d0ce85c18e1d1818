"""The PPO step as a Prefect flow: the planned stages in order, each a cached stage task.

``run_step`` reads like the stage table: plan and check the DAG (before any work), store the
step's input batch, then for every enabled stage run (or reuse) it, merge its delta into the step
batch with the non-mutating ``|``, and keep its fingerprints, metrics and journal record.

A stage that reorders rows (``Stage.reorders``, the balance stage) produces a (B,) permutation;
after merging it the flow reorders the whole step batch by it (:func:`apply_reorder`: row i
becomes row ``perm[i]``), drops the permutation key from the batch, and derives every key's new
fingerprint from the permutation's (``flows.cache.keys.reordered_fingerprints``). Deltas of the
later stages are therefore in the balanced order, as in verl, where the batch is reordered in
place.

Flow parameters here are live objects (a batch of tensors, engines, a run store). Prefect would
normally JSON-encode every parameter for the flow-run record, deep-copying dataclasses on the way
(a whole batch, even a model); :class:`StepFlow` records a one-line summary of each instead
(:func:`describe_parameter`), which is what the Prefect UI shows as the run's parameters.

The training and re-run flows call ``run_step.fn(...)``: the step runs inside their flow run,
its stage task runs (``<stage>-step<k>``) sit directly under it, and no flow run is made per
step. A subflow run per step (``run_step(...)`` inside a flow run, a child run ``step-<k>``)
would group the tasks in the UI, but costs 7 blocking API calls and, unless heartbeats are off,
the join of its heartbeat thread (up to 1 s): at the demo size that is far over the 3 % of a step
the project allows for orchestration (``bench/prefect_subflow.py``, figures in bench/README.md
and docs/deployment.md, "See the run"). ``run_step`` stays a flow, so a step can also run as a
flow run of its own (``run_step(...)`` at the top level, as the tests do).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from time import perf_counter
from typing import Any

import torch
from prefect import Flow

from dataproto.artifact import ArtifactRef, Verify
from dataproto.protocol import DataProto
from flows.cache.keys import artifact_key_fingerprints, reordered_fingerprints
from flows.dag import StepPlan, batch_keys, plan_step
from flows.runs.artifact_writer import writing_in_background
from flows.runs.store import RunStore, StageRecord, StepJournal
from flows.stage_task import (
    StageOutcome,
    artifact_digest,
    reuse_stage,
    run_stage,
    timer_name,
    writes_in_background,
)
from stages.config import PPORunConfig
from stages.stage import KeyRef, Stage, StageContext, tensor

WeightsFingerprints = Mapping[str, str] | Callable[[Stage], str] | None


@dataclass
class StepResult:
    """The step's final batch, its metrics (stage metrics + ``timing_s/*``) and stage records;
    ``journal`` is the step's journal as last written (a caller that adds to it rewrites it
    without reading it back)."""

    batch: DataProto
    metrics: dict[str, float]
    records: list[StageRecord]
    journal: StepJournal | None = None


def describe_config(cfg: PPORunConfig) -> str:
    """A one-line summary of a resolved run config (a flow parameter given as an object).

    >>> describe_config(PPORunConfig())
    'PPORunConfig(experiment=default, estimator=gae, steps=from epochs, model=~/models/deepseek-llm-7b-chat)'
    """
    steps = cfg.trainer.total_training_steps
    return (
        f"PPORunConfig(experiment={cfg.trainer.experiment_name}, "
        f"estimator={cfg.algorithm.adv_estimator}, "
        f"steps={'from epochs' if steps is None else steps}, "
        f"model={cfg.actor_rollout_ref.model.path})"
    )


def describe_parameter(value: Any) -> Any:
    """A short JSON-ready summary of a flow parameter (what the Prefect UI shows).

    JSON scalars, lists of them and string-valued mappings are kept as they are (a config
    name, ``overrides``, ``run_dir``); a run config, a batch, a stage context, a stage list and
    a run store become one-line summaries; a callable its qualified name; anything else
    ``<TypeName>``.

    >>> describe_parameter(["trainer.total_training_steps=2", "data.train_batch_size=4"])
    ['trainer.total_training_steps=2', 'data.train_batch_size=4']
    >>> describe_parameter(len), describe_parameter(object())
    ('<len>', '<object>')
    """
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, PPORunConfig):
        return describe_config(value)
    if isinstance(value, DataProto):
        return f"DataProto(rows={len(value)}, keys={sorted(map(str, batch_keys(value)))})"
    if isinstance(value, StageContext):
        return f"StageContext(step={value.step}, engines={sorted(value.engines)})"
    if isinstance(value, list | tuple) and value and all(isinstance(v, Stage) for v in value):
        return [item.name for item in value]
    if isinstance(value, list | tuple) and all(_is_json_scalar(item) for item in value):
        return list(value)
    if isinstance(value, RunStore):
        return repr(value)
    if isinstance(value, Mapping) and all(isinstance(item, str) for item in value.values()):
        return dict(value)
    if callable(value) and hasattr(value, "__qualname__"):
        return f"<{value.__qualname__}>"
    return f"<{type(value).__name__}>"


def describe_source(config: Any, overrides: Sequence[str] | None = ()) -> str:
    """Where a run's config comes from, for the run's first log line: the config parameter
    (:func:`describe_parameter`) and the number of overrides.

    >>> describe_source("demo-cpu", ["trainer.total_training_steps=2"])
    'demo-cpu + 1 override'
    >>> describe_source("configs/grpo.yaml", ())
    'configs/grpo.yaml'
    """
    count = len(overrides or ())
    more = f" + {count} override" + "s" * (count > 1) if count else ""
    return f"{describe_parameter(config)}{more}"


def _is_json_scalar(value: Any) -> bool:
    return value is None or isinstance(value, bool | int | float | str)


class StepFlow(Flow):
    """A Flow that records parameter summaries (:func:`describe_parameter`) instead of
    JSON-encoding live objects."""

    def serialize_parameters(self, parameters: dict[str, Any]) -> dict[str, Any]:
        return {name: describe_parameter(value) for name, value in parameters.items()}

    def with_options(self, **options: Any) -> StepFlow:
        new_flow = super().with_options(**options)
        new_flow.__class__ = StepFlow
        return new_flow


def weights_for(stage: Stage, weights: WeightsFingerprints) -> str | None:
    """The weights fingerprint a stage's cache key needs (None for a stage reading no weights)."""
    if not stage.reads_weights:
        return None
    if weights is None:
        raise ValueError(
            f"stage {stage.name!r} reads weights: pass weights_fingerprints (a mapping stage "
            "name → fingerprint, or a callable stage → fingerprint)"
        )
    if callable(weights):
        return weights(stage)
    if stage.name not in weights:
        raise KeyError(
            f"weights_fingerprints has no entry for weight-reading stage {stage.name!r} "
            f"(it has {sorted(weights)})"
        )
    return weights[stage.name]


def _check_weights(plan: StepPlan, weights: WeightsFingerprints) -> None:
    """Fail before any work when a weight-reading stage will lack its fingerprint."""
    if callable(weights):
        return
    for stage in plan.stages:
        if stage.reads_weights:
            weights_for(stage, weights)


def apply_reorder(
    stage: Stage, batch: DataProto, fingerprints: dict[KeyRef, str]
) -> tuple[DataProto, dict[KeyRef, str]]:
    """The step batch reordered by ``stage``'s permutation key (dropped), and the new fingerprints.

    Raises:
        ValueError: the key does not hold a permutation of 0…B−1.
    """
    name = stage.reorders
    perm = batch.batch[name]
    rows = len(batch)
    if perm.shape != (rows,) or not bool((perm.sort().values.cpu() == torch.arange(rows)).all()):
        raise ValueError(
            f"stage {stage.name!r}: {name!r} must be a permutation of 0…{rows - 1} with shape "
            f"({rows},), got shape {tuple(perm.shape)} values {perm.tolist()[:16]}"
        )
    rest = DataProto(
        batch=batch.batch.exclude(name),
        non_tensor_batch=dict(batch.non_tensor_batch),
        meta_info=dict(batch.meta_info),
    )
    permutation_fingerprint = fingerprints.pop(tensor(name))
    return rest.select_idxs(perm), reordered_fingerprints(fingerprints, permutation_fingerprint)


#: the record reason of a weight-writing stage computed on every training step
WEIGHT_WRITER_REASON = "writes weights: runs on every training step, never from the cache"


def _refresh_reason(stage: Stage, refresh: Collection[str], run_weight_writers: bool) -> str:
    if stage.name not in refresh and run_weight_writers and stage.writes_weights:
        return WEIGHT_WRITER_REASON
    return "cache refreshed"


def _records_by_stage(journal: StepJournal | None) -> dict[str, StageRecord]:
    if journal is None:
        return {}
    return {record.stage: record for record in journal.stages if record.status != "skipped"}


def _ordered(stages: Sequence[Stage], records: dict[str, StageRecord]) -> list[StageRecord]:
    return [records[stage.name] for stage in stages if stage.name in records]


def _run_step(
    stages: Sequence[Stage],
    batch: DataProto,
    ctx: StageContext,
    store: RunStore,
    step: int,
    weights_fingerprints: WeightsFingerprints = None,
    refresh: Collection[str] = (),
    retries: int = 0,
    verify: Verify = "full",
    reuse: Mapping[str, StageRecord] | None = None,
    reuse_origin: str = "another run",
    run_weight_writers: bool = False,
    previous: StepJournal | None = None,
    saved_input: ArtifactRef | None = None,
    ahead: Mapping[str, StageOutcome] | None = None,
) -> StepResult:
    """Run one PPO step: every enabled stage in order, cached, its delta merged into the batch.

    Args:
        stages: all stages of the step in run order; disabled ones are recorded as skipped.
        batch: the step's input batch (prompts); it is stored as ``step_<k>/input``.
        ctx: config and engines; ``ctx.metrics`` seeds the step's metrics.
        store: the run directory; ``step``: the global step (1-based).
        weights_fingerprints: for weight-reading stages, stage name → fingerprint (or a callable).
        refresh: stage names to recompute even on a cache hit (``rerun --from``).
        retries: Prefect retries for stages that write no weights.
        verify: how cached artifacts are checked (flows/stage_task.py: run_stage).
        reuse: stage name → a record from another run's journal of this step; those stages are
            not run, their artifacts are loaded (``reuse_stage``) — a re-run's upstream stages.
        reuse_origin: names that run in the reused records' reasons.
        run_weight_writers: compute every weight-writing stage even on a cache hit (training:
            a cached update would skip the optimizer step, so the weights would not be the
            ones the journal claims). A re-run branch, whose weights end with the step, may
            take them from the cache.
        previous: an earlier journal of this step (a re-run's parent); a stage that misses
            names what changed since its record there. Default: the journal an earlier
            training into ``store`` left for this step, if any.
        saved_input: ``batch`` as already stored as ``step_<k>/input`` (a step whose rollout
            was launched ahead, flows/rollout_ahead.py); None: it is stored here.
        ahead: stage name → the outcome of that stage of this step, run before the step (on
            ``saved_input``'s key fingerprints): merged as it is, not run again.
    """
    reuse, ahead = reuse or {}, ahead or {}
    start = perf_counter()
    plan = plan_step(stages, ctx.config, batch_keys(batch), step=step)
    _check_weights(plan, weights_fingerprints)
    earlier = _records_by_stage(previous or store.previous_journal(step))
    input_ref = saved_input or store.save_input(step, batch, artifact_digest(ctx.config))
    fingerprints = artifact_key_fingerprints(input_ref.fingerprint, batch_keys(batch))
    journal = StepJournal(
        step, input_artifact=input_ref.path, input_fingerprint=input_ref.fingerprint
    )
    records = {name: StageRecord(name, "skipped", reason) for name, reason in plan.skipped.items()}
    metrics = dict(ctx.metrics)
    with writing_in_background(writes_in_background(ctx.config)):  # flows/runs/artifact_writer.py
        for stage in plan.stages:
            if stage.name in ahead:
                outcome = ahead[stage.name]
            elif stage.name in reuse:
                outcome = reuse_stage(
                    stage, reuse[stage.name], reuse_origin, verify, batch, fingerprints
                )
            else:
                outcome = run_stage(
                    stage,
                    batch,
                    replace(ctx, metrics=metrics),
                    store,
                    step,
                    fingerprints=fingerprints,
                    weights_fingerprint=weights_for(stage, weights_fingerprints),
                    refresh=stage.name in refresh or (run_weight_writers and stage.writes_weights),
                    refresh_reason=_refresh_reason(stage, refresh, run_weight_writers),
                    retries=0 if stage.writes_weights else retries,
                    verify=verify,
                    previous=earlier.get(stage.name),
                )
            batch = batch | outcome.delta
            fingerprints.update(outcome.fingerprints)
            if stage.reorders is not None:
                batch, fingerprints = apply_reorder(stage, batch, fingerprints)
            metrics.update(outcome.record.metrics)
            metrics[f"timing_s/{timer_name(stage.name)}"] = outcome.record.timing_s
            records[stage.name] = outcome.record
            journal.stages = _ordered(stages, records)
            store.write_journal(journal)
    metrics["timing_s/step"] = perf_counter() - start
    journal.status, journal.metrics, journal.stages = "done", metrics, _ordered(stages, records)
    store.write_journal(journal)
    return StepResult(batch=batch, metrics=metrics, records=journal.stages, journal=journal)


run_step = StepFlow(
    fn=_run_step,
    name="ppo-step",
    flow_run_name="step-{step}",
    validate_parameters=False,
    persist_result=False,
)
