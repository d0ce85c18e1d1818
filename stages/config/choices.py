"""Config fields whose value is a name in a registry: estimators, losses, KL estimators, backends.

The allowed names are not written here: each field's type validates its value against the
registry that holds the implementations, so an entry registered by a ``ppoflow.plugins`` module
(imported before the fields are validated, see :mod:`stages.plugins`) is selectable by name.
An unknown name is an error that lists the registry's names, with the close ones first::

    algorithm.adv_estimator: got 'grpoo'; did you mean 'grpo'? allowed: 'gae', 'gpg', … (advantage estimator registry; a ppoflow.plugins module can register more)

Example:
    >>> check_registered("grpo", ["gae", "grpo"], "advantage estimator")
    'grpo'
    >>> check_registered("grpoo", ["gae", "grpo"], "advantage estimator")
    Traceback (most recent call last):
    ...
    ValueError: got 'grpoo'; did you mean 'grpo'? allowed: 'gae' or 'grpo' (advantage estimator registry; a ppoflow.plugins module can register more)
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence
from typing import Annotated

from pydantic import AfterValidator

from stages.algos.advantages import ADV_ESTIMATORS, NOT_IMPLEMENTED_ESTIMATORS
from stages.algos.kl import kl_penalty_names, unavailable_kl_penalties
from stages.algos.policy_loss_config import POLICY_LOSSES
from stages.engines.rollout_backends import ROLLOUT_BACKENDS
from stages.engines.worker_group import WORKER_BACKENDS
from stages.health.checks import HEALTH_CHECKS
from stages.reward.managers import REWARD_MANAGERS
from stages.schedules import POLICY_SCHEDULES


def check_registered(
    name: str, known: Sequence[str], kind: str, unavailable: Mapping[str, str] | None = None
) -> str:
    """``name`` when it is in ``known``; otherwise a one-line ``ValueError`` listing ``known``.

    ``unavailable`` maps names that are recognised but refused to the reason (e.g. verl
    estimators ppoflow does not implement).
    """
    if name in known:
        return name
    allowed = (
        f"allowed: {_or_list(known)} ({kind} registry; a ppoflow.plugins module can register more)"
    )
    if unavailable and name in unavailable:
        raise ValueError(f"got {name!r}, which is not available: {unavailable[name]}; {allowed}")
    close = difflib.get_close_matches(name, list(known), n=3, cutoff=0.6)
    hint = "did you mean " + " or ".join(repr(c) for c in close) + "? " if close else ""
    raise ValueError(f"got {name!r}; {hint}{allowed}")


def _or_list(names: Sequence[str]) -> str:
    quoted = [repr(n) for n in sorted(names)]
    return quoted[0] if len(quoted) == 1 else ", ".join(quoted[:-1]) + " or " + quoted[-1]


def _estimator(name: str) -> str:
    return check_registered(
        name, ADV_ESTIMATORS.names(), "advantage estimator", NOT_IMPLEMENTED_ESTIMATORS
    )


def _policy_loss(name: str) -> str:
    return check_registered(name, POLICY_LOSSES.names(), "policy loss")


def _kl_penalty(name: str) -> str:
    unavailable = unavailable_kl_penalties()
    refused = {**unavailable, **{n + "+": why for n, why in unavailable.items()}}
    return check_registered(name, kl_penalty_names(), "KL estimator", refused)


def _rollout_backend(name: str) -> str:
    return check_registered(name, ROLLOUT_BACKENDS.names(), "rollout backend")


def _reward_manager(name: str) -> str:
    return check_registered(name, REWARD_MANAGERS.names(), "reward manager")


def _worker_backend(name: str) -> str:
    return check_registered(name, WORKER_BACKENDS.names(), "worker backend")


def _policy_schedule(name: str) -> str:
    return check_registered(name, POLICY_SCHEDULES.names(), "policy schedule")


def _health_check(name: str) -> str:
    return check_registered(name, HEALTH_CHECKS.names(), "health check")


#: ``algorithm.adv_estimator``: a name in ``stages.algos.advantages.ADV_ESTIMATORS``
EstimatorName = Annotated[str, AfterValidator(_estimator)]
#: ``actor.policy_loss.loss_mode``: a name in ``stages.algos.policy_loss_config.POLICY_LOSSES``
PolicyLossName = Annotated[str, AfterValidator(_policy_loss)]
#: ``algorithm.kl_penalty`` / ``actor.kl_loss_type``: a name in ``stages.algos.kl.KL_ESTIMATORS``,
#: optionally with the straight-through ``+``
KlEstimatorName = Annotated[str, AfterValidator(_kl_penalty)]
#: ``actor_rollout_ref.rollout.name``: a name in ``stages.engines.rollout_backends.ROLLOUT_BACKENDS``
RolloutBackendName = Annotated[str, AfterValidator(_rollout_backend)]
#: ``ppoflow.workers.backend``: a name in ``stages.engines.worker_group.WORKER_BACKENDS``
WorkerBackendName = Annotated[str, AfterValidator(_worker_backend)]
#: ``reward.reward_manager.name``: a name in ``stages.reward.managers.REWARD_MANAGERS``
RewardManagerName = Annotated[str, AfterValidator(_reward_manager)]
#: ``ppoflow.schedule``: a name in ``stages.schedules.POLICY_SCHEDULES``
PolicyScheduleName = Annotated[str, AfterValidator(_policy_schedule)]
#: a key of ``ppoflow.health``: a name in ``stages.health.checks.HEALTH_CHECKS``
HealthCheckName = Annotated[str, AfterValidator(_health_check)]
