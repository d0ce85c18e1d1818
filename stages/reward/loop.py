"""Route A: the per-sample reward loop (decode, score in isolated workers, collect, count).

For each row the loop decodes the valid response tokens (``responses[i, :L_i]``, special tokens
skipped) and, when the scorer's signature names ``prompt_str``, the valid prompt tokens (the last
``attention_mask[i, :P].sum()`` of ``prompts[i]``); it reads the row's route (``data_source``, or
``reward_route`` when ``data.reward_fn_key`` names another column: verl's
``row[reward_fn_key]``), ``reward_model["ground_truth"]`` and ``extra_info`` and calls verl's
signature ``compute_score(data_source=<route>, solution_str=, ground_truth=, extra_info=,
**scorer_kwargs)``.

Every scorer, sync or ``async def``, runs in a :class:`~stages.reward.pool.ScorerPool` of
``num_workers`` processes forked from a zygote that imported the scorer under
``startup_timeout_s`` (this process never imports it); a call past ``timeout_s`` kills its
worker, which is replaced in about a millisecond. Samples and results cross as plain data, never
pickled; each worker's memory (``worker_memory_mb``) and the output it passes on to the run's
log (``worker_output_bytes`` per batch) are bounded (``stages.reward.pool``).

A failed sample does not stop the loop: a raise, a timeout, a non-number (str, None, NaN, inf, a
dict without a finite ``score``) or extras the artifact cannot store give ``error_score``, are
counted (``reward/error_count``, ``reward/timeout_count``, ``reward/invalid_count``) and logged
once with the sample's uid and data_source (``stages.reward.accounting``). A batch in which more
than ``max_invalid_fraction`` of the samples failed — or all of them — stops the run with
:class:`~stages.reward.accounting.ScorerFailureError`, naming the scorer's first error.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import numpy as np
from torch import Tensor

from dataproto import DataProto
from dataproto import keys as K
from stages.reward.accounting import (
    RESERVED_EXTRA_NAMES,
    LoopResult,
    check_failure_share,
    summarize,
)
from stages.reward.custom import DEFAULT_SCORER, ScorerRef, scorer_ref
from stages.reward.output import OUTPUT_KEY
from stages.reward.placement import response_lengths
from stages.reward.pool import ScorerPool
from stages.reward.scorers.registry import check_data_sources
from stages.reward.settings import RewardSettings

__all__ = ["LoopResult", "RewardLoop", "build_calls", "decode_rows"]

logger = logging.getLogger(__name__)


def decode_rows(tokenizer: Any, token_ids: Tensor, lengths: Tensor, *, from_end: bool) -> list[str]:
    """Decode the first (or last, ``from_end``) ``lengths[i]`` tokens of each row, skipping specials.

    Args:
        token_ids: (B, W) int token ids.
        lengths: (B,) valid lengths in [0, W].
    """
    rows = token_ids.tolist()
    counts = lengths.tolist()
    valid = [row[len(row) - n :] if from_end else row[:n] for row, n in zip(rows, counts)]
    return tokenizer.batch_decode(valid, skip_special_tokens=True)


def _ground_truth(reward_model: Any, row: int, uid: Any) -> Any:
    if not isinstance(reward_model, dict) or "ground_truth" not in reward_model:
        raise KeyError(
            f"row {row} (uid {uid!r}): non_tensor_batch['reward_model'] must be a dict with "
            f"'ground_truth', got {reward_model!r}"
        )
    return reward_model["ground_truth"]


#: the agent rollout's columns a scorer finds in ``extra_info`` (verl's naive manager merges
#: ``num_turns`` and the tool extra fields into it): column → extra_info key
AGENT_EXTRA_FIELDS = {K.NUM_TURNS: "num_turns", "tool_rewards": "tool_rewards"}


def _with_agent_fields(extra_info: Any, nt: dict[str, np.ndarray], row: int) -> Any:
    """``extra_info`` with the row's agent fields (:data:`AGENT_EXTRA_FIELDS`) when the batch has
    them (a multi-turn rollout), as plain values; the row's own keys are kept and win."""
    present = {name: key for name, key in AGENT_EXTRA_FIELDS.items() if name in nt}
    if not present:
        return extra_info
    fields = {}
    for name, key in present.items():
        value = nt[name][row]
        fields[key] = int(value) if name == K.NUM_TURNS else list(value)
    return {**fields, **(extra_info or {})}


