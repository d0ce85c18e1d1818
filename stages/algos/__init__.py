"""Pure PPO-family math: advantage estimators, policy/value losses, KL, loss aggregation,
batch balancing and micro-batching. No model, no Prefect, no I/O.

verl users port ``verl.trainer.ppo.core_algos`` code by importing the same names from here.
"""

from stages.algos.actor_loss import ActorLossTerms, compute_actor_loss
from stages.algos.advantages import (
    ADV_ESTIMATORS,
    AdvantageEstimator,
    AdvantageEstimatorFn,
    UnknownEstimatorError,
    gae_advantages,
    get_adv_estimator_fn,
    register_adv_est,
    reinforce_plus_plus_advantages,
    remax_advantages,
)
from stages.algos.advantages_group import (
    compute_gpg_outcome_advantage,
    compute_grpo_outcome_advantage,
    compute_grpo_passk_outcome_advantage,
    compute_grpo_vectorized_outcome_advantage,
    compute_opo_outcome_advantage,
    compute_reinforce_plus_plus_baseline_outcome_advantage,
    compute_rloo_outcome_advantage,
    compute_rloo_vectorized_outcome_advantage,
    group_mean_std,
)
from stages.algos.advantages_token import (
    compute_gae_advantage_return,
    compute_reinforce_plus_plus_outcome_advantage,
    compute_remax_outcome_advantage,
    gae_returns,
)
from stages.algos.aggregation import AGG_LOSS_MODES, GlobalBatchInfo, agg_loss, aggregate_loss
from stages.algos.balance import (
    balance_batch,
    calculate_workload,
    get_seqlen_balanced_partitions,
    greedy_partition,
    karmarkar_karp,
)
from stages.algos.compute_advantage import (
    compute_advantage,
    compute_advantage_inplace,
    compute_response_mask,
)
from stages.algos.entropy import compute_entropy_loss, entropy_from_logits
from stages.algos.kl import kl_penalty
from stages.algos.kl_control import (
    AdaptiveKLController,
    FixedKLController,
    apply_kl_penalty,
    get_kl_controller,
    kl_in_reward,
)
from stages.algos.masked import masked_mean, masked_sum, masked_var, masked_whiten
from stages.algos.micro_batch import restore_order, split_by_token_budget, split_fixed_size
from stages.algos.policy_loss_config import POLICY_LOSSES, register_policy_loss
from stages.algos.policy_losses import (
    compute_policy_loss_cispo,
    compute_policy_loss_geo_mean,
    compute_policy_loss_gpg,
    compute_policy_loss_gspo,
    compute_policy_loss_sapo,
    compute_policy_loss_vanilla,
    get_policy_loss_fn,
)
from stages.algos.policy_losses_cov import compute_policy_loss_clip_cov, compute_policy_loss_kl_cov
from stages.algos.value_loss import compute_value_loss

__all__ = [
    "ADV_ESTIMATORS",
    "AGG_LOSS_MODES",
    "POLICY_LOSSES",
    "ActorLossTerms",
    "AdaptiveKLController",
    "AdvantageEstimator",
    "AdvantageEstimatorFn",
    "FixedKLController",
    "GlobalBatchInfo",
    "UnknownEstimatorError",
    "agg_loss",
    "aggregate_loss",
    "apply_kl_penalty",
    "balance_batch",
    "calculate_workload",
    "compute_actor_loss",
    "compute_advantage",
    "compute_advantage_inplace",
    "compute_entropy_loss",
    "compute_gae_advantage_return",
    "compute_gpg_outcome_advantage",
    "compute_grpo_outcome_advantage",
    "compute_grpo_passk_outcome_advantage",
    "compute_grpo_vectorized_outcome_advantage",
    "compute_opo_outcome_advantage",
    "compute_policy_loss_cispo",
    "compute_policy_loss_clip_cov",
    "compute_policy_loss_geo_mean",
    "compute_policy_loss_gpg",
    "compute_policy_loss_gspo",
    "compute_policy_loss_kl_cov",
    "compute_policy_loss_sapo",
    "compute_policy_loss_vanilla",
    "compute_reinforce_plus_plus_baseline_outcome_advantage",
    "compute_reinforce_plus_plus_outcome_advantage",
    "compute_remax_outcome_advantage",
    "compute_response_mask",
    "compute_rloo_outcome_advantage",
    "compute_rloo_vectorized_outcome_advantage",
    "compute_value_loss",
    "entropy_from_logits",
    "gae_advantages",
    "gae_returns",
    "get_adv_estimator_fn",
    "get_kl_controller",
    "get_policy_loss_fn",
    "get_seqlen_balanced_partitions",
    "greedy_partition",
    "group_mean_std",
    "karmarkar_karp",
    "kl_in_reward",
    "kl_penalty",
    "masked_mean",
    "masked_sum",
    "masked_var",
    "masked_whiten",
    "register_adv_est",
    "register_policy_loss",
    "reinforce_plus_plus_advantages",
    "remax_advantages",
    "restore_order",
    "split_by_token_budget",
    "split_fixed_size",
]
