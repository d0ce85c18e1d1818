"""Advantage estimators, looked up by name; each entry declares what it needs.

``ADV_ESTIMATORS`` maps a name (verl's ``algorithm.adv_estimator`` values) to an
:class:`EstimatorSpec`: the function, with one signature, so callers never branch on the name::

    estimator(token_level_rewards (B, R), response_mask (B, R), *,
              index: (B,) uid array | None = None, values: (B, R) | None = None,
              reward_baselines: (B,) | None = None, config=None) -> (advantages (B, R), returns (B, R))

and the needs the rest of ppoflow reads instead of the name: ``needs_values`` (a critic is used
and trained), ``group_based`` (the baseline comes from the rollout.n samples of one prompt),
``needs_greedy_baseline`` (the ReMax baseline stages run) and ``min_group_size`` (the smallest
rollout.n it is defined for). Register a new one with :func:`register_adv_est` (verl's decorator,
with the needs as keywords), e.g. in a module named in ``ppoflow.plugins``.

The registry and its decorator live in :mod:`stages.algos.advantage_registry`; each built-in
estimator is registered where it is defined, in :mod:`stages.algos.advantages_token` (gae,
reinforce_plus_plus, remax) and :mod:`stages.algos.advantages_group` (grpo, grpo_vectorized,
grpo_passk, rloo, rloo_vectorized, opo, gpg, reinforce_plus_plus_baseline). This module imports
both, so importing it gives the full registry; it holds the lookups and verl's names.

``config`` is anything with verl's attribute names (``gamma``, ``lam``,
``norm_adv_by_std_in_grpo``) or a ``Mapping``; absent fields take their defaults
(:mod:`stages.algos.config_view`). An estimator that needs an input it did not get raises a
``KeyError`` naming itself and the batch key.

verl compatibility: ``AdvantageEstimator``, ``register_adv_est`` and ``get_adv_estimator_fn`` behave as
in ``verl.trainer.ppo.core_algos``; a verl-style custom estimator (``**kwargs`` in its signature)
registered with ``register_adv_est`` is called by :func:`~stages.algos.compute_advantage.compute_advantage`
with the same keywords verl's trainer passes. The verl-named math functions live in
:mod:`stages.algos.advantages_group` and :mod:`stages.algos.advantages_token`.

Example:
    >>> import numpy as np, torch
    >>> grpo = ADV_ESTIMATORS.get("grpo")
    >>> grpo.group_based, grpo.needs_values, ADV_ESTIMATORS.get("gae").needs_values
    (True, False, True)
    >>> advantages, _ = grpo.fn(torch.tensor([[1.], [0.]]), torch.ones(2, 1), index=np.array(["a", "a"]))
    >>> advantages.squeeze(-1)
    tensor([ 0.7071, -0.7071])
"""

from __future__ import annotations

from enum import Enum

from stages.algos import advantages_group as group
from stages.algos import advantages_token as token
from stages.algos.advantage_registry import (
    ADV_ESTIMATORS,
    AdvantageEstimatorFn,
    EstimatorSpec,
    estimator_name,
    register_adv_est,
)
from stages.algos.advantages_token import (
    gae_advantages,
    reinforce_plus_plus_advantages,
    remax_advantages,
)


class AdvantageEstimator(str, Enum):  # noqa: UP042 (verl: str(member) is "AdvantageEstimator.GAE")
    """verl's estimator names (``algorithm.adv_estimator``); members compare equal to their strings."""

    GAE = "gae"
    GRPO = "grpo"
    REINFORCE_PLUS_PLUS = "reinforce_plus_plus"
    REINFORCE_PLUS_PLUS_BASELINE = "reinforce_plus_plus_baseline"
    REMAX = "remax"
    RLOO = "rloo"
    OPO = "opo"
    GRPO_PASSK = "grpo_passk"
    GPG = "gpg"
    RLOO_VECTORIZED = "rloo_vectorized"
    GRPO_VECTORIZED = "grpo_vectorized"
    OPTIMAL_TOKEN_BASELINE = "optimal_token_baseline"
    TIR_OPTIMAL_TOKEN_BASELINE = "tir_optimal_token_baseline"
    GDPO = "gdpo"


