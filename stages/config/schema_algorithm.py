"""``algorithm.*``: the advantage estimator and the KL-in-reward penalty (verl's keys)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from stages.config._base import ConfigModel
from stages.config.choices import EstimatorName, KlEstimatorName


class KlCtrlConfig(ConfigModel):
    """The controller of the KL-in-reward coefficient β."""

    type: Literal["fixed", "adaptive"] = Field(
        "fixed",
        description="fixed keeps β = kl_coef; adaptive steers the KL toward target_kl (choice)",
    )
    kl_coef: float = Field(0.001, ge=0, description="Initial (fixed: constant) β (coefficient)")
    horizon: int = Field(
        10000,
        description="adaptive: samples over which β moves by at most ±20 %; must be > 0 (samples)",
    )
    target_kl: float = Field(0.1, description="adaptive: the KL the controller aims for (nats)")


class RolloutCorrectionConfig(ConfigModel):
    """Off-policy handling of the rollout engine's log-probs."""

    bypass_mode: bool | None = Field(
        None,
        description="Use rollout_log_probs as old_log_probs instead of recomputing them (every rollout returns them); null = true where the rollout backend's log-probs are the actor's own before the step's update (hf), false otherwise (vllm) [ppoflow: verl's default is false] (bool)",
    )


class AlgorithmConfig(ConfigModel):
    """Advantage estimation and the KL penalty applied to rewards."""

    adv_estimator: EstimatorName = Field(
        "gae",
        description="Advantage estimator: a name in stages.algos.advantages.ADV_ESTIMATORS, a ppoflow.plugins module's included; its entry declares what it needs (name)",
    )
    gamma: float = Field(1.0, ge=0, le=1, description="Discount factor γ (ratio)")
    lam: float = Field(1.0, ge=0, le=1, description="GAE λ (ratio)")
    norm_adv_by_std_in_grpo: bool = Field(
        True, description="GRPO: divide by the group std; false = Dr.GRPO (bool)"
    )
    use_kl_in_reward: bool = Field(
        False,
        description="Subtract β·KL(old‖ref) from the token rewards; needs the reference policy (bool)",
    )
    kl_penalty: KlEstimatorName = Field(
        "kl", description="KL estimator of the in-reward penalty (name)"
    )
    kl_ctrl: KlCtrlConfig = Field(
        default_factory=KlCtrlConfig, description="KL-in-reward coefficient controller (section)"
    )
    rollout_correction: RolloutCorrectionConfig = Field(
        default_factory=RolloutCorrectionConfig, description="Rollout log-prob handling (section)"
    )
