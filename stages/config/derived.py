"""Inherited values and derived sizes, computed in this one place.

``fill_inherited`` turns every "null = take X" field into its value, so each area's slice is
complete on its own (a stage reads only its slice). ``compute_derived`` returns the flags and
sizes the flow needs (verl's ``use_critic``, ``use_reference_policy``, ``use_rm``, the DP size and
the mini-batch sizes in sequences). Neither validates: ``checks.py`` does, on the filled config, and
imports this module (``is_critic_used``), never the reverse; the root model hands the checks'
warnings to :func:`compute_derived`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, TypeVar

from pydantic import Field

from stages.algos.advantages import ADV_ESTIMATORS
from stages.algos.aggregation import AGG_LOSS_MODES
from stages.config._base import ConfigModel
from stages.engines.adapters import adapter_settings
from stages.engines.rollout_backends import ROLLOUT_BACKENDS
from stages.schedules import POLICY_SCHEDULES

if TYPE_CHECKING:
    from stages.config.root import PPORunConfig
    from stages.config.schema_actor import ActorConfig
    from stages.config.schema_critic import CriticConfig
    from stages.config.schema_run import RunSchema

#: the run config being filled: ``PPORunConfig`` while it validates, or its bare ``RunSchema``
Run = TypeVar("Run", bound="RunSchema")


class DerivedConfig(ConfigModel):
    """Flags and sizes that follow from the config; read them here, never recompute them."""

    use_critic: bool = Field(
        description="critic.enable if set, else whether the estimator's registry entry needs values (bool)"
    )
    use_reference_policy: bool = Field(
        description="algorithm.use_kl_in_reward or actor.use_kl_loss (bool)"
    )
    reference_in_actor: bool = Field(
        description="The reference log-probs come from the actor's module with its LoRA adapters off (its variant's reference_is_base, stages.engines.adapters): no reference model is built; verl's ref_in_actor (bool)"
    )
    use_rm: bool = Field(description="reward.reward_model.enable (bool)")
    dp_size: int = Field(description="trainer.n_gpus_per_node × trainer.nnodes (ranks)")
    rollout_batch_size: int = Field(
        description="data.train_batch_size × rollout.n: rows of one step's batch (sequences)"
    )
    actor_mini_batch_size: int = Field(
        description="actor.ppo_mini_batch_size × rollout.n: agg_loss's global_batch_size (sequences)"
    )
    actor_mini_batches_per_epoch: int = Field(
        description="Actor optimizer steps per PPO epoch of one training step (updates)"
    )
    actor_mini_batch_size_per_rank: int = Field(
        description="actor_mini_batch_size / dp_size (sequences)"
    )
    actor_grad_accum_steps: int | None = Field(
        description="Micro-batches per rank per actor update; null with use_dynamic_bsz (micro-batches)"
    )
    critic_mini_batch_size: int = Field(
        description="critic.ppo_mini_batch_size × rollout.n (sequences)"
    )
    critic_mini_batch_size_per_rank: int = Field(
        description="critic_mini_batch_size / dp_size (sequences)"
    )
    critic_grad_accum_steps: int | None = Field(
        description="Micro-batches per rank per critic update; null with use_dynamic_bsz (micro-batches)"
    )
    warnings: tuple[str, ...] = Field(
        description="Legal but suspicious settings, also emitted as ConfigWarning (messages)"
    )


def per_rank_mini_batch(mini_batch_prompts: int, n: int, dp_size: int) -> int:
    """Sequences of one mini-batch on one rank, at least 1 (divisibility is checked elsewhere)."""
    return max(1, mini_batch_prompts * n // dp_size)


def fill_inherited(cfg: Run) -> Run:
    """Return a copy of ``cfg`` with every null "inherits" field set to the value it names."""
    arr = cfg.actor_rollout_ref
    model, actor, rollout, ref = arr.model, arr.actor, arr.rollout, arr.ref
    dp_size = cfg.trainer.n_gpus_per_node * cfg.trainer.nnodes
    actor_micro = actor.ppo_micro_batch_size_per_gpu or per_rank_mini_batch(
        actor.ppo_mini_batch_size, rollout.n, dp_size
    )
    model = _fill(model, tokenizer_path=model.path)
    actor = _fill(
        actor,
        clip_ratio_low=actor.clip_ratio,
        clip_ratio_high=actor.clip_ratio,
        ppo_micro_batch_size_per_gpu=actor_micro,
    )
    log_prob = {
        "log_prob_micro_batch_size_per_gpu": actor_micro,
        "log_prob_use_dynamic_bsz": actor.use_dynamic_bsz,
        "log_prob_max_token_len_per_gpu": actor.ppo_max_token_len_per_gpu,
    }
    rollout = _fill(
        rollout,
        prompt_length=cfg.data.max_prompt_length,
        response_length=cfg.data.max_response_length,
        **log_prob,
    )
    rollout = _fill(rollout, max_model_len=rollout.prompt_length + rollout.response_length)
    ref = _fill(ref, zero_stage=actor.zero_stage, **log_prob)
    arr = arr.model_copy(update={"model": model, "actor": actor, "rollout": rollout, "ref": ref})
    return cfg.model_copy(
        update={
            "actor_rollout_ref": arr,
            "critic": _fill_critic(cfg, actor, dp_size),
            "algorithm": _fill_algorithm(cfg),
            "data": _fill(
                cfg.data, seed=cfg.trainer.seed, gen_batch_size=cfg.data.train_batch_size
            ),
            "reward": _fill_reward(cfg),
            "trainer": _fill(
                cfg.trainer,
                default_local_dir=f"checkpoints/{cfg.trainer.project_name}/{cfg.trainer.experiment_name}",
            ),
        }
    )


def _fill_algorithm(cfg: RunSchema) -> ConfigModel:
    """``rollout_correction.bypass_mode`` null: the schedule's default where its registry entry
    has one (one step off: true, as verl's recipe sets it; ``stages.schedules``), else reuse the
    rollout's log-probs as old_log_probs where they are the actor's own (the rollout backend's
    registry entry says so)."""
    algorithm = cfg.algorithm
    bypass = POLICY_SCHEDULES.get(cfg.ppoflow.schedule).bypass_default
    if bypass is None:
        bypass = ROLLOUT_BACKENDS.get(cfg.actor_rollout_ref.rollout.name).log_probs_are_actors
    correction = _fill(algorithm.rollout_correction, bypass_mode=bypass)
    if correction is algorithm.rollout_correction:
        return algorithm
    return algorithm.model_copy(update={"rollout_correction": correction})


def _fill_reward(cfg: RunSchema) -> ConfigModel:
    """``reward.overlong_buffer.max_resp_len`` null: ``data.max_response_length``."""
    buffer = _fill(cfg.reward.overlong_buffer, max_resp_len=cfg.data.max_response_length)
    if buffer is cfg.reward.overlong_buffer:
        return cfg.reward
    return cfg.reward.model_copy(update={"overlong_buffer": buffer})


def _fill_critic(cfg: RunSchema, actor: ActorConfig, dp_size: int) -> CriticConfig:
    """The critic's inherited model, batching and optimizer-placement keys (verl's interpolations)."""
    critic, model = cfg.critic, cfg.actor_rollout_ref.model
    critic_model = _fill(
        critic.model,
        path=model.path,
        trust_remote_code=model.trust_remote_code,
        enable_gradient_checkpointing=model.enable_gradient_checkpointing,
        dtype=model.dtype,
        attn_implementation=model.attn_implementation,
        use_remove_padding=model.use_remove_padding,
    )
    mini = critic.ppo_mini_batch_size or actor.ppo_mini_batch_size
    mode = critic.loss_agg_mode or actor.loss_agg_mode
    inherit_scale = mode == actor.loss_agg_mode and AGG_LOSS_MODES.get(mode).reads_loss_scale_factor
    return _fill(
        critic.model_copy(update={"model": critic_model}),
        ppo_mini_batch_size=mini,
        ppo_micro_batch_size_per_gpu=per_rank_mini_batch(
            mini, cfg.actor_rollout_ref.rollout.n, dp_size
        ),
        use_dynamic_bsz=actor.use_dynamic_bsz,
        ppo_epochs=actor.ppo_epochs,
        shuffle=actor.shuffle,
        loss_agg_mode=mode,
        loss_scale_factor=actor.loss_scale_factor if inherit_scale else None,
        zero_stage=actor.zero_stage,
    )


def _fill(section: ConfigModel, /, **inherited: object) -> ConfigModel:
    """Copy ``section`` with each field that is None set from ``inherited`` (set ones are kept)."""
    update = {k: v for k, v in inherited.items() if getattr(section, k) is None}
    return section.model_copy(update=update) if update else section


def compute_derived(cfg: PPORunConfig, warnings: Iterable[str]) -> DerivedConfig:
    """The flags and sizes of a validated (filled) config, with its cross-field ``warnings``
    (``checks.cross_field_warnings``). See ``DerivedConfig`` for each one."""
    actor, critic = cfg.actor_rollout_ref.actor, cfg.critic
    n = cfg.actor_rollout_ref.rollout.n
    dp_size = cfg.trainer.n_gpus_per_node * cfg.trainer.nnodes
    actor_per_rank = per_rank_mini_batch(actor.ppo_mini_batch_size, n, dp_size)
    critic_per_rank = per_rank_mini_batch(critic.ppo_mini_batch_size, n, dp_size)
    return DerivedConfig(
        use_critic=is_critic_used(cfg),
        use_reference_policy=cfg.algorithm.use_kl_in_reward or actor.use_kl_loss,
        reference_in_actor=is_reference_in_actor(cfg),
        use_rm=cfg.reward.reward_model.enable,
        dp_size=dp_size,
        rollout_batch_size=cfg.data.train_batch_size * n,
        actor_mini_batch_size=actor.ppo_mini_batch_size * n,
        actor_mini_batches_per_epoch=cfg.data.train_batch_size // actor.ppo_mini_batch_size,
        actor_mini_batch_size_per_rank=actor_per_rank,
        actor_grad_accum_steps=None
        if actor.use_dynamic_bsz
        else actor_per_rank // actor.ppo_micro_batch_size_per_gpu,
        critic_mini_batch_size=critic.ppo_mini_batch_size * n,
        critic_mini_batch_size_per_rank=critic_per_rank,
        critic_grad_accum_steps=None
        if critic.use_dynamic_bsz
        else critic_per_rank // critic.ppo_micro_batch_size_per_gpu,
        warnings=tuple(warnings),
    )


def is_reference_in_actor(cfg: PPORunConfig) -> bool:
    """The actor trains LoRA adapters whose variant switches off to the base
    (``AdapterVariantSpec.reference_is_base``): its reference policy is its own module with the
    adapters off, whether or not a KL term uses it (verl's ``ref_in_actor``)."""
    adapter = adapter_settings(cfg.actor_rollout_ref.model, "actor_rollout_ref.model")
    return adapter is not None and adapter.spec.reference_is_base


def is_critic_used(cfg: PPORunConfig) -> bool:
    """verl's rule: ``critic.enable`` when set, otherwise whether the estimator needs a critic's
    values (its registry entry's ``needs_values``: of the built-in ones, only GAE)."""
    if cfg.critic.enable is not None:
        return cfg.critic.enable
    return ADV_ESTIMATORS.get(cfg.algorithm.adv_estimator).needs_values
