"""Stage 1, rollout: one sampled response per row of the (already repeated) prompt batch.

requires: ``prompt_input_ids``, ``prompt_attention_mask``, ``prompt_position_ids`` (B, P) — the
step input's prompt tensors under their own names, so that the rollout's full-sequence
``input_ids`` / ``attention_mask`` / ``position_ids`` (B, T) never clash with them.
produces: ``prompts`` (B, P), ``responses`` / ``response_mask`` / ``rollout_log_probs`` (B, R),
``input_ids`` / ``attention_mask`` / ``position_ids`` (B, T = P + R).

The actor engine generates (``generate_sequences``). With ``rollout.name: hf`` that is HF
``generate`` on the actor's own module, so it always sees the newest weights; with ``vllm`` the
actor's vLLM engine, to which the actor sends its weights after each update (and after loading a
checkpoint) before the next rollout. Sampling settings come from ``actor_rollout_ref.rollout.*``.
The stage reads the actor's weights, writes none, and is idempotent, so the flow may retry it.
"""

from __future__ import annotations

from tensordict import TensorDict

from dataproto import DataProto
from dataproto import keys as K
from stages.engine_calls import call_engine
from stages.stage import Stage, StageContext, tensor

#: the rollout's output keys (what the engine returns and the stage keeps)
ROLLOUT_KEYS = (
    K.PROMPTS,
    K.RESPONSES,
    K.RESPONSE_MASK,
    K.INPUT_IDS,
    K.ATTENTION_MASK,
    K.POSITION_IDS,
    K.ROLLOUT_LOG_PROBS,
)
#: step-input name → the name the generation engine reads
PROMPT_KEYS = {
    K.PROMPT_INPUT_IDS: K.INPUT_IDS,
    K.PROMPT_ATTENTION_MASK: K.ATTENTION_MASK,
    K.PROMPT_POSITION_IDS: K.POSITION_IDS,
}


def generation_prompts(batch: DataProto) -> DataProto:
    """The (B, P) prompt tensors under the names the engine reads (tensors shared, not copied)."""
    tensors = {engine_name: batch.batch[name] for name, engine_name in PROMPT_KEYS.items()}
    return DataProto(
        batch=TensorDict(tensors, batch_size=[len(batch)]), non_tensor_batch={}, meta_info={}
    )


def rollout_fn(batch: DataProto, ctx: StageContext) -> DataProto:
    """requires: prompt_* (B, P); produces: :data:`ROLLOUT_KEYS`."""
    out, metrics = call_engine(
        ctx, "actor", "generate_sequences", generation_prompts(batch), validate=False
    )
    ctx.metrics.update(metrics)
    missing = [key for key in ROLLOUT_KEYS if key not in out.batch]
    if missing:
        raise KeyError(
            f"the actor's generate_sequences returned no {missing}; it returned "
            f"{sorted(out.batch.keys())}"
        )
    return DataProto(batch=out.batch.select(*ROLLOUT_KEYS), non_tensor_batch={}, meta_info={})


ROLLOUT_STAGE = Stage(
    name="rollout",
    version=1,
    requires=tuple(tensor(name) for name in PROMPT_KEYS),
    produces=tuple(tensor(name) for name in ROLLOUT_KEYS),
    fn=rollout_fn,
    config_keys=(
        "actor_rollout_ref.rollout.name",
        "actor_rollout_ref.rollout.temperature",
        "actor_rollout_ref.rollout.top_p",
        "actor_rollout_ref.rollout.top_k",
        "actor_rollout_ref.rollout.do_sample",
        "actor_rollout_ref.rollout.response_length",
    ),
    reads_weights=True,
    engine="actor",
)
