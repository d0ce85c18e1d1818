"""Stage timers, per-token timing and throughput (verl's timing and ``compute_throughout_metrics``).

Keys:

- ``timing_s/{stage}``: wall seconds spent in a stage this step (timers accumulate over repeats).
- ``timing_per_token_ms/{stage}`` = 1000 · seconds / tokens, for ``gen`` over response tokens and
  for ``ref``, ``values``, ``adv``, ``update_critic``, ``update_actor`` over prompt + response
  tokens (attention-mask counts of every row in the batch); 0 when there are no tokens.
- ``perf/total_num_tokens`` = Σ ``meta_info["global_token_num"]`` (prompt + response tokens),
  ``perf/time_per_step`` = ``timing_s/step``, ``perf/throughput`` = tokens / (seconds · n_gpus).

Rows flagged ``is_pad`` are counted here: timing measures work done, and padded rows were processed.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import torch

from dataproto import keys
from stages.metrics.data import response_lengths

if TYPE_CHECKING:
    from dataproto.protocol import DataProto

#: stages whose per-token time divides by response tokens only
RESPONSE_TOKEN_STAGES = ("gen",)
#: stages whose per-token time divides by prompt + response tokens
ALL_TOKEN_STAGES = ("ref", "values", "adv", "update_critic", "update_actor")
#: the timer that spans one whole training step (generation through update)
STEP_TIMER = "step"


@contextmanager
def timed(name: str, timing_raw: dict[str, float]) -> Iterator[None]:
    """Add the wall time of the ``with`` body to ``timing_raw[name]`` (seconds, accumulating).

    Repeated names add up, as verl's ``marked_timer`` does, so a stage entered twice in a step
    reports its total. The time is recorded even when the body raises.

    Example:
        >>> timing = {}
        >>> with timed("gen", timing):
        ...     pass
        >>> first = timing["gen"]
        >>> with timed("gen", timing):
        ...     pass
        >>> timing["gen"] >= first >= 0.0
        True
    """
    start = time.perf_counter()
    try:
        yield
    finally:
        timing_raw[name] = timing_raw.get(name, 0.0) + (time.perf_counter() - start)


def compute_timing_metrics(batch: DataProto, timing_raw: dict[str, float]) -> dict[str, float]:
    """``timing_s/{name}`` for every timer and ``timing_per_token_ms/{name}`` for the token stages.

    Token counts: R_tok = Σ_i response_length_i (for ``gen``), T_tok = Σ_i (prompt_length_i +
    response_length_i) (for ref, values, adv, update_critic, update_actor); a stage with no
    tokens gets 0.0.

    Example:
        >>> from tensordict import TensorDict
        >>> from dataproto.protocol import DataProto
        >>> mask = torch.tensor([[1, 1, 1, 0], [0, 1, 1, 1]])  # P = 2, R = 2: 2 + 3 response tokens
        >>> batch = DataProto(TensorDict({"attention_mask": mask, "responses": torch.zeros(2, 2)}, [2]))
        >>> compute_timing_metrics(batch, {"gen": 0.5, "update_actor": 0.6, "step": 2.0})
        {'timing_s/gen': 0.5, 'timing_s/update_actor': 0.6, 'timing_s/step': 2.0, 'timing_per_token_ms/gen': 166.66666666666666, 'timing_per_token_ms/update_actor': 100.0}
    """
    prompt_length, response_length = response_lengths(batch)
    prompt_tokens, response_tokens = torch.stack(
        [prompt_length.sum(), response_length.sum()]
    ).tolist()
    tokens_of_stage = dict.fromkeys(RESPONSE_TOKEN_STAGES, response_tokens)
    tokens_of_stage |= dict.fromkeys(ALL_TOKEN_STAGES, prompt_tokens + response_tokens)
    metrics = {f"timing_s/{name}": float(seconds) for name, seconds in timing_raw.items()}
    for name, seconds in timing_raw.items():
        if name in tokens_of_stage:
            tokens = tokens_of_stage[name]
            per_token = float(seconds) * 1000.0 / tokens if tokens > 0 else 0.0
            metrics[f"timing_per_token_ms/{name}"] = per_token
    return metrics


def compute_throughput_metrics(
    batch: DataProto, timing_raw: dict[str, float], n_gpus: int
) -> dict[str, float]:
    """Tokens per step, step time and tokens / (second · device).

    Reads ``meta_info["global_token_num"]`` (per-row prompt + response token counts, set by the
    step flow after balancing) and ``timing_raw["step"]``.

    Example:
        >>> from dataproto.protocol import DataProto
        >>> batch = DataProto(meta_info={"global_token_num": [6, 10]})
        >>> compute_throughput_metrics(batch, {"step": 2.0}, n_gpus=4)
        {'perf/total_num_tokens': 16.0, 'perf/time_per_step': 2.0, 'perf/throughput': 2.0}
    """
    if keys.GLOBAL_TOKEN_NUM not in batch.meta_info:
        raise KeyError(
            f"compute_throughput_metrics needs meta_info[{keys.GLOBAL_TOKEN_NUM!r}] (per-row token "
            f"counts, set after balancing); meta_info has {sorted(batch.meta_info)}"
        )
    if STEP_TIMER not in timing_raw:
        raise KeyError(
            f"compute_throughput_metrics needs the {STEP_TIMER!r} timer; timers present: {sorted(timing_raw)}"
        )
    if n_gpus < 1:
        raise ValueError(f"n_gpus must be a positive device count, got {n_gpus}")
    seconds = float(timing_raw[STEP_TIMER])
    if seconds <= 0.0:
        raise ValueError(f"timing_raw[{STEP_TIMER!r}] must be > 0 seconds, got {seconds}")
    total_tokens = float(sum(batch.meta_info[keys.GLOBAL_TOKEN_NUM]))
    return {
        "perf/total_num_tokens": total_tokens,
        "perf/time_per_step": seconds,
        "perf/throughput": total_tokens / (seconds * n_gpus),
    }


#: verl's spelling (``compute_throughout_metrics``), kept so ported code keeps working.
compute_throughout_metrics = compute_throughput_metrics
