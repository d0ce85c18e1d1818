"""Per-step data metrics over the whole training batch (verl's ``compute_data_metrics``).

Every key, with its denominator (docs/metrics.md):

- ``critic/score/{mean,max,min}``: Σ_t token_level_scores per row, over non-aborted rows.
- ``critic/rewards/{mean,max,min}``: Σ_t token_level_rewards per row, over non-aborted rows.
- ``critic/advantages/*``, ``critic/returns/*``: over tokens where response_mask is 1.
- ``critic/values/*``, ``critic/vf_explained_var`` (only with a critic): over response_mask tokens;
  explained variance = 1 − var(R − V) / (var(R) + 1e-5), unbiased (n − 1) variances.
- ``response_length/{mean,max,min,clip_ratio}``: over all rows, zero-length rows included; the
  length is the row's *model* tokens (``response_mask`` sum: a multi-turn trajectory's tool
  tokens are not counted, a deliberate difference from verl, which counts them), clip_ratio =
  fraction of rows whose whole response (model and tool tokens) fills the padded width
  ``responses.shape[-1]`` (the budget was hit). Single-turn rollouts: the same numbers as verl's.
- ``response_length_non_aborted/*``: the same over non-aborted rows (length > 0).
- ``response/aborted_ratio``: fraction of rows with response length 0.
- ``prompt_length/{mean,max,min,clip_ratio}``: over all rows; clip against ``prompts.shape[-1]``.
- ``num_turns/{min,max,mean}`` and ``tool_call_counts/{min,max,mean}``: over rows, when the
  non-tensor keys ``__num_turns__`` / ``tool_call_counts`` are present.

A statistic over an empty set (every row aborted, an all-zero response_mask) is NaN, never an
error. Prompt lengths, whole-response lengths (clip, aborted) come from the prompt / response
slices of ``attention_mask``, or from ``prompt_length`` / ``response_length`` tensors when present.

Deliberate difference 2 (docs/differences.md): rows marked by the ``is_pad`` key (True on rows duplicated by
``pad_dataproto_to_divisor``) are dropped from *every* statistic above, including the row
counts behind ratios, so padding never biases a metric. verl has no such key.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import Tensor

from dataproto import keys

if TYPE_CHECKING:
    from dataproto.protocol import DataProto

IS_PAD = keys.IS_PAD
TOOL_CALL_COUNTS = keys.TOOL_CALL_COUNTS
#: optional precomputed lengths that replace the attention-mask slices (verl's names)
PROMPT_LENGTH = keys.PROMPT_LENGTH
RESPONSE_LENGTH = keys.RESPONSE_LENGTH
#: the 1e-5 verl adds to var(returns) in the explained-variance denominator
EXPLAINED_VAR_EPS = 1e-5


def _require(batch: DataProto, names: list[str], why: str) -> None:
    present = set(batch.batch.keys()) if batch.batch is not None else set()
    missing = [name for name in names if name not in present]
    if missing:
        raise KeyError(
            f"{why} needs tensor keys {missing}, which the batch lacks; present: {sorted(present)}"
        )


def response_lengths(batch: DataProto) -> tuple[Tensor, Tensor]:
    """Per-row (prompt_length, response_length) as float tensors, each (B,).

    Taken from ``prompt_length`` / ``response_length`` tensors when both exist, otherwise from
    ``attention_mask[:, :-R]`` and ``attention_mask[:, -R:]`` summed over tokens, with
    R = ``responses.shape[-1]``.

    Example:
        >>> from tensordict import TensorDict
        >>> from dataproto.protocol import DataProto
        >>> mask = torch.tensor([[0, 1, 1, 1, 0], [1, 1, 0, 0, 0]])  # P = 2, R = 3
        >>> batch = DataProto(TensorDict({"attention_mask": mask, "responses": torch.zeros(2, 3)}, [2]))
        >>> response_lengths(batch)
        (tensor([1., 2.]), tensor([2., 0.]))
    """
    present = set(batch.batch.keys()) if batch.batch is not None else set()
    if PROMPT_LENGTH in present and RESPONSE_LENGTH in present:
        return batch.batch[PROMPT_LENGTH].float(), batch.batch[RESPONSE_LENGTH].float()
    _require(batch, [keys.ATTENTION_MASK, keys.RESPONSES], "response_lengths")
    width = batch.batch[keys.RESPONSES].shape[-1]
    attention_mask = batch.batch[keys.ATTENTION_MASK]
    prompt_length = attention_mask[:, : attention_mask.shape[-1] - width].sum(-1).float()
    response_length = attention_mask[:, attention_mask.shape[-1] - width :].sum(-1).float()
    return prompt_length, response_length


def kept_rows(batch: DataProto, num_rows: int, device: torch.device) -> Tensor:
    """(B,) bool: True for real rows, False for rows flagged by ``is_pad`` (all True without it)."""
    if batch.batch is not None and IS_PAD in batch.batch:
        is_pad = batch.batch[IS_PAD]
    elif IS_PAD in batch.non_tensor_batch:
        is_pad = torch.as_tensor(np.asarray(batch.non_tensor_batch[IS_PAD], dtype=bool))
    else:
        return torch.ones(num_rows, dtype=torch.bool, device=device)
    if tuple(is_pad.shape) != (num_rows,):
        raise ValueError(
            f"{IS_PAD!r} must have shape ({num_rows},) (one flag per row), got {tuple(is_pad.shape)}"
        )
    return ~is_pad.to(device=device, dtype=torch.bool)


def masked_stats(values: Tensor, mask: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """(mean, max, min) of ``values`` over entries where ``mask`` is true; NaN when none are.

    Out-of-mask entries never reach the result (NaN there is ignored).

    Example:
        >>> masked_stats(torch.tensor([1., 5., float("nan")]), torch.tensor([True, True, False]))
        (tensor(3.), tensor(5.), tensor(1.))
        >>> masked_stats(torch.tensor([1., 5.]), torch.tensor([False, False]))[0]
        tensor(nan)
    """
    return compact_stats(values.masked_select(mask.bool()))


def compact_stats(kept: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """(mean, max, min) of a 1-D tensor of kept entries; NaN for an empty one."""
    kept = kept.to(torch.promote_types(kept.dtype, torch.float32))
    if kept.numel() == 0:
        nan = torch.full((), float("nan"), dtype=kept.dtype, device=kept.device)
        return nan, nan, nan
    lowest, highest = torch.aminmax(kept)
    return kept.mean(), highest, lowest


class TokenSelection:
    """The valid (row, token) entries of a (B, R) mask, found once and gathered per key.

    One ``nonzero`` pass over the mask, then an ``index_select`` per tensor: several times
    faster than a ``masked_select`` per key on a (1024, 4096) batch. On a GPU ``nonzero`` waits
    for the device once; these are logging-boundary statistics, computed once per step.
    """

    def __init__(self, mask: Tensor) -> None:
        self.index = mask.bool().flatten().nonzero().squeeze(1)  # (N,) flat positions

    def gather(self, values: Tensor) -> Tensor:
        """(N,) the entries of a (B, R) tensor at the selected positions."""
        return values.flatten().index_select(0, self.index)


def explained_variance(returns: Tensor, values: Tensor, mask: Tensor | None = None) -> Tensor:
    """1 − var(R − V) / (var(R) + 1e-5) over the tokens where ``mask`` is true (all tokens when
    None, e.g. already-gathered 1-D tensors); unbiased variances; NaN with fewer than 2 tokens.

    Example:
        >>> explained_variance(torch.tensor([1., 2., 3.]), torch.tensor([1., 2., 3.]))
        tensor(1.)
    """
    if mask is not None:
        returns, values = returns.masked_select(mask.bool()), values.masked_select(mask.bool())
    if returns.numel() < 2:
        return torch.full((), float("nan"), dtype=returns.dtype, device=returns.device)
    return 1.0 - torch.var(returns - values) / (torch.var(returns) + EXPLAINED_VAR_EPS)


def _family(prefix: str, values: Tensor, mask: Tensor) -> dict[str, Tensor]:
    return _named(prefix, masked_stats(values, mask))


def _named(prefix: str, stats: tuple[Tensor, Tensor, Tensor]) -> dict[str, Tensor]:
    mean, highest, lowest = stats
    return {f"{prefix}/mean": mean, f"{prefix}/max": highest, f"{prefix}/min": lowest}


def _length_family(
    prefix: str, lengths: Tensor, rows: Tensor, width: int, filled: Tensor | None = None
) -> dict[str, Tensor]:
    """mean / max / min of ``lengths`` over ``rows``; clip_ratio = share of ``rows`` whose
    ``filled`` length (default: ``lengths``) equals ``width``."""
    stats = _family(prefix, lengths, rows)
    filled = lengths if filled is None else filled
    stats[f"{prefix}/clip_ratio"] = masked_stats((filled == width).float(), rows)[0]
    return stats


def _non_tensor_family(batch: DataProto, key: str, prefix: str, kept: Tensor) -> dict[str, Tensor]:
    if key not in batch.non_tensor_batch:
        return {}
    counts = torch.as_tensor(np.asarray(batch.non_tensor_batch[key], dtype=np.float64))
    mean, highest, lowest = masked_stats(counts.to(kept.device), kept)
    return {f"{prefix}/min": lowest, f"{prefix}/max": highest, f"{prefix}/mean": mean}


def compute_data_metrics(batch: DataProto, use_critic: bool = True) -> dict[str, float]:
    """Score, reward, advantage, return, value and length statistics of one step's batch.

    Keys and denominators: see the module docstring. Needs tensor keys token_level_scores,
    token_level_rewards (B, R), advantages, returns (B, R), response_mask (B, R), prompts (B, P),
    responses (B, R), attention_mask (B, T) (or prompt_length / response_length (B,)), and values
    (B, R) when ``use_critic``. Rows flagged ``is_pad`` are excluded everywhere.

    Returns:
        name → Python float (one device→host transfer for the whole dict).

    Example:
        >>> from tensordict import TensorDict
        >>> from dataproto.protocol import DataProto
        >>> scores = torch.tensor([[0., 1.], [0., 0.]])  # row 1 is aborted (no response tokens)
        >>> mask = torch.tensor([[1, 1], [0, 0]])
        >>> batch = DataProto(TensorDict({
        ...     "token_level_scores": scores, "token_level_rewards": scores,
        ...     "advantages": scores, "returns": scores, "response_mask": mask,
        ...     "prompts": torch.ones(2, 1), "responses": torch.ones(2, 2),
        ...     "attention_mask": torch.cat([torch.ones(2, 1), mask], dim=1)}, [2]))
        >>> metrics = compute_data_metrics(batch, use_critic=False)
        >>> metrics["critic/score/mean"], metrics["response_length/mean"], metrics["response/aborted_ratio"]
        (1.0, 1.0, 0.5)
    """
    required = [keys.TOKEN_LEVEL_SCORES, keys.TOKEN_LEVEL_REWARDS, keys.ADVANTAGES, keys.RETURNS]
    required += [keys.RESPONSE_MASK, keys.PROMPTS, keys.RESPONSES]
    if use_critic:
        required.append(keys.VALUES)
    _require(batch, required, "compute_data_metrics (run the advantage stage first)")
    tensors = batch.batch
    prompt_length, response_length = response_lengths(batch)
    kept = kept_rows(batch, response_length.shape[0], response_length.device)  # (B,)
    non_aborted = kept & (response_length > 0)  # (B,)
    tokens = TokenSelection(tensors[keys.RESPONSE_MASK].bool() & kept[:, None])  # of (B, R)

    stats = _family("critic/score", tensors[keys.TOKEN_LEVEL_SCORES].sum(-1), non_aborted)
    stats |= _family("critic/rewards", tensors[keys.TOKEN_LEVEL_REWARDS].sum(-1), non_aborted)
    stats |= _named("critic/advantages", compact_stats(tokens.gather(tensors[keys.ADVANTAGES])))
    returns = tokens.gather(tensors[keys.RETURNS])  # (N,)
    stats |= _named("critic/returns", compact_stats(returns))
    if use_critic:
        values = tokens.gather(tensors[keys.VALUES])  # (N,)
        stats |= _named("critic/values", compact_stats(values))
        stats["critic/vf_explained_var"] = explained_variance(returns.float(), values.float())
    response_width = tensors[keys.RESPONSES].shape[-1]
    model_length = tensors[keys.RESPONSE_MASK].sum(-1).to(response_length.dtype)  # (B,)
    stats |= _length_family("response_length", model_length, kept, response_width, response_length)
    stats |= _length_family(
        "response_length_non_aborted", model_length, non_aborted, response_width, response_length
    )
    stats["response/aborted_ratio"] = masked_stats((response_length == 0).float(), kept)[0]
    stats |= _length_family("prompt_length", prompt_length, kept, tensors[keys.PROMPTS].shape[-1])
    stats |= _non_tensor_family(batch, keys.NUM_TURNS, "num_turns", kept)
    stats |= _non_tensor_family(batch, TOOL_CALL_COUNTS, "tool_call_counts", kept)
    return to_floats(stats)


def to_floats(stats: dict[str, Tensor]) -> dict[str, float]:
    """0-d tensors → Python floats with a single stack and one device→host copy.

    Example:
        >>> to_floats({"a": torch.tensor(1), "b": torch.tensor(0.5, dtype=torch.float64)})
        {'a': 1.0, 'b': 0.5}
    """
    if not stats:
        return {}
    device = next(iter(stats.values())).device
    stacked = torch.stack(
        [value.to(device=device, dtype=torch.float64) for value in stats.values()]
    )
    return dict(zip(stats.keys(), stacked.cpu().tolist()))
