"""The PPO step: every stage in run order (the stage table of docs/architecture.md) and the step's input batch.

``PPO_STAGES`` is what the step flow plans from: each stage's ``when`` decides whether it runs
for a config (and step), its ``requires`` / ``produces`` are checked before any work. Stage 10
(metrics) is computed by the flow after the step, since timing and throughput metrics cannot
come from a cached stage.

The reward stage is ``stages.reward.stage.REWARD_STAGE`` with two additions: the optional keys
``extra_info`` / ``__num_turns__`` / ``tool_rewards`` / ``reward_route`` are passed to it when the batch holds them
(the scorers read ``extra_info``; ``reward_route`` is the routing column named by
``data.reward_fn_key`` when that is not ``data_source``), and the reward extras it returns (e.g.
``acc``, ``pred``) are accepted as run-time-named non-tensor keys.

With ``algorithm.adv_estimator: remax`` two more stages run: ``baseline_rollout`` after the
rollout (one greedy response per prompt) and ``baseline_reward`` after the reward (its score,
``reward_baselines``); both are skipped for every other estimator.

Without bypass mode (``algorithm.rollout_correction.bypass_mode``) the rollout-correction stages
run after ``old_log_prob``: ``rollout_correction`` (the mismatch metrics) always, ``rollout_is``
(``rollout_is_weights``) and ``rollout_rs`` (``rollout_rs_mask``) when their option is set
(``stages/rollout_correction.py``).
"""

from __future__ import annotations

import hashlib
import uuid
from dataclasses import replace

import numpy as np
from tensordict import TensorDict

from dataproto import DataProto
from dataproto import keys as K
from stages.advantage import ADVANTAGE_STAGE
from stages.agent.trajectory import TOOL_REWARDS
from stages.balance import BALANCE_STAGE
from stages.old_log_prob import OLD_LOG_PROB_STAGE
from stages.ref_log_prob import REF_LOG_PROB_STAGE
from stages.reward.baseline import BASELINE_REWARD_STAGE
from stages.reward.stage import REWARD_STAGE
from stages.rollout import BASELINE_ROLLOUT_STAGE, PROMPT_KEYS, ROLLOUT_STAGE
from stages.rollout_correction import (
    ROLLOUT_CORRECTION_STAGE,
    ROLLOUT_IS_STAGE,
    ROLLOUT_RS_STAGE,
)
from stages.stage import Stage, meta, non_tensor, tensor
from stages.update_actor import UPDATE_ACTOR_STAGE
from stages.update_critic import UPDATE_CRITIC_STAGE
from stages.values import VALUES_STAGE

PPO_REWARD_STAGE = replace(
    REWARD_STAGE,
    optional=(
        non_tensor(K.EXTRA_INFO),
        non_tensor(K.NUM_TURNS),
        non_tensor(TOOL_REWARDS),
        non_tensor(K.REWARD_ROUTE),
        tensor(K.RM_SCORES),
        meta(K.REWARD_EXTRA_KEYS),
    ),
    extra_outputs=("non_tensor_batch",),
)

PPO_STAGES: tuple[Stage, ...] = (
    ROLLOUT_STAGE,
    BASELINE_ROLLOUT_STAGE,
    BALANCE_STAGE,
    PPO_REWARD_STAGE,
    BASELINE_REWARD_STAGE,
    OLD_LOG_PROB_STAGE,
    ROLLOUT_CORRECTION_STAGE,
    ROLLOUT_IS_STAGE,
    ROLLOUT_RS_STAGE,
    REF_LOG_PROB_STAGE,
    VALUES_STAGE,
    ADVANTAGE_STAGE,
    UPDATE_CRITIC_STAGE,
    UPDATE_ACTOR_STAGE,
)