#: verl estimators ppoflow does not implement: name → why / what to use
NOT_IMPLEMENTED_ESTIMATORS = {
    "gdpo": "GDPO (per-component GRPO over algorithm.gdpo_reward_keys) is not implemented in ppoflow",
    "optimal_token_baseline": "the optimal token baseline (needs sum_pi_squared from the actor) is not implemented in ppoflow",
    "tir_optimal_token_baseline": "the multi-turn optimal token baseline is not implemented in ppoflow",
}


class UnknownEstimatorError(KeyError, ValueError):
    """An unknown estimator name: a ``KeyError`` (ppoflow registries) and a ``ValueError`` (verl)."""

    def __str__(self) -> str:
        return str(self.args[0])


def get_adv_estimator_spec(name_or_enum: str | AdvantageEstimator) -> EstimatorSpec:
    """The :class:`EstimatorSpec` registered under a name or ``AdvantageEstimator`` member.

    Unknown names raise :class:`UnknownEstimatorError` listing the known ones; verl estimators that
    ppoflow does not implement raise ``NotImplementedError``.
    """
    name = estimator_name(name_or_enum)
    if name in ADV_ESTIMATORS:
        return ADV_ESTIMATORS.get(name)
    if name in NOT_IMPLEMENTED_ESTIMATORS:
        raise NotImplementedError(
            f"advantage estimator {name!r}: {NOT_IMPLEMENTED_ESTIMATORS[name]}"
        )
    raise UnknownEstimatorError(
        f"unknown advantage estimator {name!r}; known: {ADV_ESTIMATORS.names()}"
    )


def get_adv_estimator_fn(name_or_enum: str | AdvantageEstimator) -> AdvantageEstimatorFn:
    """The estimator function registered under a name or member (verl's API; case-sensitive);
    errors as :func:`get_adv_estimator_spec`."""
    return get_adv_estimator_spec(name_or_enum).fn


# verl's public names, so `from verl.trainer.ppo.core_algos import X` ports by changing the module
compute_gae_advantage_return = token.compute_gae_advantage_return
compute_reinforce_plus_plus_outcome_advantage = token.compute_reinforce_plus_plus_outcome_advantage
compute_remax_outcome_advantage = token.compute_remax_outcome_advantage
compute_grpo_outcome_advantage = group.compute_grpo_outcome_advantage
compute_grpo_vectorized_outcome_advantage = group.compute_grpo_vectorized_outcome_advantage
compute_grpo_passk_outcome_advantage = group.compute_grpo_passk_outcome_advantage
compute_rloo_outcome_advantage = group.compute_rloo_outcome_advantage
compute_rloo_vectorized_outcome_advantage = group.compute_rloo_vectorized_outcome_advantage
compute_opo_outcome_advantage = group.compute_opo_outcome_advantage
compute_gpg_outcome_advantage = group.compute_gpg_outcome_advantage
compute_reinforce_plus_plus_baseline_outcome_advantage = (
    group.compute_reinforce_plus_plus_baseline_outcome_advantage
)

__all__ = [
    "ADV_ESTIMATORS",
    "NOT_IMPLEMENTED_ESTIMATORS",
    "AdvantageEstimator",
    "AdvantageEstimatorFn",
    "EstimatorSpec",
    "UnknownEstimatorError",
    "compute_gae_advantage_return",
    "compute_gpg_outcome_advantage",
    "compute_grpo_outcome_advantage",
    "compute_grpo_passk_outcome_advantage",
    "compute_grpo_vectorized_outcome_advantage",
    "compute_opo_outcome_advantage",
    "compute_reinforce_plus_plus_baseline_outcome_advantage",
    "compute_reinforce_plus_plus_outcome_advantage",
    "compute_remax_outcome_advantage",
    "compute_rloo_outcome_advantage",
    "compute_rloo_vectorized_outcome_advantage",
    "gae_advantages",
    "get_adv_estimator_fn",
    "get_adv_estimator_spec",
    "register_adv_est",
    "reinforce_plus_plus_advantages",
    "remax_advantages",
]
