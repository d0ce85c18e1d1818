"""The actor and reference workers: log-probs of a rollout batch, and the PPO update.

Both take and return DataProto batches and hold no orchestration state. The model is a DeepSpeed
engine (actor) or a frozen module / ZeRO-3 engine (reference), see ``deepspeed_setup``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from tensordict import TensorDict
from torch import Tensor

from dataproto import DataProto, keys
from stages.algos.actor_loss import compute_actor_loss
from stages.algos.aggregation import aggregate_loss
from stages.algos.micro_batch import restore_order
from stages.engines.batching import MicroBatching, global_batch_info, mini_batch_indices
from stages.engines.dispatch import real_rows_mask
from stages.metrics.metric import AggregationType, Metric

#: actor metrics whose micro-batch values are partial sums under global denominators
SUMMED_LOSS_METRICS = frozenset({"actor/pg_loss", "actor/entropy", "actor/kl_loss"})


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


#: the tensors a log-prob forward pass reads
FORWARD_KEYS = (keys.INPUT_IDS, keys.ATTENTION_MASK, keys.POSITION_IDS, keys.RESPONSES)


def _rows(tensors: TensorDict, idx: list[int]) -> TensorDict:
    """The rows ``idx`` of ``tensors``: a view for a contiguous run, a gather otherwise."""
    if idx and idx == list(range(idx[0], idx[0] + len(idx))):
        return tensors[idx[0] : idx[0] + len(idx)]
    return tensors[idx]


def _forward_logprobs(model, batch: TensorDict, temperature: float, entropy: bool):
    """``model``: a :class:`ResponseLogProbModel`, or the DeepSpeed engine wrapping one."""
    return model(
        batch[keys.INPUT_IDS],
        batch[keys.ATTENTION_MASK],
        batch[keys.POSITION_IDS],
        batch[keys.RESPONSES].shape[1],
        temperature=temperature,
        calculate_entropy=entropy,
    )


@torch.no_grad()
def compute_log_prob(
    module,
    batch: DataProto,
    micro: MicroBatching,
    *,
    calculate_entropy: bool = False,
    loss_agg_mode: str = "token-mean",
) -> tuple[DataProto, dict[str, float]]:
    """(B, R) log-probs of the responses at ``meta_info["temperature"]`` (default 1.0).

    Returns a delta with ``old_log_probs`` (and ``entropys`` when asked) plus, with entropy, the
    metric ``actor/entropy`` = agg_loss(entropys, response_mask, loss_agg_mode) over the whole
    batch (dp 1, local denominators), as verl computes it in this stage.
    """
    tensors = batch.batch
    temperature = float(batch.meta_info.get(keys.TEMPERATURE, 1.0))
    plan = micro.plan(tensors[keys.ATTENTION_MASK])
    inputs = tensors.select(*FORWARD_KEYS)  # gather only what the forward reads
    outputs = [
        _forward_logprobs(module, _rows(inputs, idx), temperature, calculate_entropy)
        for idx in plan
    ]
    logprobs = restore_order([o[0] for o in outputs], plan)
    delta = {keys.OLD_LOG_PROBS: logprobs}
    metrics: dict[str, float] = {}
    if calculate_entropy:
        entropys = restore_order([o[1] for o in outputs], plan)
        delta[keys.ENTROPYS] = entropys
        mask = tensors[keys.RESPONSE_MASK]
        mask = mask * real_rows_mask(batch)[:, None].to(device=mask.device, dtype=mask.dtype)
        metrics["actor/entropy"] = float(aggregate_loss(entropys, mask, loss_agg_mode, None))
    return DataProto(batch=TensorDict(delta, batch_size=[len(logprobs)]), meta_info={}), metrics


def update_actor(
    engine,
    batch: DataProto,
    settings: PPOUpdateSettings,
    loss_config: Any,
    *,
    needs_entropy: bool = False,
) -> dict[str, Metric]:
    """The PPO policy update: ``epochs`` × mini-batches, one optimizer step each.

    Each micro-batch's loss (``compute_actor_loss``) is a partial sum under the mini-batch's global
    denominators, so gradients accumulate unscaled and the step follows the last micro-batch.
    Metrics: loss terms summed over micro-batches (then averaged over mini-batches); clip
    fractions and ppo_kl averaged over micro-batches; grad_norm and lr once per optimizer step.
    """
    tensors = batch.batch
    temperature = float(batch.meta_info.get(keys.TEMPERATURE, 1.0))
    metrics: dict[str, Metric] = {}
    for rows in mini_batch_indices(
        len(tensors), settings.mini_batch_size, settings.epochs, settings.shuffle, settings.seed
    ):
        mini = tensors[rows]
        info = global_batch_info(mini[keys.RESPONSE_MASK], settings.loss_scale_factor)
        plan = settings.micro.plan(mini[keys.ATTENTION_MASK])
        step_metrics: dict[str, list[Tensor]] = {}
        for position, idx in enumerate(plan):
            engine.set_gradient_accumulation_boundary(position == len(plan) - 1)
            micro = _rows(mini, idx)
            log_prob, entropy = _forward_logprobs(engine, micro, temperature, needs_entropy)
            loss, micro_metrics = compute_actor_loss(
                log_prob,
                micro[keys.OLD_LOG_PROBS],
                micro[keys.ADVANTAGES],
                micro[keys.RESPONSE_MASK],
                loss_config,
                entropy=entropy,
                ref_log_prob=micro.get(keys.REF_LOG_PROB, None),
                global_batch_info=info,
            )
            engine.backward(loss, scale_wrt_gas=False)
            for name, value in micro_metrics.items():
                step_metrics.setdefault(name, []).append(value)
        grad_norm = optimizer_step(engine)
        record_step(metrics, step_metrics, engine, grad_norm)
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
    prefix: str = "actor",
) -> None:
    """Reduce one optimizer step's micro-batch values and append them to the run of the update."""
    for name, values in step_metrics.items():
        total = (
            torch.stack(values).sum() if name in SUMMED_LOSS_METRICS else torch.stack(values).mean()
        )
        metrics.setdefault(name, Metric(AggregationType.MEAN)).append(total.float())
    if grad_norm is not None:
        metrics.setdefault(f"{prefix}/grad_norm", Metric(AggregationType.MEAN)).append(grad_norm)
    metrics.setdefault(f"{prefix}/lr", Metric(AggregationType.MEAN)).append(
        float(engine.get_lr()[0])
    )
