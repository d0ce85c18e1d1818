"""The default of every setting the algorithm math falls back to: one table per config section.

These tables are the one source of those defaults. The run config's schema takes each of these
fields' defaults from here (``stages.config`` imports ``stages.algos``, never the reverse), and the
verl-style readers fall back to them for a field a config leaves out:
:func:`stages.algos.config_view.read_field` (``algorithm.*``),
:func:`stages.algos.policy_loss_config.resolve_policy_loss_config` and
:meth:`stages.algos.actor_loss.ActorLossTerms.resolve` (``actor_rollout_ref.actor.*``). So a field's
default cannot differ between a validated run config and a plain ``dict`` a verl user passes.
What each field means, its unit and its bounds are written once, on the schema's field.

Keys are the fields' names within their section (verl's names), in the schema's order.

Example:
    >>> ALGORITHM_DEFAULTS["gamma"], KL_CTRL_DEFAULTS["type"], POLICY_LOSS_DEFAULTS["loss_mode"]
    (1.0, 'fixed', 'vanilla')
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

#: ``algorithm.*`` (its sections aside)
ALGORITHM_DEFAULTS: Mapping[str, Any] = MappingProxyType(
    {
        "adv_estimator": "gae",
        "gamma": 1.0,
        "lam": 1.0,
        "norm_adv_by_std_in_grpo": True,
        "use_kl_in_reward": False,
        "kl_penalty": "kl",
    }
)

#: ``algorithm.kl_ctrl.*``: the KL-in-reward coefficient controller
KL_CTRL_DEFAULTS: Mapping[str, Any] = MappingProxyType(
    {"type": "fixed", "kl_coef": 0.001, "horizon": 10000, "target_kl": 0.1}
)

#: ``algorithm.rollout_correction.*`` (verl's YAML defaults; ``bypass_mode`` None: the run config
#: fills it from the rollout backend)
ROLLOUT_CORRECTION_DEFAULTS: Mapping[str, Any] = MappingProxyType(
    {
        "rollout_is": None,
        "rollout_is_threshold": 2.0,
        "rollout_is_batch_normalize": False,
        "rollout_rs": None,
        "rollout_rs_threshold": None,
        "bypass_mode": None,
        "loss_type": "ppo_clip",
    }
)

#: ``algorithm.filter_groups.*``: DAPO's dynamic sampling (verl's YAML defaults)
FILTER_GROUPS_DEFAULTS: Mapping[str, Any] = MappingProxyType(
    {"enable": False, "metric": "reward", "max_num_gen_batches": 0}
)

#: ``actor_rollout_ref.actor.*`` read by the policy losses and the actor loss's extra terms
#: (``clip_ratio_low`` / ``clip_ratio_high`` None: each falls back to ``clip_ratio``)
ACTOR_LOSS_DEFAULTS: Mapping[str, Any] = MappingProxyType(
    {
        "clip_ratio": 0.2,
        "clip_ratio_low": None,
        "clip_ratio_high": None,
        "clip_ratio_c": 3.0,
        "tau_pos": 1.0,
        "tau_neg": 1.05,
        "loss_agg_mode": "token-mean",
        "entropy_coeff": 0.0,
        "use_kl_loss": False,
        "kl_loss_coef": 0.001,
        "kl_loss_type": "low_var_kl",
    }
)

#: ``actor_rollout_ref.actor.policy_loss.*``: the loss choice and the covariance losses' knobs
POLICY_LOSS_DEFAULTS: Mapping[str, Any] = MappingProxyType(
    {
        "loss_mode": "vanilla",
        "clip_cov_ratio": 0.0002,
        "clip_cov_lb": 1.0,
        "clip_cov_ub": 5.0,
        "kl_cov_ratio": 0.0002,
        "ppo_kl_coef": 0.1,
    }
)
