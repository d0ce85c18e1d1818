"""The reward stage: score each sequence once and place it at its last valid response token.

Rule for when it runs: the stage is declared unconditionally (``when`` is always true), and its
function returns an EMPTY delta when the batch already holds ``rm_scores`` (the rollout scored
it); the flow must therefore pass ``rm_scores`` to it when present (see :func:`needs_scoring`).

Which route scores (``RewardSettings``):

- reward model disabled → the per-sample reward loop (route A);
- reward model enabled, ``combine = "replace"`` → the reward model alone (route B, as verl);
- reward model enabled, ``combine = "sum"`` → reward-model score + loop score, per row.

With ``reward.overlong_buffer`` applied (the ``dapo`` manager), DAPO's overlong penalty is added
to ``s_i`` (``stages.reward.overlong``; extras ``overlong_reward`` / ``overlong`` with its ``log``).

Either way the row score ``s_i`` goes to ``rm_scores[i, L_i - 1]`` (nothing for ``L_i = 0``).

Delta produced: ``rm_scores`` (B, R) float32, ``seq_scores`` (B,) float32 (``s_i``, also for
aborted rows), each reward extra as a (B,) object array in ``non_tensor_batch``, and
``meta_info["reward_extra_keys"]`` (their names). Metrics: ``reward/score_mean`` (over
non-aborted rows), ``reward/aborted_count``, ``reward/error_count``, ``reward/timeout_count``,
``reward/invalid_count`` (loop), ``reward_model/*`` (model), ``reward/time_s``.

A batch in which more than ``reward.max_invalid_fraction`` of the samples got no score (or all
of them) raises ``ScorerFailureError`` from the loop, with the scorer's first error: the stage
returns nothing, so no artifact of it is written and earlier steps' artifacts stay as they are.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch

from dataproto import DataProto
from dataproto import keys as K
from stages.reward.loop import RewardLoop
from stages.reward.overlong import shape_overlong
from stages.reward.placement import assemble_rm_scores
from stages.reward.reward_model import RewardModel
from stages.reward.settings import CONFIG_KEYS, FILE_KEYS, RewardSettings, settings_from_config
from stages.stage import Stage, StageContext, meta, non_tensor, tensor

LOOP_ENGINE = "reward_loop"  # ctx.engines key of the RewardLoop
MODEL_ENGINE = "reward_model"  # ctx.engines key of the RewardModel
SEQ_SCORES = K.SEQ_SCORES


def build_reward_engines(settings: RewardSettings, tokenizer: Any) -> dict[str, Any]:
    """Start-up: the reward loop (its zygote imports the scorer under reward.startup_timeout_s,
    then the workers are forked) and/or the reward model, keyed for ``StageContext.engines``.
    Close them with :func:`close_reward_engines`."""
    engines: dict[str, Any] = {}
    if settings.uses_loop:
        engines[LOOP_ENGINE] = RewardLoop(tokenizer, settings)
    if settings.reward_model_enable:
        engines[MODEL_ENGINE] = RewardModel(
            settings.reward_model_path,
            settings.num_workers,
            micro_batch_size=settings.reward_model_micro_batch,
            trust_remote_code=settings.reward_model_trust_remote_code,
        )
    return engines


def close_reward_engines(engines: dict[str, Any]) -> None:
    loop = engines.get(LOOP_ENGINE)
    if loop is not None:
        loop.close()


def needs_scoring(batch: DataProto) -> bool:
    """False when ``rm_scores`` is already in the batch (the reward stage then scores nothing and
    passes them on)."""
    return batch.batch is None or K.RM_SCORES not in batch.batch


def _engine(engines: dict[str, Any], name: str) -> Any:
    if name not in engines:
        raise KeyError(
            f"the reward stage needs ctx.engines[{name!r}] (build it once per run with "
            f"stages.reward.stage.build_reward_engines); engines has {sorted(engines)}"
        )
    return engines[name]


def _given_scores_delta(batch: DataProto) -> DataProto:
    """The delta when the batch already holds ``rm_scores`` (B, R), e.g. streamed by the
    rollout: verl then uses them as they are. The declared keys are returned — ``rm_scores``
    unchanged (the union accepts an equal value) and ``seq_scores`` = Σ_t rm_scores (B,) — so the
    stage's contract holds; no scorer or reward model runs. ``reward_extra_keys`` are the
    scorer's extras already in the batch (those the rollout's scoring added), if any."""
    rm_scores = batch.batch[K.RM_SCORES]
    extra_keys = list(batch.meta_info.get(K.REWARD_EXTRA_KEYS, []))
    return DataProto.from_dict(
        {K.RM_SCORES: rm_scores, SEQ_SCORES: rm_scores.sum(-1).float()},
        meta_info={K.REWARD_EXTRA_KEYS: extra_keys},
    )


def compute_reward(
    batch: DataProto, settings: RewardSettings, engines: dict[str, Any]
) -> tuple[DataProto, dict[str, float]]:
    """Score ``batch`` by the configured route; returns the delta and the stage's metrics.

    Raises:
        ScorerFailureError: the loop's stop rule (module docstring).
    """
    if not needs_scoring(batch):
        if settings.overlong is not None:
            raise ValueError(
                "reward.overlong_buffer.enable = true, but the rollout scored this batch itself "
                "(reward.score_in_rollout): the overlong penalty with the rollout's own scoring is "
                "not implemented; set reward.score_in_rollout = false"
            )
        return _given_scores_delta(batch), {"reward/skipped": 1.0}
    start = time.perf_counter()
    metrics: dict[str, float] = {}
    seq_scores = torch.zeros(len(batch), dtype=torch.float32)  # (B,)
    extras: dict[str, np.ndarray] = {}
    if settings.reward_model_enable:
        scored = _engine(engines, MODEL_ENGINE).score(batch)
        seq_scores += scored.scores
        metrics.update(scored.metrics)
    if settings.uses_loop:
        result = _engine(engines, LOOP_ENGINE).score(batch)
        seq_scores += torch.from_numpy(result.scores)
        extras = result.extras
        metrics.update({f"reward/{status}_count": float(n) for status, n in result.counts.items()})
    responses = batch.batch[K.RESPONSES]  # (B, R)
    if settings.overlong is not None:  # DAPO's overlong shaping (stages/reward/overlong.py)
        lengths = batch.batch[K.ATTENTION_MASK][:, -responses.shape[1] :].sum(-1)  # (B,) L_i
        seq_scores, overlong_extras = shape_overlong(seq_scores, lengths, settings.overlong)
        extras = {**extras, **overlong_extras}
    rm_scores, placed = placed_scores(seq_scores, batch.batch[K.ATTENTION_MASK], responses.shape[1])
    metrics |= placed
    metrics["reward/time_s"] = time.perf_counter() - start
    delta = DataProto.from_dict(
        {K.RM_SCORES: rm_scores, SEQ_SCORES: seq_scores},
        extras,
        {K.REWARD_EXTRA_KEYS: list(extras)},
    )
    return delta, metrics


def placed_scores(
    seq_scores: torch.Tensor, attention_mask: torch.Tensor, response_length: int
) -> tuple[torch.Tensor, dict[str, float]]:
    """(B, R) ``rm_scores`` (each row's score at its last response token) and the metrics
    ``reward/score_mean`` (over rows with a response) and ``reward/aborted_count``: what the
    reward stage and the rollout's own scoring (``stages.agent.scoring``) both report."""
    rm_scores, is_aborted = assemble_rm_scores(seq_scores, attention_mask, response_length)
    kept = seq_scores[~is_aborted]
    return rm_scores, {
        "reward/score_mean": float(kept.mean()) if len(kept) else float("nan"),
        "reward/aborted_count": float(is_aborted.sum()),
    }


def reward_stage_fn(batch: DataProto, ctx: StageContext) -> DataProto:
    """The stage function: settings from ``ctx.config``, engines from ``ctx.engines``."""
    delta, metrics = compute_reward(batch, settings_from_config(ctx.config), ctx.engines)
    ctx.metrics.update(metrics)
    return delta


REWARD_STAGE = Stage(
    name="reward",
    version=1,
    requires=(
        tensor(K.RESPONSES),
        tensor(K.ATTENTION_MASK),
        tensor(K.INPUT_IDS),
        tensor(K.PROMPTS),
        non_tensor(K.UID),
        non_tensor(K.DATA_SOURCE),
        non_tensor(K.REWARD_MODEL),
    ),
    produces=(tensor(K.RM_SCORES), tensor(SEQ_SCORES), meta(K.REWARD_EXTRA_KEYS)),
    fn=reward_stage_fn,
    config_keys=CONFIG_KEYS,
    file_keys=FILE_KEYS,
)
