"""Stage 1, rollout: one sampled response per row of the (already repeated) prompt batch.

requires: ``prompt_input_ids``, ``prompt_attention_mask``, ``prompt_position_ids`` (B, P) — the
step input's prompt tensors under their own names, so that the rollout's full-sequence
``input_ids`` / ``attention_mask`` / ``position_ids`` (B, T) never clash with them.
produces: ``prompts`` (B, P), ``responses`` / ``response_mask`` / ``rollout_log_probs`` (B, R),
``input_ids`` / ``attention_mask`` / ``position_ids`` (B, T = P + R); with partial rollouts also
``rollout_policy_versions`` (B, R), each token's policy version. The artifact stores the
response side only: ``prompts`` and the (B, T) tensors are the prompt tensors ‖ the response's
(:data:`ROLLOUT_DERIVED`), left out when they equal that and rebuilt when the delta is loaded.

The actor engine generates (``generate_sequences``). With ``rollout.name: hf`` that is HF
``generate`` on the actor's own module, so it always sees the newest weights; with ``vllm`` the
actor's vLLM engine, to which the actor sends its weights after each update (and after loading a
checkpoint) before the next rollout. Sampling settings come from ``actor_rollout_ref.rollout.*``.
The stage reads the actor's weights, writes none, and is idempotent, so the flow may retry it.

Stage 1b, baseline_rollout (only when the estimator's registry entry declares
``needs_greedy_baseline``, as ``remax``'s does): ReMax's greedy baseline. One greedy
(``do_sample=False``) response per prompt group — the rows sharing a ``uid``, which
:func:`stages.ppo.make_step_input` made from one prompt — repeated to every row of the group.

requires: ``prompt_*`` (B, P), ``uid`` (B,).
produces: ``baseline_responses`` / ``baseline_response_mask`` (B, R), equal on the rows of a group.

The baseline_reward stage (``stages.reward.baseline``) scores it into ``reward_baselines``. verl
0.9.1 appends the greedy copies to the sampled request; here they are a second call of the actor
with the same weights (``generate_sequences(greedy=True)``), in a stage of their own, so the
rollout's declaration and cache key stay those of every other estimator.
"""

from __future__ import annotations

import numpy as np
import torch
from tensordict import TensorDict
from torch import Tensor

from dataproto import DataProto
from dataproto import keys as K
from stages.agent.agents import AGENT_NAME_KEY
from stages.agent.rollout import agent_rollout, tool_modules, uses_agent_loop
from stages.agent.scoring import score_whole_rollout, scores_in_rollout, scoring_keys
from stages.algos.advantages import ADV_ESTIMATORS
from stages.engine_calls import run_engine
from stages.stage import (
    DerivedKey,
    Stage,
    StageContext,
    meta,
    non_tensor,
    round_purpose,
    step_seed,
    tensor,
)

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
#: what the engine returns only sometimes, kept when it does: a partial rollout's token versions
#: (flows/partial_rollout.py)
ROLLOUT_OPTIONAL_KEYS = (K.ROLLOUT_POLICY_VERSIONS,)
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


def sampling_seed(ctx: StageContext, batch: DataProto) -> int:
    """The rollout's seed in this step: ``step_seed(trainer.seed, step, "rollout")`` (in
    generation round r > 1 of dynamic sampling, purpose ``rollout/round<r>``:
    :func:`~stages.stage.round_purpose`), so the step samples the same responses in an
    uninterrupted run, a resumed one and a re-run."""
    return step_seed(ctx.config.trainer.seed, ctx.step, round_purpose("rollout", batch))


def rollout_fn(batch: DataProto, ctx: StageContext) -> DataProto:
    """requires: prompt_* (B, P); produces: :data:`ROLLOUT_KEYS`. Sampling is seeded per step
    (:func:`sampling_seed`). When a row runs a tool-using agent loop the batch is rolled out by
    :func:`stages.agent.rollout.agent_rollout` (multi-turn; it also adds the agent columns of
    :mod:`stages.agent.trajectory`). With ``reward.score_in_rollout`` the delta also holds
    ``rm_scores`` and the reward extras (:mod:`stages.agent.scoring`)."""
    if uses_agent_loop(batch, ctx.config):
        return agent_rollout(batch, generation_prompts(batch), ctx)
    rollout = _one_call_rollout(batch, ctx)
    if scores_in_rollout(ctx.config):
        return rollout | score_whole_rollout(batch, rollout, ctx)
    return rollout


