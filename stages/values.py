"""Stage 6, values: the critic's value of the state before each response token.

requires: ``input_ids`` / ``attention_mask`` / ``position_ids`` (B, T), ``responses`` (B, R).
produces: ``values`` (B, R) float32 (padding positions computed like the others; callers mask
with ``response_mask``). Runs when the critic is in use (``critic.enable``, else gae).
"""

from __future__ import annotations

from dataproto import DataProto
from dataproto import keys as K
from stages.engine_calls import call_engine
from stages.stage import Stage, StageContext, tensor


def values_fn(batch: DataProto, ctx: StageContext) -> DataProto:
    """requires: the rollout's sequences; produces: values (B, R)."""
    out, metrics = call_engine(ctx, "critic", "compute_values", batch)
    ctx.metrics.update(metrics)
    return DataProto.from_dict({K.VALUES: out.batch[K.VALUES]})


def uses_critic(config) -> bool:
    return bool(config.derived.use_critic)


VALUES_STAGE = Stage(
    name="values",
    version=1,
    requires=(
        tensor(K.INPUT_IDS),
        tensor(K.ATTENTION_MASK),
        tensor(K.POSITION_IDS),
        tensor(K.RESPONSES),
    ),
    produces=(tensor(K.VALUES),),
    fn=values_fn,
    when=uses_critic,
    reads_weights=True,
    engine="critic",
)
