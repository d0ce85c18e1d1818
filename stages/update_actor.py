"""Stage 9, update_actor: the PPO policy update, after the critic warm-up.

requires: ``input_ids`` / ``attention_mask`` / ``position_ids`` (B, T), ``responses`` /
``response_mask`` / ``old_log_probs`` / ``advantages`` (B, R), ``meta_info.temperature``;
optional ``ref_log_prob`` (the KL loss), ``rollout_is_weights`` (multiplied into the per-token
policy loss) and ``rollout_rs_mask`` (the response mask of the update, in place of
``response_mask``) from decoupled rollout correction. produces: nothing in the batch (an empty
delta); the actor's weights change and the next rollout sees them. Metrics ``actor/*`` (pg_loss,
pg_clipfrac, ppo_kl, grad_norm, lr, kl_loss, …) reduced over the optimizer steps; in bypass mode
with rollout correction (``stages/rollout_correction.py`` ``bypass_correction``) the loss is bypass
mode's and the micro-batches' ``rollout_corr/*`` metrics are added.

Runs when ``global_step > trainer.critic_warmup`` (verl skips the actor update while the critic
warms up). Writes weights, so never retried.
"""

from __future__ import annotations

from dataproto import DataProto
from dataproto import keys as K
from stages.engine_calls import engine_delta, engine_inputs
from stages.rollout_correction import actor_update_batch
from stages.stage import Stage, StageContext, tensor


def update_actor_fn(batch: DataProto, ctx: StageContext) -> DataProto:
    """One actor update on the step batch; returns an empty delta."""
    actor = ctx.config.actor_rollout_ref.actor
    if actor.use_kl_loss and K.REF_LOG_PROB not in batch.batch:
        raise KeyError(
            "actor.use_kl_loss needs 'ref_log_prob' in the batch (the ref_log_prob stage); "
            "the batch lacks it"
        )
    return engine_delta(ctx, "actor", "update_actor", actor_update_batch(batch, ctx.config))


def after_critic_warmup(config, step: int) -> bool:
    """verl: the actor updates once ``global_step > trainer.critic_warmup``."""
    return step > config.trainer.critic_warmup


UPDATE_ACTOR_STAGE = Stage(
    name="update_actor",
    version=1,
    requires=engine_inputs(K.RESPONSE_MASK, K.OLD_LOG_PROBS, K.ADVANTAGES, temperature=True),
    produces=(),
    fn=update_actor_fn,
    when=after_critic_warmup,
    optional=(tensor(K.REF_LOG_PROB), tensor(K.ROLLOUT_IS_WEIGHTS), tensor(K.ROLLOUT_RS_MASK)),
    config_keys=("actor_rollout_ref.actor", "algorithm.rollout_correction"),
    reads_weights=True,
    writes_weights=True,
    engine="actor",
)
