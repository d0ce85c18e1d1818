"""``algorithm.*``: the advantage estimator, the KL-in-reward penalty and the rollout correction
(verl's keys).

Every default here is the math's own (:mod:`stages.algos.defaults`), which the estimators and KL
controllers also fall back to when a verl-style config leaves a field out: one source. The
rollout-correction thresholds and options are parsed when validated (``"0.5_2.0"`` → (0.5, 2.0),
``"token_k1,seq_mean_k3"`` → a tuple of names); a JSON dump writes verl's strings back.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BeforeValidator,
    Field,
    ValidationInfo,
    field_serializer,
    field_validator,
)

from stages.algos.defaults import (
    ALGORITHM_DEFAULTS,
    FILTER_GROUPS_DEFAULTS,
    KL_CTRL_DEFAULTS,
    ROLLOUT_CORRECTION_DEFAULTS,
)
from stages.algos.policy_losses_bypass import BYPASS_LOSSES
from stages.algos.rollout_correction import (
    ROLLOUT_IS_MODES,
    ROLLOUT_RS_OPTIONS,
    Bounds,
    format_bounds,
    parse_is_threshold,
    parse_rs_thresholds,
    split_rs_options,
)
from stages.config._base import ConfigModel
from stages.config.choices import EstimatorName, KlEstimatorName, check_registered


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


def _rollout_is_mode(name: str) -> str:
    return check_registered(name, ROLLOUT_IS_MODES.names(), "rollout IS mode")


def _bypass_loss(name: str) -> str:
    return check_registered(name, BYPASS_LOSSES.names(), "bypass loss")


def _rs_options(value: Any) -> tuple[str, ...] | None:
    names = split_rs_options(value)
    for name in names or ():
        check_registered(name, ROLLOUT_RS_OPTIONS.names(), "rollout rejection-sampling option")
    return names


#: ``rollout_is``: a name in ``stages.algos.rollout_correction.ROLLOUT_IS_MODES``
RolloutIsMode = Annotated[str, AfterValidator(_rollout_is_mode)]
#: ``rollout_is_threshold``: u (TIS) or verl's ``"lo_hi"`` (IcePop), parsed to u or (lo, hi)
IsThreshold = Annotated[float | tuple[float, float], BeforeValidator(parse_is_threshold)]
#: ``loss_type``: a name in ``stages.algos.policy_losses_bypass.BYPASS_LOSSES``
BypassLossType = Annotated[str, AfterValidator(_bypass_loss)]
#: ``rollout_rs``: verl's comma list, parsed to a tuple of option names (duplicates dropped)
RsOptions = Annotated[tuple[str, ...], BeforeValidator(_rs_options)]


class RolloutCorrectionConfig(ConfigModel):
    """Off-policy correction between the rollout engine's log-probs and the trained policy's
    (verl's rollout correction: importance weights, rejection sampling, bypass mode)."""

    rollout_is: RolloutIsMode | None = Field(
        ROLLOUT_CORRECTION_DEFAULTS["rollout_is"],
        description="Importance weights π_train/π_rollout multiplied into the policy loss: token (one per token) or sequence (the product over the response), a name in stages.algos.rollout_correction.ROLLOUT_IS_MODES; null = none, the rollout_corr/* mismatch metrics are still logged [ppoflow: verl's dataclass default is sequence, its YAML's null] (name)",
    )
    rollout_is_threshold: IsThreshold = Field(
        ROLLOUT_CORRECTION_DEFAULTS["rollout_is_threshold"],
        description="A number u: weights clamped at u (TIS); 'lo_hi': weights outside [lo, hi] set to 0, the mask unchanged (IcePop) (ratio)",
    )
    rollout_is_batch_normalize: bool = Field(
        ROLLOUT_CORRECTION_DEFAULTS["rollout_is_batch_normalize"],
        description="Divide the weights by their mean so it is 1: over the response tokens (token) or the rows' mean weights (sequence), per batch in decoupled mode, per micro-batch in bypass mode; needs rollout_is (bool)",
    )
    rollout_rs: RsOptions | None = Field(
        ROLLOUT_CORRECTION_DEFAULTS["rollout_rs"],
        description="Rejection sampling: comma list of token_k1/k2/k3, seq_sum_k1/k2/k3, seq_mean_k1/k2/k3, seq_max_k2/k3 (k1 = −log r, k2 = ½(log r)², k3 = r − 1 − log r per token; seq_* judge a whole response); every listed check must pass, rejected tokens leave the response mask; null = none (names)",
    )
    rollout_rs_threshold: tuple[Bounds, ...] | None = Field(
        ROLLOUT_CORRECTION_DEFAULTS["rollout_rs_threshold"],
        validate_default=True,  # null is an error once rollout_rs names options
        description="Required with rollout_rs: one value for every option or one per option, comma-separated; a k1 option keeps lo ≤ 1/r ≤ hi ('lo_hi', or a bare u meaning 1/u_u), a k2/k3 option keeps k ≤ its one upper bound (ratio)",
    )
    bypass_mode: bool | None = Field(
        ROLLOUT_CORRECTION_DEFAULTS["bypass_mode"],
        description="Use rollout_log_probs as old_log_probs instead of recomputing them (every rollout returns them), the correction then computed in the loss from the current policy; null = true with ppoflow.schedule=one_step_off (as verl's one-step-off recipe sets it), else true where the rollout backend's log-probs are the actor's own before the step's update (hf), false otherwise (vllm) [ppoflow: verl's default is false] (bool)",
    )
    loss_type: BypassLossType = Field(
        ROLLOUT_CORRECTION_DEFAULTS["loss_type"],
        description="Bypass mode's policy loss, a name in stages.algos.policy_losses_bypass.BYPASS_LOSSES: ppo_clip (the vanilla clipped loss against the rollout log-probs on the rejection mask, no IS weights) or reinforce (−A·log π·w with the IS weights, no clip); any but ppo_clip needs bypass_mode (name)",
    )

    @field_validator("rollout_rs_threshold", mode="before")
    @classmethod
    def _parse_rs_threshold(cls, value: Any, info: ValidationInfo) -> Any:
        """One bound per rollout_rs option: (lo, hi) for k1, an upper bound for k2/k3."""
        if "rollout_rs" not in info.data:  # rollout_rs itself is bad: reported there
            return None
        options = info.data["rollout_rs"]
        if options is None:
            if value is None:
                return None
            raise ValueError(
                f"got {value!r} but rollout_rs is null, so it would do nothing; set rollout_rs "
                "or remove the threshold"
            )
        return parse_rs_thresholds(options, value)

    @field_serializer("rollout_is_threshold", when_used="json")
    def _is_threshold_text(self, value: Bounds) -> str | float:
        return format_bounds(value)

    @field_serializer("rollout_rs", when_used="json")
    def _rs_text(self, value: tuple[str, ...] | None) -> str | None:
        return None if value is None else ",".join(value)

    @field_serializer("rollout_rs_threshold", when_used="json")
    def _rs_threshold_text(self, value: tuple[Bounds, ...] | None) -> str | None:
        return None if value is None else ",".join(str(format_bounds(b)) for b in value)


class FilterGroupsConfig(ConfigModel):
    """DAPO's dynamic sampling: generate rounds of data.gen_batch_size prompts and keep the prompt
    groups whose metric has non-zero spread until data.train_batch_size groups are kept."""

    enable: bool = Field(
        FILTER_GROUPS_DEFAULTS["enable"],
        description="Filter out groups whose metric is the same for every sample (population std 0; a one-sample group is kept) and generate more rounds until data.train_batch_size groups are kept (bool)",
    )
    metric: str = Field(
        FILTER_GROUPS_DEFAULTS["metric"],
        min_length=1,
        description="What is compared within a group: a name in stages.filter_metrics.FILTER_METRICS (reward, seq_reward, or seq_final_reward: the score Σ rm_scores, overlong penalty included, no KL; seq_final_reward is refused with use_kl_in_reward) or a reward extra every scorer returns (e.g. acc); a name no scorer returns stops the run at the first generation round (name)",
    )
    max_num_gen_batches: int = Field(
        FILTER_GROUPS_DEFAULTS["max_num_gen_batches"],
        ge=0,
        description="Generation rounds one step may run; reaching it without data.train_batch_size kept groups ends the run with an error naming it; 0 = no limit [ppoflow: verl 0.9.1's v1 buffer ignores it] (rounds)",
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
        default_factory=RolloutCorrectionConfig,
        description="Rollout correction of the rollout engine's log-probs: importance weights, rejection sampling, bypass mode (section)",
    )
    filter_groups: FilterGroupsConfig = Field(
        default_factory=FilterGroupsConfig,
        description="DAPO's dynamic sampling (filter groups) (section)",
    )
