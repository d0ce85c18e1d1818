"""Cross-field rules of the LoRA keys (``stages.config.schema_lora``) against the rest of the run.

Each returns messages that start with the dotted key(s) at fault, give the values received and
say how to fix them (``stages.config.checks`` collects them). What needs the model directory
(targets matching nothing, an adapter trained on another base) is checked when the run starts,
before any weight is read (:func:`stages.engines.adapters.check_targets_on_meta`,
``check_adapter_dir``, called by ``flows.engines.check_adapters``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from stages.config.derived import is_critic_used, is_reference_in_actor
from stages.engines.adapters import adapter_settings

if TYPE_CHECKING:
    from stages.config.root import PPORunConfig

ARR = "actor_rollout_ref"


def lora_problems(cfg: PPORunConfig) -> list[str]:
    """One spelling per role; a rollout backend the variant can feed."""
    arr = cfg.actor_rollout_ref
    problems = [
        *_one_spelling(arr.model, f"{ARR}.model"),
        *_one_spelling(cfg.critic.model, "critic.model"),
    ]
    adapter = adapter_settings(arr.model, f"{ARR}.model")
    if adapter is None:
        return problems
    spec = adapter.spec
    if arr.rollout.name == "vllm" and not spec.merges:
        problems.append(
            f"{ARR}.model.lora.type = {adapter.variant!r} with {ARR}.rollout.name = 'vllm': not "
            f"implemented ({spec.why_no_merge}); set rollout.name = 'hf' or lora.type = 'lora'"
        )
    return problems


def lora_warnings(cfg: PPORunConfig) -> list[str]:
    """Reference-engine settings that have no effect when the reference is the actor's base
    (verl's LoRA scripts set ``ref.fsdp_config.param_offload``; verl ignores it there too), and
    critic LoRA keys of a run without a critic."""
    arr, warnings = cfg.actor_rollout_ref, []
    if is_reference_in_actor(cfg):
        ref, actor = arr.ref, arr.actor
        if ref.param_offload:
            warnings.append(
                f"{ARR}.ref.param_offload = true has no effect with LoRA on the actor: the "
                "reference is the actor's own module with its adapters off, there is no reference "
                "engine to offload (actor.param_offload offloads the model)"
            )
        if ref.zero_stage != actor.zero_stage:
            warnings.append(
                f"{ARR}.ref.zero_stage = {ref.zero_stage} has no effect with LoRA on the actor: the "
                f"reference is the actor's own module (actor.zero_stage = {actor.zero_stage})"
            )
    critic = adapter_settings(cfg.critic.model, "critic.model")
    if critic is not None and not is_critic_used(cfg):
        warnings.append(
            f"{critic.keys} turns LoRA on for the critic, but this run uses no critic "
            f"(algorithm.adv_estimator = {cfg.algorithm.adv_estimator!r}): it has no effect"
        )
    return warnings


def _one_spelling(model_cfg, prefix: str) -> list[str]:
    """The flat keys and the ``lora:`` block do not both turn adapters on."""
    flat = model_cfg.lora_rank > 0 or bool(model_cfg.lora_adapter_path)
    block = model_cfg.lora.rank > 0 or bool(model_cfg.lora.adapter_path)
    if flat and block:
        return [
            f"{prefix}.lora_rank = {model_cfg.lora_rank} (lora_adapter_path = "
            f"{model_cfg.lora_adapter_path!r}) and {prefix}.lora.rank = {model_cfg.lora.rank} "
            f"(lora.adapter_path = {model_cfg.lora.adapter_path!r}) both turn LoRA on; set one "
            "spelling: the flat keys (verl's FSDP engine) or the lora: block (its Megatron engine)"
        ]
    return []
