"""``critic.*``: the value model trained alongside the policy (used by GAE).

Batching keys left null inherit the actor's value, as verl's ``${oc.select:…}`` interpolations
do; the root config fills them in, so a validated ``CriticConfig`` is complete on its own.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from stages.config._base import ConfigModel, Dtype, LossAggMode
from stages.config.schema_actor import AttnImplementation, OptimConfig
from stages.config.schema_lora import LoraKeys


class CriticModelConfig(LoraKeys):
    """The value model: a causal LM whose head is replaced by a scalar value head; its LoRA keys
    are its own (``stages.config.schema_lora``; the value head trains beside the adapters)."""

    path: str | None = Field(
        None, description="Model directory or hub id; null = actor_rollout_ref.model.path (path)"
    )
    trust_remote_code: bool | None = Field(
        None, description="Allow the model's own code; null = actor_rollout_ref.model's (bool)"
    )
    enable_gradient_checkpointing: bool | None = Field(
        None,
        description="Recompute activations in backward; null = actor_rollout_ref.model's (bool)",
    )
    dtype: Dtype | None = Field(
        None, description="Compute dtype; null = actor_rollout_ref.model.dtype (dtype)"
    )
    attn_implementation: AttnImplementation | None = Field(
        None, description="Attention kernel; null = actor_rollout_ref.model's (choice)"
    )
    use_remove_padding: bool | None = Field(
        None,
        description="Packed value and training forwards; null = actor_rollout_ref.model's (bool)",
    )


class CriticOptimConfig(OptimConfig):
    """The critic's AdamW: the actor's schema with verl's critic learning rate."""

    lr: float = Field(1e-5, gt=0, description="Peak learning rate (1/update)")


class CriticConfig(ConfigModel):
    """Value-model training: clipped value loss, batching (inheriting the actor's), optimizer."""

    enable: bool | None = Field(
        None,
        description="Train and use a critic; null = only when algorithm.adv_estimator is gae (bool)",
    )
    strategy: Literal["deepspeed"] = Field(
        "deepspeed",
        description="Training backend [ppoflow: DeepSpeed ZeRO; verl uses fsdp] (choice)",
    )
    model: CriticModelConfig = Field(
        default_factory=CriticModelConfig, description="Value model (section)"
    )
    optim: CriticOptimConfig = Field(
        default_factory=CriticOptimConfig, description="Critic optimizer (section)"
    )
    ppo_mini_batch_size: int | None = Field(
        None,
        ge=1,
        description="Prompts per critic optimizer step (× rollout.n sequences); null = actor's (prompts)",
    )
    ppo_micro_batch_size_per_gpu: int | None = Field(
        None,
        ge=1,
        description="Sequences per forward/backward pass on one rank; null = the rank's whole mini-batch (sequences)",
    )
    use_dynamic_bsz: bool | None = Field(
        None, description="Pack micro-batches by token count; null = actor's (bool)"
    )
    ppo_max_token_len_per_gpu: int = Field(
        32768, ge=1, description="Token budget of one micro-batch when use_dynamic_bsz (tokens)"
    )
    ppo_epochs: int | None = Field(
        None, ge=1, description="Passes over each step's batch; null = actor's (epochs)"
    )
    shuffle: bool | None = Field(
        None, description="Shuffle rows before mini-batching; null = actor's (bool)"
    )
    data_loader_seed: int = Field(42, description="Seed of the mini-batch shuffle (seed)")
    cliprange_value: float = Field(
        0.5, gt=0, description="Value clip: v_pred stays within v_old ± this (value units)"
    )
    loss_agg_mode: LossAggMode | None = Field(
        None, description="Aggregation of the token value losses; null = actor's (choice)"
    )
    loss_scale_factor: float | None = Field(
        None,
        gt=0,
        description="seq-mean-token-sum-norm divisor; null = actor's when the mode is the same, else the padded response length (tokens)",
    )
    zero_stage: Literal[0, 1, 2, 3] | None = Field(
        None, description="DeepSpeed ZeRO stage; null = actor's [ppoflow-only] (stage)"
    )
    param_offload: bool = Field(
        False,
        description="Offload parameters to CPU memory; needs zero_stage 3 [ppoflow-only] (bool)",
    )
    optimizer_offload: bool = Field(
        False,
        description="Offload optimizer state to CPU memory; needs zero_stage ≥ 1 [ppoflow-only] (bool)",
    )
