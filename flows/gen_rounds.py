"""DAPO's dynamic sampling in the training flow: a step's training batch from generation rounds.

With ``algorithm.filter_groups.enable`` a step does not train on the prompts it generated for:

1. round r draws ``data.gen_batch_size`` prompts from the loader (its state counts every prompt
   drawn, so a resumed run draws the same rounds), repeats them ``rollout.n`` times with the
   round's own uids and sampling seed (``make_step_input(..., gen_round=r)``), and runs the
   generation stages (``GENERATION_STAGES``: rollout, its scoring, and ReMax's baseline) as a
   step of their own in ``step_<k>/round_<r>/`` (:class:`RoundStore`): its input artifact, one
   artifact per stage and a journal, cached like any stage, so every round can be inspected and
   re-run;
2. the round's groups whose ``filter_groups.metric`` has zero spread are dropped
   (``stages.algos.filter_groups.kept_group_mask``: population std 0, singletons kept);
3. rounds continue until ``data.train_batch_size`` groups are kept; the first
   ``train_batch_size`` kept groups, in the order they were generated, are the step's training
   batch (exactly ``train_batch_size × n`` samples). With ``max_num_gen_batches > 0`` a step that
   has run that many rounds without enough kept groups ends the run
   (:class:`RoundLimitError`, one line naming the key).

The training stages (``TRAINING_STAGES``) then run on that batch as the step itself
(``step_<k>/``); :func:`step_input_of` is what the training flow asks for a step's input, with
or without dynamic sampling. The rounds' stage metrics are merged into the step's (:func:`merge_round_metrics`)
and the filter's counts added (:func:`filter_metrics`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dataproto import DataProto
from dataproto import keys as K
from flows.runs.store import RunStore
from flows.step_flow import StepResult, run_step
from stages.algos.filter_groups import first_groups_mask, group_ids, kept_group_mask
from stages.filter_metrics import filter_values
from stages.ppo import GENERATION_STAGES, PPO_STAGES, TRAINING_STAGES, make_step_input
from stages.schedules import with_policy_version
from stages.stage import Stage, StageContext

EVICTED = "training/filter_groups/evicted_samples"
SURPLUS = "training/filter_groups/discarded_surplus_samples"
GENERATED = "training/filter_groups/generated_samples"


class RoundLimitError(RuntimeError):
    """A step ran ``algorithm.filter_groups.max_num_gen_batches`` rounds without enough groups."""


class RoundStore(RunStore):
    """The run directory as seen by generation round ``gen_round``: step k's folder is
    ``step_<k>/round_<r>/`` (its input, stage artifacts and journal); the cache is the run's."""

    def __init__(self, store: RunStore, gen_round: int) -> None:
        super().__init__(store.root, store.cache_dir, store.parents)
        self.gen_round = gen_round

    def step_dir(self, step: int) -> str:
        return f"{super().step_dir(step)}/round_{self.gen_round}"


@dataclass
class RoundsResult:
    """The training batch, the merged round metrics and each round's result."""

    batch: DataProto
    metrics: dict[str, float]
    rounds: list[StepResult] = field(default_factory=list)


def merge_round_metrics(rounds: Sequence[dict[str, float]]) -> dict[str, float]:
    """One value per metric over the rounds (all of one size): ``timing_s/*`` and ``*_count``
    summed, ``*/max`` the largest, ``*/min`` the smallest, any other the mean over rounds (the
    mean over all generated samples for a per-sample mean, each round having as many).

    >>> merge_round_metrics([{"timing_s/gen": 1.0, "reward/score_mean": 0.5},
    ...                      {"timing_s/gen": 2.0, "reward/score_mean": 0.0}])
    {'timing_s/gen': 3.0, 'reward/score_mean': 0.25}
    """
    merged: dict[str, float] = {}
    for name in dict.fromkeys(name for metrics in rounds for name in metrics):
        values = [metrics[name] for metrics in rounds if name in metrics]
        if name.startswith("timing_s/") or name.endswith("_count"):
            merged[name] = float(sum(values))
        elif name.endswith("/max"):
            merged[name] = float(max(values))
        elif name.endswith("/min"):
            merged[name] = float(min(values))
        else:
            merged[name] = float(np.mean(values))
    return merged


def filter_metrics(generated: int, evicted: int, surplus: int) -> dict[str, float]:
    """Samples generated over the step's rounds, those of filtered groups (verl 0.9.1's
    ``evicted_samples``) and those of kept groups trimmed off (``discarded_surplus_samples``).

    >>> filter_metrics(48, 20, 12)[SURPLUS]
    12.0
    """
    return {GENERATED: float(generated), EVICTED: float(evicted), SURPLUS: float(surplus)}


