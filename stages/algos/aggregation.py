"""Reduce a (B, R) per-token loss matrix to the scalar that enters ``backward()``.

The loss of a mini-batch must not depend on how it is split into micro-batches (gradient
accumulation) and data-parallel ranks (gradient averaging). Each micro-batch therefore returns a
*partial* loss normalised by **global** counts of the mini-batch, times ``dp_size``:

==========================  ==============================================================
mode                        partial loss of one micro-batch
==========================  ==============================================================
token-mean                  Σ_tokens ℓ / N_tok · d
token-sum                   Σ_tokens ℓ · d
seq-mean-token-sum          Σ_rows (Σ_tokens ℓ) / N_seq · d
seq-mean-token-mean         Σ_rows (Σ_tokens ℓ / (n_row + 1e-8)) / N_seq · d
seq-mean-token-sum-norm     seq-mean-token-sum / S
==========================  ==============================================================

Σ_tokens runs over response_mask == 1; d = ``dp_size``; N_tok = ``batch_num_tokens`` (Σ mask over
the whole mini-batch, all DP ranks); N_seq = ``global_batch_size`` (sequences in the mini-batch);
S = ``loss_scale_factor`` (default: the padded width R of ``loss_mask``). A row with no valid token
contributes 0 to every numerator.

Composition (engine worker): rank r accumulates Σ_m partial(r, m) over its micro-batches, and DP
averages gradients over the d ranks, so the optimiser sees (1/d)·Σ_r Σ_m partial(r, m), which equals
the loss of the whole mini-batch computed at once with d = 1 and the same N_tok / N_seq / S.

Local defaults (only with d = 1): N_tok = local Σ mask, N_seq = local number of rows with at least
one valid token. With d > 1 the global count must be passed (ValueError otherwise). Note that verl's
trainer passes N_seq = all sequences of the mini-batch, while the local default counts only
non-empty rows; both are kept as in verl 0.9.1.

Deliberate difference from verl: when the denominator is 0 (an all-masked batch with local
counts, or a global count of 0), verl returns 0/0 = NaN, which poisons every weight through the
gradient. ppoflow divides by max(count, 1) instead: the loss is 0 and the gradient is 0. Non-empty
batches are unaffected (counts are integers ≥ 1). Masked-out entries never reach the result, even
when they hold NaN (masked sums use ``torch.where``).

Example (rows [1,2,3,4] all valid and [5,6,·,·] with 2 valid tokens):
    >>> loss = torch.tensor([[1., 2., 3., 4.], [5., 6., 7., 8.]])
    >>> mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]])
    >>> [round(agg_loss(loss, mask, mode).item(), 4) for mode in AGG_LOSS_MODES.names()]
    [4.0, 10.5, 2.625, 3.5, 21.0]
    >>> AGG_LOSS_MODES.names()
    ['seq-mean-token-mean', 'seq-mean-token-sum', 'seq-mean-token-sum-norm', 'token-mean', 'token-sum']
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, fields
from numbers import Integral
from typing import Any

import torch  # noqa: F401  (used by the doctest examples)
from torch import Tensor

from stages.algos.masked import MASK_EPS, masked_sum
from stages.registry import Registry

#: a count that may live on the device (all-reduced) or be a Python number
Count = int | float | Tensor


@dataclass(frozen=True)
class GlobalBatchInfo:
    """Global denominators of one mini-batch, shared by every micro-batch and loss term.

    Attributes:
        dp_size: data-parallel world size d; each partial loss is scaled by d because DP averages
            gradients over the d ranks.
        batch_num_tokens: Σ response_mask over the whole mini-batch (all ranks), for token-mean;
            None = the local mask sum (only valid with dp_size 1).
        global_batch_size: number of sequences in the mini-batch (verl: ppo_mini_batch_size ×
            rollout.n), for the seq-mean modes; None = local non-empty rows (dp_size 1 only).
        loss_scale_factor: divisor of seq-mean-token-sum-norm; None = padded response width R.
    """

    dp_size: int = 1
    batch_num_tokens: Count | None = None
    global_batch_size: Count | None = None
    loss_scale_factor: float | None = None

    def __post_init__(self) -> None:
        if (
            isinstance(self.dp_size, bool)
            or not isinstance(self.dp_size, Integral)
            or self.dp_size < 1
        ):
            raise ValueError(f"dp_size must be an int ≥ 1, got {self.dp_size!r}")
        object.__setattr__(self, "dp_size", int(self.dp_size))

    @classmethod
    def for_mini_batch(
        cls, response_mask: Tensor, dp_size: int = 1, loss_scale_factor: float | None = None
    ) -> GlobalBatchInfo:
        """The counts of a whole (B, R) mini-batch mask held in one place (no all-reduce needed).

        Example:
            >>> GlobalBatchInfo.for_mini_batch(torch.tensor([[1, 1, 0], [0, 0, 0]]))
            GlobalBatchInfo(dp_size=1, batch_num_tokens=tensor(2), global_batch_size=2, loss_scale_factor=None)
        """
        return cls(dp_size, response_mask.sum(), response_mask.shape[0], loss_scale_factor)

    @classmethod
    def coerce(cls, info: GlobalBatchInfo | Mapping[str, Any] | None) -> GlobalBatchInfo:
        """Accept the dataclass, verl's ``config.global_batch_info`` dict, or None (local counts)."""
        if info is None:
            return LOCAL_BATCH
        if isinstance(info, GlobalBatchInfo):
            return info
        if isinstance(info, Mapping):
            known = {f.name for f in fields(cls)}
            unknown = sorted(set(info) - known)
            if unknown:
                raise KeyError(
                    f"unknown global batch info keys {unknown}; expected a subset of {sorted(known)}"
                )
            return cls(**{k: v for k, v in info.items() if v is not None})
        raise TypeError(
            f"global batch info must be GlobalBatchInfo, a mapping or None, got {type(info).__name__}"
        )

    def as_kwargs(self) -> dict[str, Any]:
        """verl's keyword form: ``agg_loss(..., **info.as_kwargs())``."""
        return asdict(self)