def _one_call_rollout(batch: DataProto, ctx: StageContext) -> DataProto:
    """One ``generate_sequences`` call for the whole batch (single-turn rows)."""
    out = run_engine(
        ctx,
        "actor",
        "generate_sequences",
        generation_prompts(batch),
        validate=False,
        seed=sampling_seed(ctx, batch),
    )
    missing = [key for key in ROLLOUT_KEYS if key not in out.batch]
    if missing:
        raise KeyError(
            f"the actor's generate_sequences returned no {missing}; it returned "
            f"{sorted(out.batch.keys())}"
        )
    kept = [*ROLLOUT_KEYS, *(key for key in ROLLOUT_OPTIONAL_KEYS if key in out.batch)]
    return DataProto(batch=out.batch.select(*kept), non_tensor_batch={}, meta_info={})


def _full_input_ids(t) -> Tensor:
    """(B, T) prompt ids ‖ response ids."""
    return torch.cat([t[K.PROMPT_INPUT_IDS], t[K.RESPONSES]], dim=1)


def _full_attention_mask(t) -> Tensor:
    """(B, T) prompt mask ‖ response mask, in the prompt mask's dtype."""
    prompt_mask = t[K.PROMPT_ATTENTION_MASK]
    return torch.cat([prompt_mask, t[K.RESPONSE_MASK].to(prompt_mask.dtype)], dim=1)


def _full_position_ids(t) -> Tensor:
    """(B, T) prompt positions, then the last prompt position + 1, + 2, … (verl's)."""
    prompt_pos, width = t[K.PROMPT_POSITION_IDS], t[K.RESPONSES].shape[1]
    offsets = torch.arange(1, width + 1, device=prompt_pos.device, dtype=prompt_pos.dtype)
    return torch.cat([prompt_pos, prompt_pos[:, -1:] + offsets], dim=1)


#: the rollout's keys its artifact leaves out: each is its prompt tensor ‖ the response side
ROLLOUT_DERIVED = {
    K.PROMPTS: DerivedKey((tensor(K.PROMPT_INPUT_IDS),), lambda t: t[K.PROMPT_INPUT_IDS]),
    K.INPUT_IDS: DerivedKey((tensor(K.PROMPT_INPUT_IDS), tensor(K.RESPONSES)), _full_input_ids),
    K.ATTENTION_MASK: DerivedKey(
        (tensor(K.PROMPT_ATTENTION_MASK), tensor(K.RESPONSE_MASK)), _full_attention_mask
    ),
    K.POSITION_IDS: DerivedKey(
        (tensor(K.PROMPT_POSITION_IDS), tensor(K.RESPONSES)), _full_position_ids
    ),
}


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
        "actor_rollout_ref.rollout.ignore_eos",
        "actor_rollout_ref.rollout.response_length",
        "actor_rollout_ref.rollout.max_num_seqs",
        "actor_rollout_ref.rollout.seed",
        "actor_rollout_ref.rollout.dtype",
        *(
            f"actor_rollout_ref.rollout.multi_turn.{name}"
            for name in (
                "enable",
                "max_assistant_turns",
                "max_user_turns",
                "max_parallel_calls",
                "max_tool_response_length",
                "tool_response_truncate_side",
                "format",
                "sandbox.timeout_s",
                "sandbox.memory_mb",
                "sandbox.output_bytes",
                "sandbox.allow_network",
            )
        ),
        "actor_rollout_ref.rollout.agent.default_agent_loop",
    ),
    file_keys=(
        "actor_rollout_ref.model.tokenizer_path",
        "actor_rollout_ref.rollout.multi_turn.tool_config_path",
        "actor_rollout_ref.rollout.multi_turn.interaction_config_path",
    ),
    seeded=True,
    reads_weights=True,
    engine="actor",
    derived=ROLLOUT_DERIVED,
    optional=(
        non_tensor(AGENT_NAME_KEY),
        non_tensor(K.EXTRA_INFO),
        non_tensor(K.DATA_SOURCE),
        non_tensor(K.REWARD_ROUTE),
        non_tensor(K.REWARD_MODEL),
        non_tensor(K.UID),
        non_tensor(K.RAW_PROMPT),
        meta(K.GEN_ROUND),
    ),
    extra_outputs=("batch", "non_tensor_batch", "meta_info"),
    code_modules=tool_modules,
    keys_for_config=scoring_keys,
)