def next_step_input(run: Any, step: int, gen_round: int | None = None) -> DataProto:
    """The loader's next batch as a step's input (``make_step_input``: n samples per prompt, uids,
    the rollout temperature, the KL coefficient now), each row tagged with policy version
    ``step − 1``, the weights that generate it on policy (``stages.schedules``; a rollout launched
    ahead tags its own, flows/rollout_ahead.py); ``gen_round`` for a DAPO round's own uids and
    seed, None for a step without rounds.

    A step whose input a resume took back (``run.requeued``: the rollouts a checkpoint had
    launched ahead under another schedule, dropped as stale by
    :func:`flows.rollout_ahead.restored_for`) gets that input instead, its prompts and uids as
    launched, with this step's KL coefficient, so none of those prompts is lost."""
    cfg = run.cfg
    requeued = run.requeued.pop(step, None) if gen_round in (None, 1) else None
    if requeued is not None:
        meta_info = dict(requeued.meta_info)
        if run.kl_ctrl is not None:
            meta_info[K.KL_COEF] = float(run.kl_ctrl.value)
        again = DataProto(requeued.batch, dict(requeued.non_tensor_batch), meta_info)
        return with_policy_version(again, step - 1)
    rounds = {} if gen_round is None else {"gen_round": gen_round}
    step_input = make_step_input(
        run.loader.next_batch(),
        cfg.actor_rollout_ref.rollout.n,
        temperature=cfg.actor_rollout_ref.rollout.temperature,
        global_steps=step,
        kl_coef=None if run.kl_ctrl is None else run.kl_ctrl.value,
        uid_seed=cfg.trainer.seed,
        **rounds,
    )
    return with_policy_version(step_input, step - 1)


def _without_round(batch: DataProto) -> DataProto:
    """``batch`` without its ``gen_round`` meta key (the rounds' batches concatenate)."""
    meta_info = {k: v for k, v in batch.meta_info.items() if k != K.GEN_ROUND}
    return DataProto(batch.batch, dict(batch.non_tensor_batch), meta_info)


def _run_round(run: Any, step: int, gen_round: int, options: dict[str, Any]) -> StepResult:
    """Generation round ``gen_round`` of step ``step``: draw the prompts, run the generation
    stages into ``step_<k>/round_<r>/`` (module docstring, 1)."""
    round_input = next_step_input(run, step, gen_round)
    store = RoundStore(run.store, gen_round)
    weights = run.lineage.state_dict()  # the step's start: what a re-run of the round needs
    result = run_step.fn(  # a plain call, as the step's (flows/step_flow.py)
        GENERATION_STAGES,
        round_input,
        StageContext(config=run.cfg, engines=run.engines, step=step),
        store,
        step,
        **options,
    )
    result.journal.weights = weights
    store.write_journal(result.journal)
    return result


def generate_rounds(run: Any, step: int, options: dict[str, Any]) -> RoundsResult:
    """The step's training batch from as many generation rounds as it takes (module docstring).

    Args:
        run: the training run (``flows.train.TrainRun``: config, loader, engines, store).
        options: keyword arguments of ``run_step`` (weights fingerprints, refresh, retries…).

    Raises:
        RoundLimitError: ``max_num_gen_batches`` rounds ran without enough kept groups.
        FilterMetricError: the filter metric is neither registered nor a reward extra.
    """
    cfg = run.cfg
    fg = cfg.algorithm.filter_groups
    target = cfg.data.train_batch_size
    rounds, kept, kept_groups, evicted = [], [], 0, 0
    while kept_groups < target:
        result = _run_round(run, step, len(rounds) + 1, options)  # a global: a kill point
        rounds.append(result)
        uid = result.batch.non_tensor_batch[K.UID]
        keep = kept_group_mask(uid, filter_values(result.batch, fg.metric))  # (B,)
        evicted += int((~keep).sum())
        if keep.any():
            kept.append(_without_round(result.batch).select_idxs(keep))
            kept_groups += len(group_ids(uid[keep])[1])
        if (
            kept_groups < target
            and fg.max_num_gen_batches
            and len(rounds) >= fg.max_num_gen_batches
        ):
            raise RoundLimitError(
                f"step {step}: algorithm.filter_groups.max_num_gen_batches = "
                f"{fg.max_num_gen_batches} generation rounds kept {kept_groups} of the "
                f"data.train_batch_size = {target} prompt groups needed (the others had zero "
                f"spread of {fg.metric!r}); raise the limit (0 = none) or data.gen_batch_size"
            )
    pool = DataProto.concat(kept)
    first = first_groups_mask(pool.non_tensor_batch[K.UID], target)  # (B,)
    generated = sum(len(r.batch) for r in rounds)
    metrics = merge_round_metrics([r.metrics for r in rounds])
    metrics |= filter_metrics(generated, evicted, int((~first).sum()))
    return RoundsResult(pool.select_idxs(first), metrics, rounds)


@dataclass
class StepPlanInput:
    """What the step's stages run on: the stages, the step's input batch, the metrics of its
    generation rounds and their number (1 without dynamic sampling)."""

    stages: tuple[Stage, ...]
    batch: DataProto
    metrics: dict[str, float]
    gen_rounds: int


def step_input_of(run: Any, step: int, options: dict[str, Any]) -> StepPlanInput:
    """The next prompts as the step's input (all stages run on them), or with
    ``algorithm.filter_groups.enable`` the batch DAPO's generation rounds kept
    (:func:`generate_rounds`; the training stages run on it). ``run``: the training run
    (``flows.train.TrainRun``); ``options``: keyword arguments of ``run_step``."""
    cfg = run.cfg
    if cfg.algorithm.filter_groups.enable:
        rounds = generate_rounds(run, step, options)
        return StepPlanInput(TRAINING_STAGES, rounds.batch, rounds.metrics, len(rounds.rounds))
    step_input = next_step_input(run, step)
    return StepPlanInput(PPO_STAGES, step_input, {}, 1)