def build_calls(
    batch: DataProto,
    tokenizer: Any,
    *,
    with_prompt: bool,
    scorer_kwargs: dict[str, Any],
    route_key: str = K.DATA_SOURCE,
) -> list[dict[str, Any]]:
    """One keyword-argument dict per row for ``compute_score``.

    Reads (tensor) ``responses`` (B, R), ``attention_mask`` (B, T), ``prompts`` (B, P) when
    ``with_prompt``; (non-tensor) ``route_key`` (``data_source`` or ``reward_route``: the value
    passed as ``data_source=``), ``reward_model``, ``extra_info`` (optional), ``uid`` (optional,
    for messages); after a multi-turn rollout ``extra_info`` also holds ``num_turns`` and
    ``tool_rewards`` (:data:`AGENT_EXTRA_FIELDS`, verl's merge).
    """
    responses, attention_mask = batch.batch[K.RESPONSES], batch.batch[K.ATTENTION_MASK]
    nt = batch.non_tensor_batch
    for key in (route_key, K.REWARD_MODEL):
        if key not in nt:
            hint = (
                " (data.reward_fn_key names a column other than data_source: load the data "
                "with that reward_fn_key so each row carries it)"
                if key == K.REWARD_ROUTE
                else ""
            )
            raise KeyError(
                f"the reward loop needs non_tensor_batch[{key!r}]{hint}; batch has {sorted(nt)}"
            )
    lengths = response_lengths(attention_mask, responses.shape[1])  # (B,)
    solutions = decode_rows(tokenizer, responses, lengths, from_end=False)
    prompts: list[str] | None = None
    if with_prompt:
        prompt_ids = batch.batch[K.PROMPTS]  # (B, P)
        prompt_lengths = attention_mask[:, : prompt_ids.shape[1]].long().sum(-1)  # (B,)
        prompts = decode_rows(tokenizer, prompt_ids, prompt_lengths, from_end=True)
    uids = nt.get(K.UID, np.arange(len(solutions)))
    extra_infos = nt.get(K.EXTRA_INFO, np.full(len(solutions), None, dtype=object))
    calls = []
    for i, solution in enumerate(solutions):
        call = {
            "data_source": nt[route_key][i],
            "solution_str": solution,
            "ground_truth": _ground_truth(nt[K.REWARD_MODEL][i], i, uids[i]),
            "extra_info": _with_agent_fields(extra_infos[i], nt, i),
            **scorer_kwargs,
        }
        if prompts is not None:
            call["prompt_str"] = prompts[i]
        calls.append(call)
    return calls


