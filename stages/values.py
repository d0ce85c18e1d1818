"""Stage 6, values: the critic's value of the state before each response token.

requires: ``input_ids`` / ``attention_mask`` / ``position_ids`` (B, T), ``responses`` (B, R).
produces: ``values`` (B, R) float32 (padding positions computed like the others; callers mask
with ``response_mask``). Runs when the critic is in use (``critic.enable``, else gae).
"""

from __future__ import annotations

from dataproto import DataProto
from dataproto import keys as K
from stages.engine_calls import engine_delta, engine_inputs
from stages.stage import Stage, StageContext, tensor


def values_fn(batch: DataProto, ctx: StageContext) -> DataProto:
    """requires: the rollout's sequences; produces: values (B, R)."""
    return engine_delta(ctx, "critic", "compute_values", batch, K.VALUES)


def uses_critic(config) -> bool:
    """Whether the run has a critic (``derived.use_critic``: ``critic.enable`` when set, else
    whether the estimator's registry entry needs values); values and update_critic run only then."""
    return bool(config.derived.use_critic)


VALUES_STAGE = Stage(
    name="values",
    version=1,
    requires=engine_inputs(),
    produces=(tensor(K.VALUES),),
    fn=values_fn,
    when=uses_critic,
    reads_weights=True,
    engine="critic",
)
