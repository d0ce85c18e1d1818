"""The advantage-estimator registry: ``ADV_ESTIMATORS``, its entries and verl's decorator.

Each estimator module registers its estimators where it defines them, with
:func:`register_adv_est` (verl's decorator, with the entry's needs as keywords):
:mod:`stages.algos.advantages_token` (gae, reinforce_plus_plus, remax) and
:mod:`stages.algos.advantages_group` (grpo and the other group baselines); a ``ppoflow.plugins``
module registers its own the same way. :mod:`stages.algos.advantages` is the public face (the
lookups and verl's names).

Every entry's function has one signature, so callers never branch on the name::

    estimator(token_level_rewards (B, R), response_mask (B, R), *,
              index: (B,) uid array | None = None, values: (B, R) | None = None,
              reward_baselines: (B,) | None = None, config=None) -> (advantages (B, R), returns (B, R))

Example:
    >>> spec = EstimatorSpec(fn=lambda **kwargs: None, group_based=True, min_group_size=2)
    >>> spec.needs_values, spec.group_based, spec.min_group_size
    (False, True, 2)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import Any

from torch import Tensor

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


def estimator_name(name_or_enum: str | Enum) -> str:
    """The registry name of a name or an ``AdvantageEstimator`` member (its value)."""
    return name_or_enum.value if isinstance(name_or_enum, Enum) else name_or_enum


def register_adv_est(
    name_or_enum: str | Enum,
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
        ADV_ESTIMATORS.add(estimator_name(name_or_enum), spec)
        return fn

    return add


def require_input(value: Any, estimator: str, key: str, what: str) -> Any:
    """``value``, or a ``KeyError`` naming the estimator and the batch key it needs.

    >>> require_input(None, "gae", "values", "(B, R) critic values")
    Traceback (most recent call last):
    ...
    KeyError: "advantage estimator 'gae' needs 'values' ((B, R) critic values), but none was given; add 'values' to the batch or pick another estimator"
    """
    if value is None:
        raise KeyError(
            f"advantage estimator {estimator!r} needs {key!r} ({what}), but none was given; "
            f"add {key!r} to the batch or pick another estimator"
        )
    return value
