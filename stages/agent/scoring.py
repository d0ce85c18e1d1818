"""Reward inside the rollout: each trajectory scored as soon as it finishes (verl's reward loop
in the agent loop), while the others still generate.

With ``reward.score_in_rollout`` (:func:`scores_in_rollout`; by default on for agent rollouts) the
rollout hands every round's finished trajectories to a :class:`RolloutScorer`, which scores them
on the run's reward workers (``stages.reward.loop.RewardLoop``) in a thread of its own while the
next round generates. When the last trajectory is done the scores are gathered, counted and
checked once for the whole batch (:meth:`RewardLoop.summarize`: the same calls, outcomes,
``error_score`` and stop rule as the reward stage), and the rollout's delta carries

    rm_scores          (B, R) the score at the last response token (``attention_mask``'s last
                       1 of the response; 0 elsewhere), as the reward stage places it
    <extra>            (B,) each reward extra (``acc``, ``pred``, …), named in
    reward_extra_keys  (meta_info) the extras' names

The reward stage then finds ``rm_scores`` in the batch and passes them on (``reward/skipped``),
so downstream stages read exactly what they read after the reward stage.

Why this is the default for agent rollouts and not for single-turn ones: a single-turn rollout
is one engine call, so nothing generates while its rows are scored; scoring inside it would only
move the reward stage's time into the rollout's (``bench/agent_rollout.py`` measures both).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np
import torch

from dataproto import DataProto
from dataproto import keys as K
from stages.agent.loop import Trajectory
from stages.agent.trajectory import trajectories_to_batch

#: the step's non-tensor columns a scorer call reads (build_calls), copied to a scored part
SCORER_COLUMNS = (K.DATA_SOURCE, K.REWARD_ROUTE, K.REWARD_MODEL, K.EXTRA_INFO, K.UID)
REWARD_LOOP_ENGINE = "reward_loop"


def scores_in_rollout(config: Any) -> bool:
    """``reward.score_in_rollout``, or when null: on when the run may use tools (an agent
    rollout) and the rule-based loop scores alone (no reward model)."""
    from stages.agent.rollout import may_use_tools

    setting = config.reward.score_in_rollout
    if setting is not None:
        return bool(setting)
    return may_use_tools(config) and not config.reward.reward_model.enable


def scoring_keys(config: Any) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The reward settings the rollout reads when it scores (``Stage.keys_for_config``): the
    reward stage's config and file keys then join the rollout's cache key, and only then."""
    if not scores_in_rollout(config):
        return (), ()
    from stages.reward.settings import CONFIG_KEYS, FILE_KEYS

    return tuple(CONFIG_KEYS), tuple(FILE_KEYS)


class RolloutScorer:
    """Scores parts of one rollout batch in the background (module docstring).

    Args:
        reward_loop: the run's ``RewardLoop`` (``ctx.engines["reward_loop"]``).
        batch: the step rows (their :data:`SCORER_COLUMNS`).
        prompts: the (B, P) ``input_ids`` / ``attention_mask`` / ``position_ids`` the rollout
            started from.
        response_length / pad_id: the rollout's response width and pad id.
    """

    def __init__(
        self,
        reward_loop: Any,
        batch: DataProto,
        prompts: Any,
        response_length: int,
        pad_id: int,
    ) -> None:
        self.reward_loop = reward_loop
        self.columns = {
            k: batch.non_tensor_batch[k] for k in SCORER_COLUMNS if k in batch.non_tensor_batch
        }
        self.prompts = prompts
        self.response_length = response_length
        self.pad_id = pad_id
        self.parts: list[tuple[list[int], Future]] = []
        self.busy_s = 0.0  # time the scoring thread spent scoring
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="ppoflow-rollout-reward")

    def submit(self, rows: Sequence[int], trajectories: Sequence[Trajectory]) -> None:
        """Score ``trajectories`` (the finished trajectories of step rows ``rows``) in the
        background."""
        if not rows:
            return
        index = torch.tensor(list(rows))
        part = trajectories_to_batch(
            self.prompts[index], trajectories, self.response_length, self.pad_id
        )
        chosen = np.asarray(rows)
        for name, column in self.columns.items():
            part.non_tensor_batch[name] = column[chosen]
        self.parts.append((list(rows), self._executor.submit(self._score, part)))

    def _score(self, part: DataProto) -> tuple[list[dict[str, Any]], list[Any]]:
        started = time.perf_counter()
        calls = self.reward_loop.calls_for(part)
        outcomes = self.reward_loop.map_calls(calls)
        self.busy_s += time.perf_counter() - started
        return calls, outcomes

    def finish(self, rows: int) -> tuple[Any, float]:
        """Wait for every part; (the batch's ``LoopResult`` in row order, seconds waited).

        Raises:
            ScorerFailureError: the reward stage's stop rule, over the whole batch.
        """
        started = time.perf_counter()
        try:
            done = [(part_rows, future.result()) for part_rows, future in self.parts]
        finally:
            self._executor.shutdown(wait=True)
        waited = time.perf_counter() - started
        calls: list[Any] = [None] * rows
        outcomes: list[Any] = [None] * rows
        for part_rows, (part_calls, part_outcomes) in done:
            for row, call, outcome in zip(part_rows, part_calls, part_outcomes, strict=True):
                calls[row], outcomes[row] = call, outcome
        missing = [row for row in range(rows) if calls[row] is None]
        if missing:
            raise RuntimeError(f"rows {missing[:5]} of the rollout were never scored")
        uids = self.columns.get(K.UID, np.arange(rows))
        return self.reward_loop.summarize(calls, outcomes, uids), waited


def scored_delta(
    result: Any, attention_mask: torch.Tensor, response_length: int
) -> tuple[DataProto, dict[str, float]]:
    """The rollout's reward keys (module docstring) from the batch's ``LoopResult``, and the
    reward metrics the reward stage would log (``reward/score_mean``, counts)."""
    from stages.reward.stage import placed_scores

    seq_scores = torch.from_numpy(np.asarray(result.scores, dtype=np.float32))  # (B,)
    rm_scores, placed = placed_scores(seq_scores, attention_mask, response_length)
    metrics = {f"reward/{status}_count": float(n) for status, n in result.counts.items()}
    metrics |= placed
    delta = DataProto.from_dict(
        {K.RM_SCORES: rm_scores}, dict(result.extras), {K.REWARD_EXTRA_KEYS: list(result.extras)}
    )
    return delta, metrics


def score_whole_rollout(batch: DataProto, rollout: DataProto, ctx: Any) -> DataProto:
    """The reward keys of a one-call (single-turn) rollout, scored in the rollout stage after
    its generation (``reward.score_in_rollout: true`` without an agent loop): nothing overlaps,
    the scores are those of the reward stage."""
    from stages.engine_calls import get_engine

    loop = get_engine(ctx, REWARD_LOOP_ENGINE)
    started = time.perf_counter()
    part = DataProto(
        batch=rollout.batch,
        non_tensor_batch={
            k: batch.non_tensor_batch[k] for k in SCORER_COLUMNS if k in batch.non_tensor_batch
        },
        meta_info={},
    )
    result = loop.score(part)
    response_length = rollout.batch[K.RESPONSES].shape[1]
    delta, metrics = scored_delta(result, rollout.batch[K.ATTENTION_MASK], response_length)
    ctx.metrics.update(metrics | {"reward/time_s": time.perf_counter() - started})
    return delta
