"""Advantage estimators, looked up by name.

``ADV_ESTIMATORS`` maps a name (verl's ``algorithm.adv_estimator`` values) to a function with one
signature, so callers never branch on the name::

    estimator(token_level_rewards (B, R), response_mask (B, R), *,
              index: (B,) uid array | None = None, values: (B, R) | None = None,
              reward_baselines: (B,) | None = None, config=None) -> (advantages (B, R), returns (B, R))

``config`` is anything with verl's attribute names (``gamma``, ``lam``,
``norm_adv_by_std_in_grpo``) or a ``Mapping``; absent fields take verl's defaults
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
    >>> advantages, _ = grpo(torch.tensor([[1.], [0.]]), torch.ones(2, 1), index=np.array(["a", "a"]))
    >>> advantages.squeeze(-1)
    tensor([ 0.7071, -0.7071])
"""

from __future__ import annotations

from collections.abc import Callable
from enum import Enum
from typing import Any

from torch import Tensor

from dataproto import keys
from stages.algos import advantages_group as group
from stages.algos import advantages_token as token
from stages.algos.config_view import read_field
from stages.algos.masked import masked_whiten
from stages.registry import Registry

AdvantageEstimatorFn = Callable[..., tuple[Tensor, Tensor]]

ADV_ESTIMATORS: Registry[AdvantageEstimatorFn] = Registry("advantage estimator")


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


def _estimator_name(name_or_enum: str | Enum) -> str:
    return name_or_enum.value if isinstance(name_or_enum, Enum) else name_or_enum


def get_adv_estimator_fn(name_or_enum: str | AdvantageEstimator) -> AdvantageEstimatorFn:
    """The estimator registered under a name or ``AdvantageEstimator`` member (case-sensitive).

    Unknown names raise :class:`UnknownEstimatorError` listing the known ones; verl estimators that
    ppoflow does not implement raise ``NotImplementedError``.
    """
    name = _estimator_name(name_or_enum)
    if name in ADV_ESTIMATORS:
        return ADV_ESTIMATORS.get(name)
    if name in NOT_IMPLEMENTED_ESTIMATORS:
        raise NotImplementedError(
            f"advantage estimator {name!r}: {NOT_IMPLEMENTED_ESTIMATORS[name]}"
        )
    raise UnknownEstimatorError(
        f"unknown advantage estimator {name!r}; known: {ADV_ESTIMATORS.names()}"
    )


def register_adv_est(
    name_or_enum: str | AdvantageEstimator,
) -> Callable[[AdvantageEstimatorFn], AdvantageEstimatorFn]:
    """Decorator adding an estimator under a name (verl's API); a second, different function raises.

    The function is called with keywords ``token_level_rewards``, ``response_mask``, ``config`` and,
    when the batch has them, ``index`` (uid), ``values`` and ``reward_baselines``.
    """
    return ADV_ESTIMATORS.register(_estimator_name(name_or_enum))


def _require(value: Any, estimator: str, key: str, what: str) -> Any:
    if value is None:
        raise KeyError(
            f"advantage estimator {estimator!r} needs {key!r} ({what}), but none was given; "
            f"add {key!r} to the batch or pick another estimator"
        )
    return value


_UID_NEED = (keys.UID, "(B,) prompt group ids, non-tensor layer")


@ADV_ESTIMATORS.register("gae")
def gae_advantages(
    token_level_rewards,
    response_mask,
    *,
    index=None,
    values=None,
    reward_baselines=None,
    config=None,
):
    """GAE with ``config.gamma``/``config.lam``, then whitened over the batch's valid tokens (verl)."""
    values = _require(values, "gae", keys.VALUES, "(B, R) critic values; enable the critic")
    gamma, lam = read_field(config, "gamma"), read_field(config, "lam")
    raw_advantages, returns = token.gae_returns(
        token_level_rewards, values, response_mask, gamma, lam
    )
    advantages = masked_whiten(raw_advantages, response_mask)  # policy step: batch normalisation
    return advantages, returns


def _group_entry(name: str, verl_fn: Callable, reads_norm_flag: bool) -> AdvantageEstimatorFn:
    """A registry entry for a group estimator: checks ``index`` and passes the config's flag."""

    def estimate(
        token_level_rewards,
        response_mask,
        *,
        index=None,
        values=None,
        reward_baselines=None,
        config=None,
    ):
        index = _require(index, name, *_UID_NEED)
        if reads_norm_flag:
            norm = read_field(config, "norm_adv_by_std_in_grpo")
            return verl_fn(token_level_rewards, response_mask, index, norm_adv_by_std_in_grpo=norm)
        return verl_fn(token_level_rewards, response_mask, index)

    estimate.__name__ = f"{name}_advantages"
    estimate.__qualname__ = estimate.__name__
    estimate.__doc__ = f"``{name}``: :func:`~stages.algos.advantages_group.{verl_fn.__name__}` with ``index = uid``."
    return estimate


for _name, _verl_fn, _reads_norm_flag in (
    ("grpo", group.compute_grpo_outcome_advantage, True),
    ("grpo_vectorized", group.compute_grpo_vectorized_outcome_advantage, True),
    ("grpo_passk", group.compute_grpo_passk_outcome_advantage, True),
    ("rloo", group.compute_rloo_outcome_advantage, False),
    ("rloo_vectorized", group.compute_rloo_vectorized_outcome_advantage, False),
    ("opo", group.compute_opo_outcome_advantage, False),
    ("gpg", group.compute_gpg_outcome_advantage, False),
    (
        "reinforce_plus_plus_baseline",
        group.compute_reinforce_plus_plus_baseline_outcome_advantage,
        False,
    ),
):
    ADV_ESTIMATORS.add(_name, _group_entry(_name, _verl_fn, _reads_norm_flag))


@ADV_ESTIMATORS.register("reinforce_plus_plus")
def reinforce_plus_plus_advantages(
    token_level_rewards,
    response_mask,
    *,
    index=None,
    values=None,
    reward_baselines=None,
    config=None,
):
    """REINFORCE++: whitened reward-to-go with γ = ``config.gamma``; returns the un-whitened G."""
    return token.compute_reinforce_plus_plus_outcome_advantage(
        token_level_rewards, response_mask, config
    )


@ADV_ESTIMATORS.register("remax")
def remax_advantages(
    token_level_rewards,
    response_mask,
    *,
    index=None,
    values=None,
    reward_baselines=None,
    config=None,
):
    """ReMax: reward-to-go minus the greedy sample's reward; not whitened."""
    baselines = _require(
        reward_baselines, "remax", keys.REWARD_BASELINES, "(B,) greedy-sample rewards"
    )
    return token.compute_remax_outcome_advantage(token_level_rewards, baselines, response_mask)


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
    "register_adv_est",
    "reinforce_plus_plus_advantages",
    "remax_advantages",
]
