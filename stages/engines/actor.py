"""The actor and reference workers: log-probs of a rollout batch, and the PPO update.

Both take and return DataProto batches and hold no orchestration state. The model is a DeepSpeed
engine (actor) or a frozen module / ZeRO-3 engine (reference), see ``deepspeed_setup``.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from tensordict import TensorDict
from torch import Tensor

from dataproto import DataProto, keys
from stages.algos.actor_loss import ActorLossTerms, compute_actor_loss
from stages.algos.aggregation import GlobalBatchInfo, aggregate_loss
from stages.algos.micro_batch import restore_order
from stages.algos.rollout_correction import RolloutCorrectionSettings
from stages.engines.batching import MicroBatching
from stages.engines.dispatch import real_rows_mask
from stages.engines.ppo_update import PPOUpdateSettings, ppo_update, take_rows
from stages.metrics.metric import Metric

#: actor metrics whose micro-batch values are partial sums under global denominators
SUMMED_LOSS_METRICS = frozenset({"actor/pg_loss", "actor/entropy", "actor/kl_loss"})


#: the tensors a log-prob forward pass reads
FORWARD_KEYS = (keys.INPUT_IDS, keys.ATTENTION_MASK, keys.POSITION_IDS, keys.RESPONSES)


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
        _forward_logprobs(module, take_rows(inputs, idx), temperature, calculate_entropy)
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
    """The PPO policy update: ``epochs`` × mini-batches, one optimizer step each
    (``ppo_update``).

    Each micro-batch's loss (``compute_actor_loss``) is a partial sum under the mini-batch's global
    denominators, so gradients accumulate unscaled and the step follows the last micro-batch.
    Metrics: loss terms summed over micro-batches (then averaged over mini-batches); clip
    fractions and ppo_kl averaged over micro-batches; grad_norm and lr once per optimizer step.

    Rollout correction: a ``rollout_is_weights`` tensor in the batch (decoupled mode) multiplies
    each micro-batch's per-token policy loss; bypass mode's settings in
    ``meta_info["rollout_correction"]`` make the policy loss bypass mode's, and its
    ``rollout_corr/*`` metrics are averaged over micro-batches like the clip fractions.

    Entropy: with ``needs_entropy`` each micro-batch's forward also gives the token entropy and
    ``actor/entropy`` is logged (summed over micro-batches under the global denominators, then
    averaged over mini-batches); with ``entropy_coeff`` 0 it is measured only, detached from the
    loss (no gradient flows through it).
    """
    correction = batch.meta_info.get(keys.ROLLOUT_CORRECTION)
    micro_loss = functools.partial(
        actor_micro_loss,
        temperature=float(batch.meta_info.get(keys.TEMPERATURE, 1.0)),
        needs_entropy=needs_entropy,
        entropy_in_loss=ActorLossTerms.resolve(loss_config).entropy_coeff != 0,
        loss_config=loss_config,
        rollout_correction=None
        if correction is None
        else RolloutCorrectionSettings.resolve(correction),
    )
    return ppo_update(
        engine, batch.batch, settings, micro_loss, prefix="actor", summed=SUMMED_LOSS_METRICS
    )


def actor_micro_loss(
    engine,
    micro: TensorDict,
    info: GlobalBatchInfo,
    *,
    temperature: float,
    needs_entropy: bool,
    loss_config: Any,
    rollout_correction: RolloutCorrectionSettings | None = None,
    entropy_in_loss: bool = True,
) -> tuple[Tensor, dict[str, Tensor]]:
    """The policy loss of one micro-batch of b rows (``compute_actor_loss`` under ``info``): the
    (b, R) log-probs (and entropies when asked) at ``temperature`` through ``engine``, against
    ``old_log_probs``, ``advantages``, ``response_mask`` and, when present, ``ref_log_prob`` and
    ``rollout_is_weights``; bypass mode's loss with ``rollout_correction``. Without
    ``entropy_in_loss`` the entropies are detached: measured for ``actor/entropy`` only."""
    log_prob, entropy = _forward_logprobs(engine, micro, temperature, needs_entropy)
    if entropy is not None and not entropy_in_loss:
        entropy = entropy.detach()
    return compute_actor_loss(
        log_prob,
        micro[keys.OLD_LOG_PROBS],
        micro[keys.ADVANTAGES],
        micro[keys.RESPONSE_MASK],
        loss_config,
        entropy=entropy,
        ref_log_prob=micro.get(keys.REF_LOG_PROB, None),
        rollout_is_weights=micro.get(keys.ROLLOUT_IS_WEIGHTS, None),
        global_batch_info=info,
        rollout_correction=rollout_correction,
    )
