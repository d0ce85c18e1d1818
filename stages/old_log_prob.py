"""Stage 4, old_log_prob: the actor's log-probs of the sampled responses before the update.

requires: ``input_ids`` / ``attention_mask`` / ``position_ids`` (B, T), ``responses`` /
``response_mask`` / ``rollout_log_probs`` (B, R), ``meta_info.temperature``.
produces: ``old_log_probs`` (B, R) float32; when it recomputes them, also ``entropys`` (B, R)
float32.

- Bypass mode (``algorithm.rollout_correction.bypass_mode``): ``old_log_probs`` is a copy of
  ``rollout_log_probs`` (no model call; the actor's update measures ``actor/entropy``
  instead). Null, ppoflow's default, is
  filled in at config load: true with ``ppoflow.schedule=one_step_off`` (verl's recipe sets it),
  else from the rollout backend's registry entry: true for ``hf``, whose log-probs come from the
  actor's own module before the step's update (the same quantity, up to float rounding), false
  for ``vllm`` (its own kernels).
- Otherwise the actor recomputes them at the rollout temperature, with per-token entropy, and the
  stage reports ``actor/entropy`` = agg_loss(entropys, response_mask, actor.loss_agg_mode,
  loss_scale_factor) over the whole batch (dp 1, local denominators), as verl does. The entropys
  themselves stay in the stage's artifact (the sample page's ``entropy`` channel,
  flows/runs/sample_page.py), where verl pops them; no later stage reads them.
"""

from __future__ import annotations

from dataproto import DataProto
from dataproto import keys as K
from stages.algos.aggregation import agg_loss
from stages.engine_calls import engine_inputs, run_engine, tensor_delta
from stages.stage import Stage, StageContext, tensor


def is_bypass(config) -> bool:
    return bool(config.algorithm.rollout_correction.bypass_mode)


def old_log_prob_fn(batch: DataProto, ctx: StageContext) -> DataProto:
    """requires: the rollout's tensors and meta temperature; produces: old_log_probs (B, R)."""
    if is_bypass(ctx.config):
        return DataProto.from_dict({K.OLD_LOG_PROBS: batch.batch[K.ROLLOUT_LOG_PROBS].clone()})
    out = run_engine(ctx, "actor", "compute_log_prob", batch)
    actor = ctx.config.actor_rollout_ref.actor
    entropy = agg_loss(
        out.batch[K.ENTROPYS],  # (B, R)
        batch.batch[K.RESPONSE_MASK],
        actor.loss_agg_mode,
        loss_scale_factor=actor.loss_scale_factor,
    )
    ctx.metrics["actor/entropy"] = float(entropy)
    return tensor_delta(out, K.OLD_LOG_PROBS, K.ENTROPYS)


OLD_LOG_PROB_STAGE = Stage(
    name="old_log_prob",
    version=2,
    requires=engine_inputs(K.RESPONSE_MASK, K.ROLLOUT_LOG_PROBS, temperature=True),
    produces=(tensor(K.OLD_LOG_PROBS),),
    fn=old_log_prob_fn,
    config_keys=(
        "algorithm.rollout_correction.bypass_mode",
        "actor_rollout_ref.actor.loss_agg_mode",
        "actor_rollout_ref.actor.loss_scale_factor",
    ),
    extra_outputs=("batch",),  # entropys, when it recomputes
    reads_weights=True,
    engine="actor",
)