class RewardLoop:
    """The per-sample reward loop of a run: owns its worker pool until :meth:`close`.

    Args:
        tokenizer: decodes responses (and prompts); ``batch_decode(list[list[int]], skip_special_tokens=True)``.
        settings: ``num_workers``, ``timeout_s``, ``startup_timeout_s``, ``worker_memory_mb``,
            ``worker_output_bytes``, ``error_score``, ``max_invalid_fraction``,
            ``scorer_kwargs``, ``custom_path`` / ``custom_name``.
        scorer: overrides the settings' scorer (the data_source router when neither is given).

    The pool starts here, in the run's start-up: the scorer is imported (in the zygote, under
    ``startup_timeout_s``), so a missing, hanging or broken file or function fails now, in one
    line (``ScorerStartupError``; ``FileNotFoundError`` for a missing file).
    """

    def __init__(self, tokenizer: Any, settings: RewardSettings, scorer: ScorerRef | None = None):
        self.tokenizer = tokenizer
        self.settings = settings
        self.scorer = scorer or scorer_ref(settings.custom_path, settings.custom_name)
        self._pool = ScorerPool(
            self.scorer,
            settings.num_workers,
            startup_timeout_s=settings.startup_timeout_s,
            memory_mb=settings.worker_memory_mb,
            output_bytes=settings.worker_output_bytes,
            reserved_names=RESERVED_EXTRA_NAMES,
        )
        self._dropped_in_batch = 0  # scorer output bytes dropped since the last summarize
        self.is_async = self._pool.info.is_async
        self.wants_prompt = self._pool.info.wants_prompt
        if self._pool.info.threads > 1:
            logger.warning(
                "reward scorer %s started %d threads while importing; its workers are forked "
                "from that process, and a worker that inherits a held lock hangs until "
                "reward.timeout_s kills it",
                self.scorer.label, self._pool.info.threads - 1,
            )  # fmt: skip

    @property
    def pool(self) -> ScorerPool:
        return self._pool

    def score(self, batch: DataProto) -> LoopResult:
        """Decode and score every row of ``batch``; see :func:`build_calls` for the keys read.

        Raises:
            ScorerFailureError: more than ``max_invalid_fraction`` of the rows (or all) failed.
        """
        calls = self.calls_for(batch)
        uids = batch.non_tensor_batch.get(K.UID, np.arange(len(calls)))
        return self.score_calls(calls, uids)

    def calls_for(self, batch: DataProto) -> list[dict[str, Any]]:
        """The scorer's keyword dicts of every row of ``batch`` (:func:`build_calls`); with the
        built-in router, an unknown data source fails here."""
        route_key = self.settings.route_key
        calls = build_calls(
            batch,
            self.tokenizer,
            with_prompt=self.wants_prompt,
            scorer_kwargs=self.settings.scorer_kwargs,
            route_key=route_key,
        )
        if self.scorer == DEFAULT_SCORER:
            check_data_sources(batch.non_tensor_batch[route_key])  # unknown names fail now
        return calls

    def score_calls(self, calls: Sequence[dict[str, Any]], uids: Sequence[Any]) -> LoopResult:
        """Score already-built keyword dicts (one per sample); ``uids`` label the log messages.

        Raises:
            ScorerFailureError: more than ``max_invalid_fraction`` of the calls (or all) failed.
        """
        return self.summarize(calls, self.map_calls(calls), uids)

    def map_calls(self, calls: Sequence[dict[str, Any]]) -> list[Any]:
        """The scorer's outcome of each call (workers, timeouts, output cap); no stop rule."""
        outcomes = self._pool.map(calls, self.settings.timeout_s)
        self._dropped_in_batch += self._pool.output_dropped
        return outcomes

    def summarize(
        self, calls: Sequence[dict[str, Any]], outcomes: Sequence[Any], uids: Sequence[Any]
    ) -> LoopResult:
        """The batch's :class:`LoopResult` from its calls' outcomes (:meth:`map_calls`, maybe
        in several parts), counted and logged once, then the stop rule.

        Raises:
            ScorerFailureError: more than ``max_invalid_fraction`` of the calls (or all) failed.
        """
        settings = self.settings
        dropped, self._dropped_in_batch = self._dropped_in_batch, 0
        if dropped:
            logger.warning(
                "reward scorer %s printed more than %s=%d bytes in this batch; %d bytes of its "
                "output were dropped (%d over the run)",
                self.scorer.label, OUTPUT_KEY, settings.worker_output_bytes,
                dropped, self._pool.output_dropped_total,
            )  # fmt: skip
        data_sources = [call.get("data_source") for call in calls]
        result = summarize(outcomes, uids, data_sources, settings.error_score)
        result.output_dropped_bytes = dropped
        check_failure_share(result, uids, settings.max_invalid_fraction, self.scorer.label)
        return result

    def close(self) -> None:
        self._pool.close()

    def __enter__(self) -> RewardLoop:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
