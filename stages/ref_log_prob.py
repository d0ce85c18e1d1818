"""Stage 5, ref_log_prob: the frozen reference policy's log-probs of the sampled responses.

requires: ``input_ids`` / ``attention_mask`` / ``position_ids`` (B, T), ``responses`` (B, R),
``meta_info.temperature``. produces: ``ref_log_prob`` (B, R) float32.
Runs when the reference policy is used: ``algorithm.use_kl_in_reward`` or ``actor.use_kl_loss``.
"""

from __future__ import annotations

from dataproto import DataProto
from dataproto import keys as K
from stages.engine_calls import engine_delta, engine_inputs
from stages.stage import Stage, StageContext, tensor


def ref_log_prob_fn(batch: DataProto, ctx: StageContext) -> DataProto:
    """requires: the rollout's sequences; produces: ref_log_prob (B, R)."""
    return engine_delta(ctx, "ref", "compute_ref_log_prob", batch, K.REF_LOG_PROB)


def uses_reference_policy(config) -> bool:
    """``derived.use_reference_policy``: ``algorithm.use_kl_in_reward`` or ``actor.use_kl_loss``."""
    return bool(config.derived.use_reference_policy)


REF_LOG_PROB_STAGE = Stage(
    name="ref_log_prob",
    version=1,
    requires=engine_inputs(temperature=True),
    produces=(tensor(K.REF_LOG_PROB),),
    fn=ref_log_prob_fn,
    when=uses_reference_policy,
    reads_weights=True,
    engine="ref",
)
