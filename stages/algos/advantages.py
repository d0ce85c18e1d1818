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

``config`` is anything with verl's attribute names (``gamma``, ``lam``,
``norm_adv_by_std_in_grpo``) or a ``Mapping``; absent fields take the schema's defaults
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

from collections.abc import Callable
from dataclasses import dataclass
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


@dataclass(frozen=True)
class EstimatorSpec:
    """One ``ADV_ESTIMATORS`` entry: the estimator and what it needs from the rest of the run.

    Attributes:
        fn: the estimator, with the module's signature.
        needs_values: reads ``values`` (B, R) from a critic, so the run uses and trains one
            (verl's ``use_critic`` when ``critic.enable`` is null).
        group_based: its baseline is computed over the samples of one prompt (rows sharing a
            ``uid``), so rollout.n = 1 makes every group a singleton.
        needs_greedy_baseline: reads ``reward_baselines`` (B,), the reward of one greedy response
            per prompt: the baseline_rollout / baseline_reward stages run, and sampling must be on.
        min_group_size: the smallest rollout.n the estimator is defined for (≥ 1).
    """

    fn: AdvantageEstimatorFn
    needs_values: bool = False
    group_based: bool = False
    needs_greedy_baseline: bool = False
    min_group_size: int = 1

    def __post_init__(self) -> None:
        if not callable(self.fn):
            raise TypeError(f"EstimatorSpec.fn must be callable, got {self.fn!r}")
        if self.min_group_size < 1 or (self.min_group_size > 1 and not self.group_based):
            raise ValueError(
                f"EstimatorSpec.min_group_size = {self.min_group_size} must be ≥ 1, and > 1 only "
                "for a group_based estimator"
            )


ADV_ESTIMATORS: Registry[EstimatorSpec] = Registry("advantage estimator")


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


def get_adv_estimator_spec(name_or_enum: str | AdvantageEstimator) -> EstimatorSpec:
    """The :class:`EstimatorSpec` registered under a name or ``AdvantageEstimator`` member.

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


def get_adv_estimator_fn(name_or_enum: str | AdvantageEstimator) -> AdvantageEstimatorFn:
    """The estimator function registered under a name or member (verl's API; case-sensitive);
    errors as :func:`get_adv_estimator_spec`."""
    return get_adv_estimator_spec(name_or_enum).fn


def register_adv_est(
    name_or_enum: str | AdvantageEstimator,
    *,
    needs_values: bool = False,
    group_based: bool = False,
    needs_greedy_baseline: bool = False,
    min_group_size: int = 1,
) -> Callable[[AdvantageEstimatorFn], AdvantageEstimatorFn]:
    """Decorator adding an estimator under a name (verl's API, plus the :class:`EstimatorSpec`
    needs as keywords); a second, different registration of the name raises.

    The function is called with keywords ``token_level_rewards``, ``response_mask``, ``config`` and,
    when the batch has them, ``index`` (uid), ``values`` and ``reward_baselines``; it is returned
    unchanged.
    """

    def add(fn: AdvantageEstimatorFn) -> AdvantageEstimatorFn:
        spec = EstimatorSpec(
            fn=fn,
            needs_values=needs_values,
            group_based=group_based,
            needs_greedy_baseline=needs_greedy_baseline,
            min_group_size=min_group_size,
        )
        ADV_ESTIMATORS.add(_estimator_name(name_or_enum), spec)
        return fn

    return add


def _require(value: Any, estimator: str, key: str, what: str) -> Any:
    if value is None:
        raise KeyError(
            f"advantage estimator {estimator!r} needs {key!r} ({what}), but none was given; "
            f"add {key!r} to the batch or pick another estimator"
        )
    return value


_UID_NEED = (keys.UID, "(B,) prompt group ids, non-tensor layer")


@register_adv_est("gae", needs_values=True)
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


for _name, _verl_fn, _reads_norm_flag, _min_group_size in (
    ("grpo", group.compute_grpo_outcome_advantage, True, 1),
    ("grpo_vectorized", group.compute_grpo_vectorized_outcome_advantage, True, 1),
    ("grpo_passk", group.compute_grpo_passk_outcome_advantage, True, 2),  # best vs second best
    ("rloo", group.compute_rloo_outcome_advantage, False, 1),
    ("rloo_vectorized", group.compute_rloo_vectorized_outcome_advantage, False, 1),
    ("opo", group.compute_opo_outcome_advantage, False, 1),
    ("gpg", group.compute_gpg_outcome_advantage, False, 1),
    (
        "reinforce_plus_plus_baseline",
        group.compute_reinforce_plus_plus_baseline_outcome_advantage,
        False,
        1,
    ),
):
    register_adv_est(_name, group_based=True, min_group_size=_min_group_size)(
        _group_entry(_name, _verl_fn, _reads_norm_flag)
    )


@register_adv_est("reinforce_plus_plus")
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


@register_adv_est("remax", needs_greedy_baseline=True)
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
