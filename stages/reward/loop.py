"""Route A: the per-sample reward loop (decode, score concurrently, collect, count failures).

For each row the loop decodes the valid response tokens (``responses[i, :L_i]``, special tokens
skipped) and, when the scorer's signature names ``prompt_str``, the valid prompt tokens (the last
``attention_mask[i, :P].sum()`` of ``prompts[i]``); it reads the row's route (``data_source``, or
``reward_route`` when ``data.reward_fn_key`` names another column: verl's
``row[reward_fn_key]``), ``reward_model["ground_truth"]`` and ``extra_info`` and calls verl's
signature ``compute_score(data_source=<route>, solution_str=, ground_truth=, extra_info=,
**scorer_kwargs)``.

Sync scorers run in a :class:`~stages.reward.pool.ScorerPool` of ``num_workers`` processes (no
GIL contention; a hung or dead worker is killed / replaced). ``async def`` scorers run on an
event loop, ``max_concurrent`` at a time, each under ``asyncio.wait_for``; an async scorer must
not block its event loop (a blocking call cannot be timed out there).

A failure never stops the loop: a raise, a timeout, a NaN/inf or a non-number gives
``error_score``, is counted (``reward/error_count``, ``reward/timeout_count``,
``reward/invalid_count``) and logged once with the sample's uid and data_source.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
from torch import Tensor

from dataproto import DataProto
from dataproto import keys as K
from stages.reward.custom import (
    DEFAULT_SCORER,
    ScorerRef,
    is_async_scorer,
    scorer_ref,
    wants_prompt,
)
from stages.reward.placement import response_lengths
from stages.reward.pool import ScorerPool
from stages.reward.scorers.registry import check_data_sources
from stages.reward.settings import RewardSettings
from stages.reward.worker import ERROR, INVALID, OK, TIMEOUT, Outcome, classify_result

logger = logging.getLogger(__name__)


@dataclass
class LoopResult:
    """What the loop produced for B samples.

    scores: (B,) float32, ``error_score`` where the scorer failed.
    extras: name → (B,) object array of per-sample extra infos (None where a sample lacks it).
    outcomes: the per-sample :class:`Outcome` (status and message).
    counts: ``{"error": n, "timeout": n, "invalid": n}``.
    """

    scores: np.ndarray
    extras: dict[str, np.ndarray]
    outcomes: list[Outcome]
    counts: dict[str, int]


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
    for messages).
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
            "extra_info": extra_infos[i],
            **scorer_kwargs,
        }
        if prompts is not None:
            call["prompt_str"] = prompts[i]
        calls.append(call)
    return calls


async def _score_async(
    fn: Callable[..., Any], calls: Sequence[dict[str, Any]], timeout_s: float | None, limit: int
) -> list[Outcome]:
    semaphore = asyncio.Semaphore(limit)

    async def one(kwargs: dict[str, Any]) -> Outcome:
        async with semaphore:
            try:
                value = await asyncio.wait_for(fn(**kwargs), timeout_s)
            except TimeoutError:
                return Outcome(TIMEOUT, message=f"timed out after {timeout_s} s")
            except Exception as exc:
                return Outcome(ERROR, message=f"raised {type(exc).__name__}: {exc}")
            return classify_result(value)

    return list(await asyncio.gather(*(one(kwargs) for kwargs in calls)))


def run_async_scorer(
    fn: Callable[..., Any], calls: Sequence[dict[str, Any]], timeout_s: float | None, limit: int
) -> list[Outcome]:
    """Score every call with an ``async def`` scorer on a fresh event loop (a thread's own loop
    when the caller is already inside one)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(_score_async(fn, calls, timeout_s, limit))
    with ThreadPoolExecutor(max_workers=1) as thread:
        return thread.submit(asyncio.run, _score_async(fn, calls, timeout_s, limit)).result()


def collect_extras(outcomes: Sequence[Outcome]) -> dict[str, np.ndarray]:
    """name → (B,) object array over the successful outcomes' extras (None elsewhere).

    Names keep their first-seen order, so ``reward_extra_keys`` is stable across steps.
    """
    names: dict[str, None] = {}
    for outcome in outcomes:
        names.update(dict.fromkeys(outcome.extras))
    extras = {name: np.full(len(outcomes), None, dtype=object) for name in names}
    for i, outcome in enumerate(outcomes):
        for name, value in outcome.extras.items():
            extras[name][i] = value
    return extras


def summarize(
    outcomes: Sequence[Outcome],
    uids: Sequence[Any],
    data_sources: Sequence[Any],
    error_score: float,
) -> LoopResult:
    """Substitute ``error_score`` for failures, count and log each failure once."""
    scores = np.full(len(outcomes), error_score, dtype=np.float32)
    counts = {ERROR: 0, TIMEOUT: 0, INVALID: 0}
    for i, outcome in enumerate(outcomes):
        if outcome.status == OK:
            scores[i] = outcome.score
            continue
        counts[outcome.status] += 1
        logger.warning(
            "reward %s for uid=%s data_source=%s: %s; score set to %s",
            outcome.status, uids[i], data_sources[i], outcome.message, error_score,
        )  # fmt: skip
    return LoopResult(scores, collect_extras(outcomes), list(outcomes), counts)


class RewardLoop:
    """The per-sample reward loop of a run: owns its worker pool until :meth:`close`.

    Args:
        tokenizer: decodes responses (and prompts); ``batch_decode(list[list[int]], skip_special_tokens=True)``.
        settings: ``num_workers``, ``timeout_s``, ``error_score``, ``max_concurrent``,
            ``scorer_kwargs``, ``custom_path`` / ``custom_name``.
        scorer: overrides the settings' scorer (the data_source router when neither is given).

    The scorer is imported here, in the run's start-up, so a missing file or function fails now.
    """

    def __init__(self, tokenizer: Any, settings: RewardSettings, scorer: ScorerRef | None = None):
        self.tokenizer = tokenizer
        self.settings = settings
        self.scorer = scorer or scorer_ref(settings.custom_path, settings.custom_name)
        fn = self.scorer.resolve()
        self.is_async = is_async_scorer(fn)
        self.wants_prompt = wants_prompt(fn)
        self._async_fn = fn if self.is_async else None
        self._pool = None if self.is_async else ScorerPool(self.scorer, settings.num_workers)

    @property
    def pool(self) -> ScorerPool | None:
        return self._pool

    def score(self, batch: DataProto) -> LoopResult:
        """Decode and score every row of ``batch``; see :func:`build_calls` for the keys read."""
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
        uids = batch.non_tensor_batch.get(K.UID, np.arange(len(calls)))
        return self.score_calls(calls, uids)

    def score_calls(self, calls: Sequence[dict[str, Any]], uids: Sequence[Any]) -> LoopResult:
        """Score already-built keyword dicts (one per sample); ``uids`` label the log messages."""
        settings = self.settings
        if self._async_fn is not None:
            outcomes = run_async_scorer(
                self._async_fn, calls, settings.timeout_s, settings.max_concurrent
            )
        else:
            assert self._pool is not None
            outcomes = self._pool.map(calls, settings.timeout_s)
        data_sources = [call.get("data_source") for call in calls]
        return summarize(outcomes, uids, data_sources, settings.error_score)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()

    def __enter__(self) -> RewardLoop:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