# --- ReMax's greedy baseline --------------------------------------------------------------------

#: the baseline rollout's output keys
BASELINE_KEYS = (K.BASELINE_RESPONSES, K.BASELINE_RESPONSE_MASK)


def needs_greedy_baseline(config) -> bool:
    """Whether the step generates a greedy baseline: the estimator's registry entry declares
    ``needs_greedy_baseline`` (of the built-in ones, ``remax``)."""
    return ADV_ESTIMATORS.get(config.algorithm.adv_estimator).needs_greedy_baseline


def prompt_groups(uid: np.ndarray) -> tuple[Tensor, Tensor]:
    """The prompt groups of a batch: rows that share a ``uid``, in order of first appearance.

    Args:
        uid: (B,) group ids.

    Returns:
        first_rows: (G,) int64, the first row of each group (G = number of distinct uids).
        group_of_row: (B,) int64, each row's group, so ``x[first_rows][group_of_row]`` repeats
            a per-group value to every row of its group.

    Example:
        >>> first, group = prompt_groups(np.array(["b", "b", "a", "b", "a"], dtype=object))
        >>> first.tolist(), group.tolist()
        ([0, 2], [0, 0, 1, 0, 1])
    """
    _, first, inverse = np.unique(uid, return_index=True, return_inverse=True)
    order = np.argsort(first, kind="stable")  # groups by first appearance
    rank = np.empty_like(order)
    rank[order] = np.arange(len(order))
    return torch.from_numpy(first[order]).long(), torch.from_numpy(rank[inverse]).long()


def check_same_prompt(batch: DataProto, first_rows: Tensor, group_of_row: Tensor) -> None:
    """Raise ``ValueError`` unless every row holds its group's prompt (same ids and mask): one
    greedy response per uid is only a baseline for rows that share the prompt."""
    for name in (K.PROMPT_INPUT_IDS, K.PROMPT_ATTENTION_MASK):
        rows = batch.batch[name]  # (B, P)
        differs = (rows != rows[first_rows][group_of_row]).any(dim=-1)  # (B,)
        if bool(differs.any()):
            row = int(differs.nonzero()[0, 0])
            raise ValueError(
                f"rows {int(first_rows[group_of_row[row]])} and {row} share uid "
                f"{batch.non_tensor_batch[K.UID][row]!r} but differ in {name!r}; a uid must name "
                "one prompt (stages.ppo.make_step_input repeats each prompt under one uid)"
            )


def baseline_rollout_fn(batch: DataProto, ctx: StageContext) -> DataProto:
    """requires: prompt_* (B, P), uid (B,); produces: :data:`BASELINE_KEYS` (B, R).

    Generates G greedy responses (one per prompt group) and repeats each to its group's rows.
    """
    first_rows, group_of_row = prompt_groups(batch.non_tensor_batch[K.UID])
    check_same_prompt(batch, first_rows, group_of_row)
    prompts = generation_prompts(batch)
    greedy_input = DataProto(
        batch=prompts.batch[first_rows], non_tensor_batch={}, meta_info={}
    )  # (G, P)
    out = run_engine(ctx, "actor", "generate_sequences", greedy_input, validate=False, greedy=True)
    if len(out) != len(first_rows):
        raise ValueError(
            f"the actor's greedy generate_sequences returned {len(out)} rows for "
            f"{len(first_rows)} prompts"
        )
    return DataProto.from_dict(
        {
            K.BASELINE_RESPONSES: out.batch[K.RESPONSES][group_of_row],  # (B, R)
            K.BASELINE_RESPONSE_MASK: out.batch[K.RESPONSE_MASK][group_of_row],  # (B, R)
        }
    )


BASELINE_ROLLOUT_STAGE = Stage(
    name="baseline_rollout",
    version=1,
    requires=(*(tensor(name) for name in PROMPT_KEYS), non_tensor(K.UID)),
    produces=tuple(tensor(name) for name in BASELINE_KEYS),
    fn=baseline_rollout_fn,
    when=needs_greedy_baseline,
    config_keys=(
        "actor_rollout_ref.rollout.name",
        "actor_rollout_ref.rollout.response_length",
        "actor_rollout_ref.rollout.ignore_eos",
        "actor_rollout_ref.rollout.max_num_seqs",
        "actor_rollout_ref.rollout.dtype",
    ),
    file_keys=("actor_rollout_ref.model.tokenizer_path",),
    reads_weights=True,
    engine="actor",
)
