"""Stages 4a–4c, decoupled rollout correction: the rollout's log-probs against old_log_probs.

verl's ``compute_rollout_correction_and_add_to_batch``, run on the driver once per batch after
``old_log_prob`` whenever bypass mode is off (``algorithm.rollout_correction.bypass_mode``; every
rollout returns ``rollout_log_probs``). Three stages, each producing a fixed set of keys, since a
key has one producer in a step and a union never overwrites a key (``stages/stage.py``): the
rejection mask is a key of its own rather than a new ``response_mask``.

- ``rollout_correction`` (whenever decoupled): the mismatch metrics (``rollout_corr/kl``, ppl, χ²,
  …) of ``old_log_probs`` against ``rollout_log_probs``; produces nothing. verl's metrics-only mode,
  on by default.
- ``rollout_is`` (with ``rollout_is``): produces ``rollout_is_weights`` (B, R), the detached IS
  weights of ``rollout_is`` / ``rollout_is_threshold`` / ``rollout_is_batch_normalize`` (the batch
  mean), with the ``rollout_corr/rollout_is_*`` metrics. The actor multiplies its per-token policy
  loss by them.
- ``rollout_rs`` (with ``rollout_rs``): produces ``rollout_rs_mask`` (B, R), ``response_mask`` less
  the rejected tokens, with the ``rollout_corr/rollout_rs_*`` metrics.

Both are computed on the original ``response_mask``. The stages after them use the rejection mask
as their response mask when the batch holds it (:func:`response_mask_of`,
:func:`with_rejection_mask`): ``advantage`` (the KL in the reward and the estimator; the scores
of rejected rows still enter GRPO's group statistics, as in verl), ``update_critic`` and
``update_actor`` (every loss term and its denominators).

Bypass mode runs none of these: the ``update_actor`` stage hands the actor the settings
(``meta_info["rollout_correction"]``, :func:`bypass_correction`) when they change the loss, and
each micro-batch's loss computes the correction from the current log π_θ
(``stages/algos/policy_losses_bypass.py``).
"""

from __future__ import annotations

from typing import Any

from tensordict import TensorDict
from torch import Tensor

from dataproto import DataProto
from dataproto import keys as K
from stages.algos.rollout_correction import (
    RolloutCorrectionSettings,
    importance_weights,
    mismatch_metrics,
    prefixed,
    rejection_mask,
)
from stages.stage import Stage, StageContext, tensor

#: what every rollout-correction stage reads
INPUTS = (tensor(K.OLD_LOG_PROBS), tensor(K.ROLLOUT_LOG_PROBS), tensor(K.RESPONSE_MASK))
RC = "algorithm.rollout_correction"


def correction_settings(config: Any) -> RolloutCorrectionSettings:
    """The run config's ``algorithm.rollout_correction`` as the math's settings."""
    correction = config.algorithm.rollout_correction
    return RolloutCorrectionSettings(
        rollout_is=correction.rollout_is,
        rollout_is_threshold=correction.rollout_is_threshold,
        rollout_is_batch_normalize=correction.rollout_is_batch_normalize,
        rollout_rs=correction.rollout_rs,
        rollout_rs_threshold=correction.rollout_rs_threshold,
        loss_type=correction.loss_type,
    )


def decoupled(config: Any) -> bool:
    """Not bypass mode: old_log_probs are recomputed, so π_old and π_rollout are two policies."""
    return not config.algorithm.rollout_correction.bypass_mode


def uses_rollout_is(config: Any) -> bool:
    """Decoupled mode with importance weights (``rollout_is`` set)."""
    return decoupled(config) and config.algorithm.rollout_correction.rollout_is is not None


def uses_rollout_rs(config: Any) -> bool:
    """Decoupled mode with rejection sampling (``rollout_rs`` set)."""
    return decoupled(config) and config.algorithm.rollout_correction.rollout_rs is not None


def _floats(metrics: dict[str, Tensor]) -> dict[str, float]:
    return {name: float(value) for name, value in prefixed(metrics).items()}


def _log_ratio(batch: DataProto) -> Tensor:
    """(B, R) log π_old − log π_rollout."""
    return batch.batch[K.OLD_LOG_PROBS] - batch.batch[K.ROLLOUT_LOG_PROBS]


def rollout_correction_fn(batch: DataProto, ctx: StageContext) -> DataProto:
    """requires: old_log_probs, rollout_log_probs, response_mask; produces nothing; metrics
    ``rollout_corr/*`` of the mismatch."""
    tensors = batch.batch
    metrics = mismatch_metrics(
        tensors[K.OLD_LOG_PROBS], tensors[K.ROLLOUT_LOG_PROBS], tensors[K.RESPONSE_MASK]
    )
    ctx.metrics.update(_floats(metrics))
    return DataProto.from_dict({})


