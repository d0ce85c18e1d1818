"""Stage 8, update_critic: the clipped value-function update (critic in use).

requires: ``input_ids`` / ``attention_mask`` / ``position_ids`` (B, T), ``responses`` /
``response_mask`` / ``values`` / ``returns`` (B, R); optional ``rollout_rs_mask`` (decoupled
rollout rejection sampling: the response mask of the update in its place, as verl replaces
response_mask). produces: nothing in the batch (an empty delta); the critic's weights change.
Metrics ``critic/*`` (vf_loss, vf_clipfrac, vpred_mean, grad_norm, lr) reduced over the optimizer
steps. Writes weights, so never retried.
"""

from __future__ import annotations

from dataproto import DataProto
from dataproto import keys as K
from stages.engine_calls import engine_delta, engine_inputs
from stages.rollout_correction import with_rejection_mask
from stages.stage import Stage, StageContext, tensor
from stages.values import uses_critic


def update_critic_fn(batch: DataProto, ctx: StageContext) -> DataProto:
    """One critic update on the step batch; returns an empty delta."""
    return engine_delta(ctx, "critic", "update_critic", with_rejection_mask(batch))


UPDATE_CRITIC_STAGE = Stage(
    name="update_critic",
    version=1,
    requires=engine_inputs(K.RESPONSE_MASK, K.VALUES, K.RETURNS),
    produces=(),
    fn=update_critic_fn,
    when=uses_critic,
    optional=(tensor(K.ROLLOUT_RS_MASK),),
    config_keys=("critic",),
    reads_weights=True,
    writes_weights=True,
    engine="critic",
)