#: local counts, dp_size 1 — the default when no global information is given
LOCAL_BATCH = GlobalBatchInfo()

#: aggregator(loss_mat (B, R), loss_mask (B, R), info) -> scalar
Aggregator = Callable[[Tensor, Tensor, GlobalBatchInfo], Tensor]


@dataclass(frozen=True)
class AggregationSpec:
    """One ``AGG_LOSS_MODES`` entry (a ``loss_agg_mode``).

    Attributes:
        fn: the aggregator, ``fn(loss_mat (B, R), loss_mask (B, R), info) -> scalar``.
        reads_loss_scale_factor: divides by ``info.loss_scale_factor`` (S), so the config's
            ``loss_scale_factor`` has an effect with this mode only.
    """

    fn: Aggregator
    reads_loss_scale_factor: bool = False


AGG_LOSS_MODES: Registry[AggregationSpec] = Registry("loss_agg_mode")


def register_aggregation(
    name: str, *, reads_loss_scale_factor: bool = False
) -> Callable[[Aggregator], Aggregator]:
    """Decorator adding an aggregator under ``name``; the function is returned unchanged."""

    def add(fn: Aggregator) -> Aggregator:
        AGG_LOSS_MODES.add(name, AggregationSpec(fn, reads_loss_scale_factor))
        return fn

    return add


def _at_least_one(count: Count) -> Count:
    """max(count, 1): an empty batch divides 0 by 1 (see the module note), never 0 by 0."""
    return count.clamp_min(1) if isinstance(count, Tensor) else max(count, 1)


def _require_global(count: Count | None, info: GlobalBatchInfo, name: str, mode: str) -> None:
    if count is None and info.dp_size > 1:
        raise ValueError(
            f"loss_agg_mode {mode!r} with dp_size={info.dp_size} needs the global {name} of the "
            f"mini-batch (summed over all DP ranks); pass {name}=... or GlobalBatchInfo({name}=...)"
        )


def _seq_mean(seq_losses: Tensor, loss_mask: Tensor, info: GlobalBatchInfo, mode: str) -> Tensor:
    """Σ_rows seq_losses / N_seq · d; empty rows must already hold 0 in ``seq_losses`` (B,)."""
    _require_global(info.global_batch_size, info, "global_batch_size", mode)
    if info.global_batch_size is None:
        num_seqs = (loss_mask.sum(dim=-1) > 0).sum()
    else:
        num_seqs = info.global_batch_size
    return seq_losses.sum() / _at_least_one(num_seqs) * info.dp_size