#: the stages of one generation round of a step with dynamic sampling (DAPO), in run order: they
#: produce and score the samples before the groups are filtered
GENERATION_STAGES: tuple[Stage, ...] = (
    ROLLOUT_STAGE,
    BASELINE_ROLLOUT_STAGE,
    PPO_REWARD_STAGE,
    BASELINE_REWARD_STAGE,
)
#: the stages of such a step after the kept groups are assembled into the training batch
TRAINING_STAGES: tuple[Stage, ...] = tuple(s for s in PPO_STAGES if s not in GENERATION_STAGES)


def seeded_uids(rows: int, seed: int, step: int, gen_round: int = 1) -> np.ndarray:
    """(rows,) object array of uuid4-form strings derived from (seed, step, row): the same step
    of the same run gets the same prompt groups in every process, so its input artifact — and
    every cache key downstream — repeats when the run is trained again or resumed. Generation
    round ``gen_round`` > 1 of a step (dynamic sampling) hashes the round too, so no two rounds
    share a uid.

    >>> a, b = seeded_uids(2, 42, 1), seeded_uids(2, 42, 1)
    >>> bool((a == b).all()), a[0] != a[1], seeded_uids(1, 42, 2)[0] != a[0]
    (True, True, True)
    >>> seeded_uids(1, 42, 1, gen_round=2)[0] != a[0]
    True
    """
    out = []
    round_part = "" if gen_round == 1 else f"\nround{gen_round}"
    for row in range(rows):
        text = f"ppoflow-uid-v1\n{seed}\n{step}\n{row}{round_part}"
        digest = hashlib.sha256(text.encode()).digest()
        out.append(str(uuid.UUID(bytes=digest[:16], version=4)))
    return np.array(out, dtype=object)


def fresh_uids(rows: int) -> np.ndarray:
    """(rows,) object array of uuid4 strings, one prompt group id each."""
    return np.array([str(uuid.uuid4()) for _ in range(rows)], dtype=object)


def make_step_input(
    prompts: DataProto,
    n: int,
    *,
    temperature: float,
    global_steps: int,
    kl_coef: float | None = None,
    uid_seed: int | None = None,
    gen_round: int = 1,
) -> DataProto:
    """The step's input batch from a loader batch of B_p prompts: B = B_p · n rows.

    verl's order: a fresh uuid4 ``uid`` per prompt (any dataset uid is replaced; with
    ``uid_seed``, as training passes ``trainer.seed``, one derived from the seed, the step and
    the row instead: :func:`seeded_uids`), then
    ``repeat(n, interleave=True)`` (a prompt's n samples are adjacent). The (B_p, P) prompt tensors
    ``input_ids`` / ``attention_mask`` / ``position_ids`` are renamed ``prompt_*`` so the
    rollout's full-sequence tensors of the same names do not clash with them. meta_info:
    ``temperature`` (rollout.temperature), ``global_steps`` and, with KL in the reward,
    ``kl_coef`` (the controller's β for this step) and, in generation round ``gen_round`` > 1 of
    dynamic sampling, ``gen_round`` (the round's own uids and sampling seed). ``prompts`` is not
    modified.
    """
    tensors = {new: prompts.batch[old] for new, old in PROMPT_KEYS.items()}
    non_tensors = dict(prompts.non_tensor_batch)
    non_tensors[K.UID] = (
        fresh_uids(len(prompts))
        if uid_seed is None
        else seeded_uids(len(prompts), uid_seed, global_steps, gen_round)
    )
    meta_info = {K.TEMPERATURE: float(temperature), K.GLOBAL_STEPS: int(global_steps)}
    if gen_round != 1:
        meta_info[K.GEN_ROUND] = int(gen_round)
    if kl_coef is not None:
        meta_info[K.KL_COEF] = float(kl_coef)
    step_input = DataProto(
        batch=TensorDict(tensors, batch_size=[len(prompts)]),
        non_tensor_batch=non_tensors,
        meta_info=meta_info,
    )
    return step_input.repeat(n, interleave=True)
