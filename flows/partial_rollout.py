"""Partial rollouts (``async_training.partial_rollout``): a batch launched ahead whose generation
the weight syncs interrupt, each time resumed under the new weights.

verl aborts the requests in flight at a sync and resubmits each one's prompt and the tokens so far
with the remaining budget; the tokens already generated keep their log-probs. Here the points of
interruption are fixed by the schedule, not by timing (:func:`stages.schedules.partial_cuts`:
the syncs while the batch is in flight, at columns c_1 < … < c_n of its R response tokens), so a
run computes the same batches whatever the machine does.

Segment i generates columns [c_i, c_{i+1}) (c_0 = 0, c_{n+1} = R) on the replica's weights of
that moment: for every row whose response has no stop token yet, its prompt ‖ its response so far
is the prompt (left-padded; positions continue the prompt's), ``max_new_tokens`` = c_{i+1} − c_i,
seeded with :func:`segment_seed` of the step's rollout seed. Rows that ended keep padding. The
replica's ``generate_sequences`` does each segment unchanged (HF ``generate`` or vLLM), as verl's
resubmission does. Segments 0 … n − 1 run as jobs on the replica's lane right after the syncs
that end them (:meth:`PartialRollout.generate`); the last runs inside the rollout stage, whose
``actor`` engine is :class:`FinishingEngine`, so the batch is a rollout stage's artifact and
record like any other, keyed by every segment's weights (:meth:`PartialRollout.weights_key`).

The stitched rollout is the rollout layout (``stages.engines.rollout_hf``) plus
``rollout_policy_versions`` (B, R) int64: the version of the weights that chose each column's
token. A checkpoint taken while segments remain keeps the segments done
(:meth:`PartialRollout.state` / :meth:`PartialRollout.restore`).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from dataproto import DataProto
from dataproto import keys as K
from stages.engines.rollout_backends import ROLLOUT_METHODS
from stages.stage import step_seed

#: how a partial rollout's weights fingerprint begins (:meth:`PartialRollout.weights_key`)
PARTIAL_KEY_PREFIX = "partial-"


def is_partial_key(weights_fingerprint: str | None) -> bool:
    """Whether a rollout's weights fingerprint is a partial rollout's (several weights)."""
    return bool(weights_fingerprint) and weights_fingerprint.startswith(PARTIAL_KEY_PREFIX)


def segment_seed(seed: int, segment: int) -> int:
    """The seed of segment ``segment`` of a rollout seeded ``seed``: ``seed`` itself for the first
    (an uninterrupted generation samples as an unsegmented one), a derived one after.

    >>> segment_seed(7, 0), segment_seed(7, 1) == segment_seed(7, 1) != segment_seed(7, 2)
    (7, True)
    """
    return seed if segment == 0 else step_seed(seed, segment, "rollout/segment")


@dataclass(frozen=True)
class Segment:
    """Columns from ``start`` on, chosen by the weights of policy version ``version`` (lineage
    fingerprint ``weights``)."""

    start: int
    version: int
    weights: str | None


class PartialRollout:
    """One batch's generation in segments (module docstring).

    Args:
        prompts: the (B, P) prompt tensors under the engine's names (``input_ids``,
            ``attention_mask``, ``position_ids``: ``stages.rollout.generation_prompts``).
        seed: the step's rollout seed (``stages.rollout.sampling_seed``).
        ends: the columns where segments end before the last, c_1 < … < c_n (the cuts).
        stop_ids / pad_token_id: the sampling settings' (a row with a stop token has ended).
    """

    def __init__(
        self,
        prompts: DataProto,
        seed: int,
        ends: tuple[int, ...],
        stop_ids: tuple[int, ...],
        pad_token_id: int,
    ) -> None:
        self.prompts, self.seed, self.ends = prompts, seed, tuple(ends)
        self.stop_ids, self.pad_token_id = tuple(stop_ids), pad_token_id
        rows = len(prompts)
        self.responses = torch.empty(rows, 0, dtype=torch.long)  # (B, c) the columns done
        self.log_probs = torch.empty(rows, 0, dtype=torch.float32)
        self.segments: list[Segment] = []
        self.last_metrics: dict[str, Any] = {}  # the replica's metrics of the last segment

    @property
    def done(self) -> int:
        """Columns generated so far."""
        return self.responses.shape[1]

    def plan(self, version: int, weights: str | None) -> int:
        """Name the weights of the next segment (in the driver, when its job is queued: right
        after the sync that starts it); its index."""
        index = len(self.segments)
        if index > len(self.ends):
            raise RuntimeError(f"the partial rollout has only {index} segments")
        self.segments.append(Segment(self.ends[index - 1] if index else 0, version, weights))
        return index

    def generate(self, engine: Any, index: int) -> None:
        """Segment ``index`` (not the last) on ``engine``, the replica holding its weights: the
        columns up to the next cut. A lane job."""
        if index >= len(self.ends) or self.done != self.segments[index].start:
            raise RuntimeError(
                f"segment {index} of the partial rollout cannot run: {self.done} columns done, "
                f"cuts {self.ends}"
            )
        self.responses, self.log_probs = self._next(engine, self.ends[index], index)

    def _next(self, engine: Any, end: int, index: int) -> tuple[Tensor, Tensor]:
        """(responses, log-probs) with columns [done, end) of segment ``index`` appended; the
        columns done stay as they are (``last_metrics`` takes the engine's)."""
        start, rows = self.done, len(self.prompts)
        width = end - start
        tokens = torch.full((rows, width), self.pad_token_id, dtype=torch.long)
        log_probs = torch.zeros(rows, width, dtype=torch.float32)
        open_rows = self.open_rows().nonzero().squeeze(1)
        if open_rows.numel():
            out = engine.call(
                "generate_sequences",
                self._continuation(open_rows),
                validate=False,
                seed=segment_seed(self.seed, index),
                max_new_tokens=width,
            )
            self.last_metrics = dict(out.meta_info.get(K.METRICS, {}))
            tokens[open_rows] = out.batch[K.RESPONSES].to(torch.long)
            log_probs[open_rows] = out.batch[K.ROLLOUT_LOG_PROBS].to(torch.float32)
        return torch.cat([self.responses, tokens], 1), torch.cat([self.log_probs, log_probs], 1)

    def open_rows(self) -> Tensor:
        """(B,) bool: the rows whose response so far holds no stop token."""
        if not self.stop_ids:
            return torch.ones(len(self.prompts), dtype=torch.bool)
        return ~torch.isin(self.responses, torch.tensor(self.stop_ids)).any(dim=1)

    def _continuation(self, rows: Tensor) -> DataProto:
        """The next segment's prompts for ``rows``: prompt ‖ response so far (every open row has
        ``done`` real tokens), positions continuing the prompt's."""
        prompts = self.prompts.batch
        ids, mask, positions = (
            prompts[name][rows] for name in (K.INPUT_IDS, K.ATTENTION_MASK, K.POSITION_IDS)
        )
        so_far = self.responses[rows].to(ids.dtype)
        offsets = torch.arange(1, self.done + 1, dtype=positions.dtype)
        return DataProto.from_dict(
            {
                K.INPUT_IDS: torch.cat([ids, so_far], 1),
                K.ATTENTION_MASK: torch.cat([mask, torch.ones_like(so_far, dtype=mask.dtype)], 1),
                K.POSITION_IDS: torch.cat([positions, positions[:, -1:] + offsets], 1),
            }
        )

    def finish(self, engine: Any, settings: Any) -> DataProto:
        """The whole rollout: the last segment (to ``settings.response_length``) on ``engine``,
        stitched to the segments done and assembled in the rollout layout with
        ``rollout_policy_versions``; the columns done stay as they were (the stage may retry)."""
        from stages.engines.rollout_hf import assemble_rollout

        last = len(self.ends)
        if len(self.segments) != last + 1 or self.done != self.segments[last].start:
            raise RuntimeError(
                f"the partial rollout has {self.done} columns of its {last} earlier segments "
                f"(cuts {self.ends}); a lane job before its last segment failed"
            )
        responses, log_probs = self._next(engine, settings.response_length, last)
        out = assemble_rollout(self.prompts.batch, responses, log_probs, settings)
        rows, width = responses.shape
        out.batch[K.ROLLOUT_POLICY_VERSIONS] = column_versions(self.segments, rows, width)
        out.meta_info[K.METRICS] = dict(self.last_metrics)
        return out

    def weights_key(self) -> str:
        """The rollout's weights fingerprint for its cache key, once every segment is planned:
        each segment's first column and lineage."""
        parts = [[segment.start, segment.weights] for segment in self.segments]
        text = json.dumps(parts, separators=(",", ":")).encode()
        return PARTIAL_KEY_PREFIX + hashlib.sha256(text).hexdigest()

    # --- checkpoint ------------------------------------------------------------------------------

    def state(self) -> tuple[DataProto, list[dict[str, Any]]]:
        """(the columns done: ``responses`` and ``rollout_log_probs`` (B, c), the segments as
        JSON); :meth:`restore` takes them back."""
        columns = DataProto.from_dict(
            {K.RESPONSES: self.responses, K.ROLLOUT_LOG_PROBS: self.log_probs}
        )
        finished = sum(end <= self.done for end in self.ends)  # segments whose columns are done
        return columns, [vars(segment).copy() for segment in self.segments[:finished]]

    def restore(self, columns: DataProto, segments: list[dict[str, Any]]) -> None:
        """Take back the segments a checkpoint kept (:meth:`state`)."""
        done = columns.batch[K.RESPONSES].shape[1]
        if not segments or done != self.ends[len(segments) - 1]:
            raise ValueError(
                f"the checkpoint's partial rollout holds {done} columns after {len(segments)} "
                f"segments, but its cuts are at columns {self.ends}"
            )
        self.responses = columns.batch[K.RESPONSES].to(torch.long)
        self.log_probs = columns.batch[K.ROLLOUT_LOG_PROBS].to(torch.float32)
        self.segments = [Segment(**segment) for segment in segments]


def column_versions(segments: list[Segment], rows: int, width: int) -> Tensor:
    """(rows, width) int64: each column's segment's policy version.

    >>> column_versions([Segment(0, 2, None), Segment(3, 4, None)], 1, 5).tolist()
    [[2, 2, 2, 4, 4]]
    """
    versions = torch.empty(rows, width, dtype=torch.long)
    for segment, following in zip(segments, [*segments[1:], None], strict=True):
        end = width if following is None else following.start
        versions[:, segment.start : end] = segment.version
    return versions


class FinishingEngine:
    """The rollout stage's ``actor`` engine for a partial rollout: ``generate_sequences`` is
    :meth:`PartialRollout.finish` on the replica (its sampling settings from the run config, as
    the replica's own)."""

    world_size = 1

    def __init__(self, partial: PartialRollout, replica: Any) -> None:
        self.partial, self.replica = partial, replica

    def call(self, method: str, batch: DataProto, **kwargs: Any) -> DataProto:
        from stages.engines.roles import call_settings

        if method not in ROLLOUT_METHODS:
            raise ValueError(f"a partial rollout runs only {ROLLOUT_METHODS}, not {method!r}")
        if kwargs.get("seed") != self.partial.seed or kwargs.get("validate"):
            raise ValueError(
                f"the partial rollout was seeded {self.partial.seed} for training; the stage "
                f"called it with {kwargs}"
            )
        if not torch.equal(batch.batch[K.INPUT_IDS], self.partial.prompts.batch[K.INPUT_IDS]):
            raise ValueError("the rollout stage's prompts are not the partial rollout's")
        config, tokenizer = self.replica.config, self.replica.tokenizer
        settings = call_settings(config, tokenizer, len(batch), validate=False)
        return self.partial.finish(self.replica, settings)


class NoSegmentWeights:
    """The ``actor`` engine of a re-run of step ``step``'s partial rollout: a cache hit reuses
    the run's rollout; computing it again would need every segment's weights, which a re-run does
    not rebuild, so a call is one ValueError saying so."""

    world_size = 1

    def __init__(self, step: int) -> None:
        self.step = step

    def call(self, method: str, batch: DataProto, **kwargs: Any) -> DataProto:
        raise ValueError(
            f"step {self.step}'s rollout was a partial rollout, generated in segments by several "
            "versions of the weights (async_training.partial_rollout); a re-run reuses it but "
            "cannot generate it again: re-run it without --refresh and with the rollout's settings "
            "unchanged, or from a later stage (--from reward)"
        )