def rollout_is_fn(batch: DataProto, ctx: StageContext) -> DataProto:
    """requires: as rollout_correction; produces: rollout_is_weights (B, R)."""
    settings = correction_settings(ctx.config)
    weights, metrics = importance_weights(
        _log_ratio(batch),
        batch.batch[K.RESPONSE_MASK],
        settings.rollout_is,
        settings.rollout_is_threshold,
        settings.rollout_is_batch_normalize,
    )
    ctx.metrics.update(_floats(metrics))
    return DataProto.from_dict({K.ROLLOUT_IS_WEIGHTS: weights})


def rollout_rs_fn(batch: DataProto, ctx: StageContext) -> DataProto:
    """requires: as rollout_correction; produces: rollout_rs_mask (B, R)."""
    settings = correction_settings(ctx.config)
    mask, metrics = rejection_mask(
        _log_ratio(batch),
        batch.batch[K.RESPONSE_MASK],
        settings.rollout_rs or (),
        settings.rollout_rs_threshold or (),
    )
    ctx.metrics.update(_floats(metrics))
    return DataProto.from_dict({K.ROLLOUT_RS_MASK: mask})


def response_mask_of(batch: DataProto) -> Tensor:
    """(B, R) the mask the update uses: ``rollout_rs_mask`` when the batch holds it, else
    ``response_mask``."""
    tensors = batch.batch
    return tensors[K.ROLLOUT_RS_MASK] if K.ROLLOUT_RS_MASK in tensors else tensors[K.RESPONSE_MASK]


def with_rejection_mask(batch: DataProto) -> DataProto:
    """``batch`` with ``response_mask`` := ``rollout_rs_mask`` (that key dropped) when it holds
    one, else ``batch`` itself; a new DataProto sharing the tensors, the input unchanged.

    >>> import torch
    >>> batch = DataProto.from_dict({"response_mask": torch.ones(1, 2, dtype=torch.long),
    ...                              "rollout_rs_mask": torch.tensor([[1, 0]])})
    >>> out = with_rejection_mask(batch)
    >>> out.batch["response_mask"].tolist(), sorted(out.batch.keys()), batch.batch["response_mask"].tolist()
    ([[1, 0]], ['response_mask'], [[1, 1]])
    """
    if batch.batch is None or K.ROLLOUT_RS_MASK not in batch.batch:
        return batch
    tensors = {name: value for name, value in batch.batch.items() if name != K.ROLLOUT_RS_MASK}
    tensors[K.RESPONSE_MASK] = batch.batch[K.ROLLOUT_RS_MASK]
    return DataProto(
        batch=TensorDict(tensors, batch_size=batch.batch.batch_size),
        non_tensor_batch=dict(batch.non_tensor_batch),
        meta_info=dict(batch.meta_info),
    )


def bypass_correction(config: Any) -> dict[str, Any] | None:
    """Bypass mode's settings for the actor's loss (plain values), or None: not bypass mode, or
    nothing that changes the loss (no weights, no rejection, ``ppo_clip``: the configured
    ``policy_loss.loss_mode`` then runs against the rollout's log-probs as before)."""
    if decoupled(config):
        return None
    settings = correction_settings(config)
    return settings.as_dict() if settings.changes_the_loss else None


def actor_update_batch(batch: DataProto, config: Any) -> DataProto:
    """What the actor's update gets: :func:`with_rejection_mask`, plus bypass mode's settings in
    ``meta_info["rollout_correction"]`` when :func:`bypass_correction` gives some."""
    out = with_rejection_mask(batch)
    correction = bypass_correction(config)
    if correction is None:
        return out
    return DataProto(
        batch=out.batch,
        non_tensor_batch=dict(out.non_tensor_batch),
        meta_info={**out.meta_info, K.ROLLOUT_CORRECTION: correction},
    )


ROLLOUT_CORRECTION_STAGE = Stage(
    name="rollout_correction",
    version=1,
    requires=INPUTS,
    produces=(),
    fn=rollout_correction_fn,
    when=decoupled,
)

ROLLOUT_IS_STAGE = Stage(
    name="rollout_is",
    version=1,
    requires=INPUTS,
    produces=(tensor(K.ROLLOUT_IS_WEIGHTS),),
    fn=rollout_is_fn,
    when=uses_rollout_is,
    config_keys=(
        f"{RC}.rollout_is",
        f"{RC}.rollout_is_threshold",
        f"{RC}.rollout_is_batch_normalize",
    ),
)

ROLLOUT_RS_STAGE = Stage(
    name="rollout_rs",
    version=1,
    requires=INPUTS,
    produces=(tensor(K.ROLLOUT_RS_MASK),),
    fn=rollout_rs_fn,
    when=uses_rollout_rs,
    config_keys=(f"{RC}.rollout_rs", f"{RC}.rollout_rs_threshold"),
)
