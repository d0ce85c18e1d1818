"""Stage 7, advantage: the reward tensor, the KL-in-reward penalty, then the advantage estimator.

requires: ``rm_scores`` / ``response_mask`` (B, R), ``uid`` (B,).
optional: ``old_log_probs`` / ``ref_log_prob`` (B, R) and ``meta_info.kl_coef`` (KL in reward),
``values`` (B, R) (gae), ``reward_baselines`` (B,) (remax: the baseline_reward stage's scores of
the greedy responses; without them the remax estimator fails naming the key),
``rollout_rs_mask`` (B, R) (rollout rejection sampling: it is the response mask of every step
below, as verl replaces response_mask; a rejected row's score still enters the group statistics
of the GRPO family, its advantages are 0).
produces: ``token_level_scores``, ``token_level_rewards``, ``advantages``, ``returns`` (B, R).

1. token_level_scores = rm_scores.
2. With ``algorithm.use_kl_in_reward``: token_level_rewards = scores − β·kl(old, ref)·mask, β =
   ``meta_info.kl_coef`` (the run's KL controller value for this step, set in the step input, so
   it is part of the cache key); metrics ``actor/reward_kl_penalty`` (batch mean of per-row masked
   KL means) and ``actor/reward_kl_penalty_coeff`` (β). The stage is pure: the flow updates the
   controller from ``actor/reward_kl_penalty`` after the step (so a cache hit updates it too).
   Otherwise token_level_rewards = token_level_scores.
3. advantages, returns = the ``algorithm.adv_estimator`` estimator (``compute_advantage``).
"""

from __future__ import annotations

from tensordict import TensorDict

from dataproto import DataProto
from dataproto import keys as K
from stages.algos.compute_advantage import compute_advantage
from stages.algos.kl_control import kl_penalized_rewards
from stages.rollout_correction import response_mask_of
from stages.stage import Stage, StageContext, meta, non_tensor, tensor

KL_METRIC = "actor/reward_kl_penalty"
KL_COEFF_METRIC = "actor/reward_kl_penalty_coeff"


def _need(batch: DataProto, key: str, why: str):
    if key not in batch.batch:
        raise KeyError(f"the advantage stage needs {key!r} for {why}; the batch lacks it")
    return batch.batch[key]


def rewards_with_kl(batch: DataProto, config) -> tuple[object, dict[str, float]]:
    """(token_level_rewards (B, R), metrics): scores − β·kld with β = meta_info.kl_coef."""
    algorithm = config.algorithm
    scores = batch.batch[K.RM_SCORES]  # (B, R)
    if not algorithm.use_kl_in_reward:
        return scores, {}
    if K.KL_COEF not in batch.meta_info:
        raise KeyError(
            "algorithm.use_kl_in_reward needs meta_info['kl_coef'] (the KL controller's β) in "
            "the step input; flows/train.py sets it"
        )
    beta = float(batch.meta_info[K.KL_COEF])
    rewards, current_kl = kl_penalized_rewards(
        scores,
        _need(batch, K.OLD_LOG_PROBS, "the KL in the reward"),
        _need(batch, K.REF_LOG_PROB, "the KL in the reward (the ref_log_prob stage)"),
        response_mask_of(batch),
        beta=beta,
        kl_penalty=algorithm.kl_penalty,
    )
    return rewards, {KL_METRIC: float(current_kl), KL_COEFF_METRIC: beta}


def advantage_fn(batch: DataProto, ctx: StageContext) -> DataProto:
    """requires: rm_scores, response_mask, uid; produces: the four (B, R) tensors above."""
    rewards, metrics = rewards_with_kl(batch, ctx.config)
    inputs = {K.TOKEN_LEVEL_REWARDS: rewards, K.RESPONSE_MASK: response_mask_of(batch)}
    for key in (K.VALUES, K.REWARD_BASELINES):
        if key in batch.batch:
            inputs[key] = batch.batch[key]
    estimator_input = DataProto(
        batch=TensorDict(inputs, batch_size=[len(batch)]),
        non_tensor_batch={K.UID: batch.non_tensor_batch[K.UID]},
        meta_info={},
    )
    algorithm = ctx.config.algorithm
    estimate = compute_advantage(estimator_input, algorithm.adv_estimator, config=algorithm)
    ctx.metrics.update(metrics)
    return DataProto.from_dict(
        {
            K.TOKEN_LEVEL_SCORES: batch.batch[K.RM_SCORES],
            K.TOKEN_LEVEL_REWARDS: rewards,
            K.ADVANTAGES: estimate.batch[K.ADVANTAGES],
            K.RETURNS: estimate.batch[K.RETURNS],
        }
    )


ADVANTAGE_STAGE = Stage(
    name="advantage",
    version=1,
    requires=(tensor(K.RM_SCORES), tensor(K.RESPONSE_MASK), non_tensor(K.UID)),
    produces=(
        tensor(K.TOKEN_LEVEL_SCORES),
        tensor(K.TOKEN_LEVEL_REWARDS),
        tensor(K.ADVANTAGES),
        tensor(K.RETURNS),
    ),
    fn=advantage_fn,
    optional=(
        tensor(K.OLD_LOG_PROBS),
        tensor(K.REF_LOG_PROB),
        tensor(K.VALUES),
        tensor(K.REWARD_BASELINES),
        meta(K.KL_COEF),
        tensor(K.ROLLOUT_RS_MASK),
    ),
    config_keys=(
        "algorithm.adv_estimator",
        "algorithm.gamma",
        "algorithm.lam",
        "algorithm.norm_adv_by_std_in_grpo",
        "algorithm.use_kl_in_reward",
        "algorithm.kl_penalty",
    ),
)