@register_aggregation("token-mean")
def _token_mean(loss_mat: Tensor, loss_mask: Tensor, info: GlobalBatchInfo) -> Tensor:
    _require_global(info.batch_num_tokens, info, "batch_num_tokens", "token-mean")
    num_tokens = loss_mask.sum() if info.batch_num_tokens is None else info.batch_num_tokens
    return masked_sum(loss_mat, loss_mask) / _at_least_one(num_tokens) * info.dp_size


@register_aggregation("token-sum")
def _token_sum(loss_mat: Tensor, loss_mask: Tensor, info: GlobalBatchInfo) -> Tensor:
    return masked_sum(loss_mat, loss_mask) * info.dp_size


@register_aggregation("seq-mean-token-sum")
def _seq_mean_token_sum(loss_mat: Tensor, loss_mask: Tensor, info: GlobalBatchInfo) -> Tensor:
    seq_sums = masked_sum(loss_mat, loss_mask, dim=-1)  # (B,)
    return _seq_mean(seq_sums, loss_mask, info, "seq-mean-token-sum")


@register_aggregation("seq-mean-token-mean")
def _seq_mean_token_mean(loss_mat: Tensor, loss_mask: Tensor, info: GlobalBatchInfo) -> Tensor:
    seq_means = masked_sum(loss_mat, loss_mask, dim=-1) / (loss_mask.sum(dim=-1) + MASK_EPS)  # (B,)
    return _seq_mean(seq_means, loss_mask, info, "seq-mean-token-mean")


@register_aggregation("seq-mean-token-sum-norm", reads_loss_scale_factor=True)
def _seq_mean_token_sum_norm(loss_mat: Tensor, loss_mask: Tensor, info: GlobalBatchInfo) -> Tensor:
    seq_sums = masked_sum(loss_mat, loss_mask, dim=-1)  # (B,)
    scale = loss_mask.shape[-1] if info.loss_scale_factor is None else info.loss_scale_factor
    return _seq_mean(seq_sums, loss_mask, info, "seq-mean-token-sum-norm") / scale


def aggregate_loss(
    loss_mat: Tensor,
    loss_mask: Tensor,
    loss_agg_mode: str,
    info: GlobalBatchInfo | Mapping[str, Any] | None = None,
) -> Tensor:
    """Scalar partial loss of one micro-batch (module table), with the denominators in ``info``.

    Args:
        loss_mat: (B, R) per-token loss.
        loss_mask: (B, R) response_mask, 1 = token counts (bool, int or float 0/1).
        loss_agg_mode: one of ``AGG_LOSS_MODES.names()``.
        info: global denominators; None = local counts with dp_size 1.

    Returns:
        () scalar in loss_mat's dtype, differentiable w.r.t. loss_mat.
    """
    if loss_mat.shape != loss_mask.shape:
        raise ValueError(
            f"loss_mat shape {tuple(loss_mat.shape)} and loss_mask shape {tuple(loss_mask.shape)} must match"
        )
    aggregate = AGG_LOSS_MODES.get(loss_agg_mode).fn
    return aggregate(loss_mat, loss_mask, GlobalBatchInfo.coerce(info))


def agg_loss(
    loss_mat: Tensor,
    loss_mask: Tensor,
    loss_agg_mode: str,
    dp_size: int = 1,
    batch_num_tokens: Count | None = None,
    global_batch_size: Count | None = None,
    loss_scale_factor: float | None = None,
) -> Tensor:
    """verl's keyword signature for :func:`aggregate_loss` (same formulas, see the module docstring).

    Example (dp_size 2, this rank holds 3 of the 6 tokens of the mini-batch):
        >>> agg_loss(torch.tensor([[1., 2., 3.]]), torch.ones(1, 3), "token-mean", dp_size=2, batch_num_tokens=6)
        tensor(2.)
    """
    info = GlobalBatchInfo(dp_size, batch_num_tokens, global_batch_size, loss_scale_factor)
    return aggregate_loss(loss_mat, loss_mask, loss_agg_mode, info)
