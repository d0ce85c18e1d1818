"""``algorithm.*``: the advantage estimator and the KL-in-reward penalty (verl's keys).

Every default here is the math's own (:mod:`stages.algos.defaults`), which the estimators and KL
controllers also fall back to when a verl-style config leaves a field out: one source.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from stages.algos.defaults import (
    ALGORITHM_DEFAULTS,
    KL_CTRL_DEFAULTS,
    ROLLOUT_CORRECTION_DEFAULTS,
)
from stages.config._base import ConfigModel
from stages.config.choices import EstimatorName, KlEstimatorName


class KlCtrlConfig(ConfigModel):
    """The controller of the KL-in-reward coefficient β."""

    type: Literal["fixed", "adaptive"] = Field(
        KL_CTRL_DEFAULTS["type"],
        description="fixed keeps β = kl_coef; adaptive steers the KL toward target_kl (choice)",
    )
    kl_coef: float = Field(
        KL_CTRL_DEFAULTS["kl_coef"], ge=0, description="Initial (fixed: constant) β (coefficient)"
    )
    horizon: int = Field(
        KL_CTRL_DEFAULTS["horizon"],
        description="adaptive: samples over which β moves by at most ±20 %; must be > 0 (samples)",
    )
    target_kl: float = Field(
        KL_CTRL_DEFAULTS["target_kl"], description="adaptive: the KL the controller aims for (nats)"
    )


class RolloutCorrectionConfig(ConfigModel):
    """Off-policy handling of the rollout engine's log-probs."""

    bypass_mode: bool | None = Field(
        ROLLOUT_CORRECTION_DEFAULTS["bypass_mode"],
        description="Use rollout_log_probs as old_log_probs instead of recomputing them (every rollout returns them); null = true where the rollout backend's log-probs are the actor's own before the step's update (hf), false otherwise (vllm) [ppoflow: verl's default is false] (bool)",
    )


class AlgorithmConfig(ConfigModel):
    """Advantage estimation and the KL penalty applied to rewards."""

    adv_estimator: EstimatorName = Field(
        ALGORITHM_DEFAULTS["adv_estimator"],
        description="Advantage estimator: a name in stages.algos.advantages.ADV_ESTIMATORS, a ppoflow.plugins module's included; its entry declares what it needs (name)",
    )
    gamma: float = Field(
        ALGORITHM_DEFAULTS["gamma"], ge=0, le=1, description="Discount factor γ (ratio)"
    )
    lam: float = Field(ALGORITHM_DEFAULTS["lam"], ge=0, le=1, description="GAE λ (ratio)")
    norm_adv_by_std_in_grpo: bool = Field(
        ALGORITHM_DEFAULTS["norm_adv_by_std_in_grpo"],
        description="GRPO: divide by the group std; false = Dr.GRPO (bool)",
    )
    use_kl_in_reward: bool = Field(
        ALGORITHM_DEFAULTS["use_kl_in_reward"],
        description="Subtract β·KL(old‖ref) from the token rewards; needs the reference policy (bool)",
    )
    kl_penalty: KlEstimatorName = Field(
        ALGORITHM_DEFAULTS["kl_penalty"], description="KL estimator of the in-reward penalty (name)"
    )
    kl_ctrl: KlCtrlConfig = Field(
        default_factory=KlCtrlConfig, description="KL-in-reward coefficient controller (section)"
    )
    rollout_correction: RolloutCorrectionConfig = Field(
        default_factory=RolloutCorrectionConfig, description="Rollout log-prob handling (section)"
    )
