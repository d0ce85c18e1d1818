"""The one PPO update loop of the actor and the critic: epochs × mini-batches × micro-batches.

Each optimizer step covers one mini-batch of ``settings.mini_batch_size`` rows (rows shuffled
between mini-batches when ``settings.shuffle``). The mini-batch is cut into micro-batches by
``settings.micro``; each micro-batch's loss is a *partial* loss under the mini-batch's global
denominators (:func:`~stages.engines.batching.global_batch_info`), so the partial losses add up to
the mini-batch loss and their gradients accumulate unscaled (``scale_wrt_gas=False``); the
accumulation boundary is the last micro-batch, after which the optimizer steps once.

A role supplies only its per-micro-batch loss (:data:`MicroLoss`: forward through the engine, then
the loss and its metrics) and its metric names (``prefix`` and which metrics are partial sums).

Rows are taken by :func:`take_rows`: a view for a contiguous run of rows (mini-batches without
shuffling, micro-batches whose rows are consecutive), a gather otherwise. A view and a gather hold
the same values, so the update does not depend on which one a micro-batch gets.

Example (a view for consecutive rows, a gather otherwise):
    >>> rows = TensorDict({"x": torch.arange(6)}, batch_size=[6])
    >>> take_rows(rows, [2, 3, 4])["x"].data_ptr() == rows["x"][2:].data_ptr()
    True
    >>> take_rows(rows, [4, 1])["x"].tolist()
    [4, 1]
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field

import torch
from tensordict import TensorDict
from torch import Tensor

from dataproto import keys
from stages.algos.aggregation import GlobalBatchInfo
from stages.engines.batching import MicroBatching, global_batch_info, mini_batch_indices
from stages.metrics.metric import AggregationType, Metric

#: ``micro_loss(engine, micro, info) -> (loss, metrics)``: ``micro`` holds the b rows of one
#: micro-batch; ``loss`` is the 0-d partial loss under ``info`` (the mini-batch's denominators),
#: and ``metrics`` maps full metric names (``"<prefix>/..."``) to 0-d tensors of this micro-batch.
MicroLoss = Callable[[object, TensorDict, GlobalBatchInfo], tuple[Tensor, dict[str, Tensor]]]


@dataclass(frozen=True)
class PPOUpdateSettings:
    """One PPO update's walk over the batch (verl's actor.* / critic.* names).

    mini_batch_size: rows per optimizer step on this rank (ppo_mini_batch_size × n / d).
    epochs: ppo_epochs. shuffle / seed: shuffle rows between mini-batches (data_loader_seed).
    micro: the micro-batch grouping (ppo_micro_batch_size_per_gpu or the token budget).
    loss_scale_factor: seq-mean-token-sum-norm divisor (None = the padded response width).
    """

    mini_batch_size: int
    epochs: int = 1
    shuffle: bool = False
    seed: int = 42
    micro: MicroBatching = field(default_factory=MicroBatching)
    loss_scale_factor: float | None = None


def _consecutive_start(idx: Sequence[int] | Tensor) -> int | None:
    """The first row when ``idx`` is a non-empty run of consecutive ascending rows, else None."""
    rows = idx.tolist() if isinstance(idx, Tensor) else list(idx)
    if not rows:
        return None
    return rows[0] if rows == list(range(rows[0], rows[0] + len(rows))) else None


def take_rows(tensors: TensorDict, idx: Sequence[int] | Tensor) -> TensorDict:
    """The rows ``idx`` of ``tensors`` in that order: a view (no copy) when they are consecutive
    and ascending, a gather otherwise."""
    start = _consecutive_start(idx)
    if start is None:
        return tensors[idx]
    return tensors[start : start + len(idx)]


def gather_rows(tensors: TensorDict, idx: Sequence[int] | Tensor) -> TensorDict:
    """The rows ``idx`` of ``tensors``, always gathered into new storage (the reference path that
    :func:`take_rows` must match)."""
    return tensors[idx]


def ppo_update(
    engine,
    tensors: TensorDict,
    settings: PPOUpdateSettings,
    micro_loss: MicroLoss,
    *,
    prefix: str,
    summed: Collection[str] = frozenset(),
) -> dict[str, Metric]:
    """``settings.epochs`` × mini-batches of (B, ·) ``tensors``, one optimizer step each.

    tensors: the batch's B rows; the loop itself reads ``attention_mask`` (B, T) for the micro-batch
        plan and ``response_mask`` (B, R) for the denominators (N_tok = Σ response_mask of the
        mini-batch over all data-parallel ranks, N_seq = mini-batch rows × d); ``micro_loss`` reads
        the rest.
    micro_loss: the role's loss of one micro-batch (:data:`MicroLoss`), backpropagated as is.
    prefix: the role's metric prefix (``actor``, ``critic``) for ``grad_norm`` and ``lr``.
    summed: metric names whose micro-batch values are partial sums under the global denominators:
        added over a step's micro-batches (= the mini-batch value); the others are averaged.

    Returns metrics with one value per optimizer step (a :class:`Metric` averaged over steps):
    ``micro_loss``'s metrics reduced as above, ``<prefix>/grad_norm`` (before clipping) and
    ``<prefix>/lr``.
    """
    metrics: dict[str, Metric] = {}
    for rows in mini_batch_indices(
        len(tensors), settings.mini_batch_size, settings.epochs, settings.shuffle, settings.seed
    ):
        mini = take_rows(tensors, rows)
        info = global_batch_info(mini[keys.RESPONSE_MASK], settings.loss_scale_factor)
        plan = settings.micro.plan(mini[keys.ATTENTION_MASK])
        step_metrics: dict[str, list[Tensor]] = {}
        for position, idx in enumerate(plan):
            engine.set_gradient_accumulation_boundary(position == len(plan) - 1)
            loss, micro_metrics = micro_loss(engine, take_rows(mini, idx), info)
            engine.backward(loss, scale_wrt_gas=False)
            for name, value in micro_metrics.items():
                step_metrics.setdefault(name, []).append(value)
        grad_norm = optimizer_step(engine)
        record_step(metrics, step_metrics, engine, grad_norm, prefix, summed)
    return metrics


def optimizer_step(engine) -> float:
    """``engine.step()`` at the accumulation boundary; returns the global gradient norm (before
    clipping). ZeRO ≥ 1 reports it itself; at ZeRO-0 the full (already all-reduced) gradients are
    still on the parameters before the step, so it is computed from them."""
    norm = None
    if engine.zero_optimization_stage() == 0:
        grads = [p.grad.detach().float() for p in engine.module.parameters() if p.grad is not None]
        norm = (
            float(torch.linalg.vector_norm(torch.stack([g.norm() for g in grads])))
            if grads
            else 0.0
        )
    engine.step()
    reported = engine.get_global_grad_norm()
    return float(reported) if reported is not None else norm


def record_step(
    metrics: dict[str, Metric],
    step_metrics: dict[str, list[Tensor]],
    engine,
    grad_norm: float | None,
    prefix: str,
    summed: Collection[str] = frozenset(),
) -> None:
    """Reduce one optimizer step's micro-batch values (sum for ``summed`` names, mean otherwise)
    and append them, with ``<prefix>/grad_norm`` and ``<prefix>/lr``, to the update's metrics."""
    for name, values in step_metrics.items():
        stacked = torch.stack(values)
        total = stacked.sum() if name in summed else stacked.mean()
        metrics.setdefault(name, Metric(AggregationType.MEAN)).append(total.float())
    if grad_norm is not None:
        metrics.setdefault(f"{prefix}/grad_norm", Metric(AggregationType.MEAN)).append(grad_norm)
    metrics.setdefault(f"{prefix}/lr", Metric(AggregationType.MEAN)).append(
        float(engine.get_lr()[0])
    )
