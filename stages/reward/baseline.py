"""The baseline_reward stage: ReMax's baseline, the score of each prompt's greedy response.

Runs only with ``algorithm.adv_estimator: remax``, after the reward stage, so ``ppoflow rerun
--from reward`` with another reward function recomputes the baselines with it.

requires: ``baseline_responses`` / ``baseline_response_mask`` (B, R) (the baseline_rollout
stage), the step input's ``prompt_input_ids`` / ``prompt_attention_mask`` (B, P), ``uid`` /
``data_source`` / ``reward_model`` (B,); optional ``extra_info`` / ``reward_route`` (B,).
produces: ``reward_baselines`` (B,) float32.

Each prompt group (rows sharing a ``uid``) is scored once: its greedy sequence (prompt ‖ greedy
response) goes through the reward stage's own route (:func:`stages.reward.stage.compute_reward`:
the reward loop, the reward model, or their sum, per ``reward.*``), and the baseline is verl's
``Σ_t rm_scores`` of that sequence — its score, or 0 for an empty greedy response (which gets no
score placed; ``stages.reward.placement``). Every row of the group gets its group's baseline.

Metric: ``reward/baseline_mean``, the mean baseline over the prompt groups (each prompt once).
The reward extras of the greedy rows are dropped, as in verl.
"""

from __future__ import annotations

import torch
from tensordict import TensorDict

from dataproto import DataProto
from dataproto import keys as K
from stages.reward.settings import CONFIG_KEYS, FILE_KEYS, settings_from_config
from stages.reward.stage import compute_reward
from stages.rollout import needs_greedy_baseline, prompt_groups
from stages.stage import Stage, StageContext, non_tensor, tensor

BASELINE_METRIC = "reward/baseline_mean"
#: the non-tensor keys the scorers read, copied to the greedy rows when present
SCORER_NON_TENSORS = (K.UID, K.DATA_SOURCE, K.REWARD_MODEL, K.EXTRA_INFO, K.REWARD_ROUTE)


def greedy_sequences(batch: DataProto, rows: torch.Tensor) -> DataProto:
    """The greedy sequences of ``rows`` (G,) in the layout the reward stage scores.

    Tensors (G rows): ``prompts`` (G, P), ``responses`` (G, R) = baseline_responses,
    ``input_ids`` (G, P + R) = prompts ‖ responses, ``attention_mask`` (G, P + R) = prompt mask ‖
    baseline_response_mask. Non-tensors: :data:`SCORER_NON_TENSORS` that the batch holds.
    """
    prompts = batch.batch[K.PROMPT_INPUT_IDS][rows]  # (G, P)
    prompt_mask = batch.batch[K.PROMPT_ATTENTION_MASK][rows]  # (G, P)
    responses = batch.batch[K.BASELINE_RESPONSES][rows]  # (G, R)
    response_mask = batch.batch[K.BASELINE_RESPONSE_MASK][rows].to(prompt_mask.dtype)  # (G, R)
    tensors = {
        K.PROMPTS: prompts,
        K.RESPONSES: responses,
        K.INPUT_IDS: torch.cat([prompts, responses], dim=1),
        K.ATTENTION_MASK: torch.cat([prompt_mask, response_mask], dim=1),
    }
    index = rows.numpy()
    non_tensors = {
        key: batch.non_tensor_batch[key][index]
        for key in SCORER_NON_TENSORS
        if key in batch.non_tensor_batch
    }
    return DataProto(
        batch=TensorDict(tensors, batch_size=[len(rows)]),
        non_tensor_batch=non_tensors,
        meta_info={},
    )


def baseline_reward_fn(batch: DataProto, ctx: StageContext) -> DataProto:
    """requires: the keys in the module docstring; produces: ``reward_baselines`` (B,)."""
    first_rows, group_of_row = prompt_groups(batch.non_tensor_batch[K.UID])
    scored, _ = compute_reward(
        greedy_sequences(batch, first_rows), settings_from_config(ctx.config), ctx.engines
    )
    greedy_scores = scored.batch[K.RM_SCORES].sum(-1).float()  # (G,)
    ctx.metrics[BASELINE_METRIC] = float(greedy_scores.mean())
    return DataProto.from_dict({K.REWARD_BASELINES: greedy_scores[group_of_row]})  # (B,)


BASELINE_REWARD_STAGE = Stage(
    name="baseline_reward",
    version=1,
    requires=(
        tensor(K.BASELINE_RESPONSES),
        tensor(K.BASELINE_RESPONSE_MASK),
        tensor(K.PROMPT_INPUT_IDS),
        tensor(K.PROMPT_ATTENTION_MASK),
        non_tensor(K.UID),
        non_tensor(K.DATA_SOURCE),
        non_tensor(K.REWARD_MODEL),
    ),
    produces=(tensor(K.REWARD_BASELINES),),
    fn=baseline_reward_fn,
    when=needs_greedy_baseline,
    optional=(non_tensor(K.EXTRA_INFO), non_tensor(K.REWARD_ROUTE)),
    config_keys=CONFIG_KEYS,
    file_keys=FILE_KEYS,
)
