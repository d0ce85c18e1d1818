"""``actor_rollout_ref.*``: the policy model, its PPO update, its rollout and the reference policy.

Key names are verl's (``actor_rollout_ref.actor.clip_ratio``, ``…rollout.n``, …). ppoflow trains
with DeepSpeed ZeRO instead of FSDP, so verl's ``fsdp_config`` block is replaced by the flat
``zero_stage`` / ``param_offload`` / ``optimizer_offload`` keys.

The defaults of the loss settings (clipping, sapo's temperatures, aggregation, entropy and KL-loss
terms, ``policy_loss.*``) are the math's own (:mod:`stages.algos.defaults`), which the losses also
fall back to when a verl-style config leaves a field out: one source.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from stages.algos.defaults import ACTOR_LOSS_DEFAULTS, POLICY_LOSS_DEFAULTS
from stages.config._base import ConfigModel, Dtype, LossAggMode
from stages.config.choices import KlEstimatorName, PolicyLossName, RolloutBackendName
from stages.config.schema_agent import AgentConfig, MultiTurnConfig
from stages.config.schema_lora import LoraKeys

AttnImplementation = Literal["eager", "sdpa", "flash_attention_2"]


class ModelConfig(LoraKeys):
    """The Hugging Face model shared by actor, rollout and reference policy, and its LoRA keys
    (``stages.config.schema_lora``: with adapters the reference is this model with them off)."""

    path: str = Field(
        "~/models/deepseek-llm-7b-chat",
        description="Model directory or hub id; relative paths are read from the working directory (path)",
    )
    tokenizer_path: str | None = Field(
        None, description="Tokenizer directory or hub id; null = path (path)"
    )
    trust_remote_code: bool = Field(
        False, description="Allow the model's own Python code from its directory or hub repo (bool)"
    )
    enable_gradient_checkpointing: bool = Field(
        True, description="Recompute activations in the backward pass to save memory (bool)"
    )
    dtype: Dtype = Field(
        "bfloat16",
        description="Compute dtype of the engines; float32 for exact CPU runs [ppoflow: one key for verl's fsdp_config.dtype] (dtype)",
    )
    attn_implementation: AttnImplementation = Field(
        "sdpa",
        description="Attention kernel passed to transformers [ppoflow: verl defaults to flash_attention_2] (choice)",
    )
    use_remove_padding: bool = Field(
        True,
        description="Packed forwards: the actor's and reference's log-prob and training forwards run on the rows' real tokens back to back; false runs them on the columns some row needs (bool)",
    )


class OptimConfig(ConfigModel):
    """AdamW with an optional warm-up and a constant or cosine schedule."""

    lr: float = Field(1e-6, gt=0, description="Peak learning rate (1/update)")
    weight_decay: float = Field(0.01, ge=0, description="Decoupled AdamW weight decay (ratio)")
    betas: tuple[float, float] = Field(
        (0.9, 0.999), description="AdamW (beta1, beta2) moment decay rates (ratio, ratio)"
    )
    clip_grad: float = Field(
        1.0, gt=0, description="Clip the gradient's global L2 norm to this (norm)"
    )
    lr_warmup_steps_ratio: float = Field(
        0.0, ge=0, le=1, description="Warm-up length as a fraction of total training steps (ratio)"
    )
    lr_warmup_steps: int = Field(
        -1, ge=-1, description="Warm-up length; -1 = use lr_warmup_steps_ratio (steps)"
    )
    lr_scheduler_type: Literal["constant", "cosine"] = Field(
        "constant", description="Learning-rate schedule after warm-up (choice)"
    )
    min_lr_ratio: float = Field(
        0.0, ge=0, le=1, description="Cosine schedule floor as a fraction of lr (ratio)"
    )
    num_cycles: float = Field(
        0.5,
        gt=0,
        description="Cosine cycles over the schedule; 0.5 = one half-cosine decay (cycles)",
    )

    def warmup_steps(self, total_training_steps: int) -> int:
        """Warm-up length in optimizer-schedule steps: ``lr_warmup_steps`` if ≥ 0, else
        ``int(lr_warmup_steps_ratio × total_training_steps)`` (verl's rule).

        >>> OptimConfig(lr_warmup_steps_ratio=0.1).warmup_steps(25)
        2
        >>> OptimConfig(lr_warmup_steps=3, lr_warmup_steps_ratio=0.5).warmup_steps(25)
        3
        """
        if self.lr_warmup_steps >= 0:
            return self.lr_warmup_steps
        return int(self.lr_warmup_steps_ratio * total_training_steps)


class PolicyLossConfig(ConfigModel):
    """Which policy loss the actor minimizes, and the knobs of the covariance-based ones."""

    loss_mode: PolicyLossName = Field(
        POLICY_LOSS_DEFAULTS["loss_mode"],
        description="Policy loss: a name in the loss registry (stages.algos.policy_loss_config.POLICY_LOSSES), a ppoflow.plugins module's included (name)",
    )
    clip_cov_ratio: float = Field(
        POLICY_LOSS_DEFAULTS["clip_cov_ratio"],
        gt=0,
        le=1,
        description="clip_cov: fraction of valid tokens detached (ratio)",
    )
    clip_cov_lb: float = Field(
        POLICY_LOSS_DEFAULTS["clip_cov_lb"],
        description="clip_cov: lower bound of the centered covariance window (covariance)",
    )
    clip_cov_ub: float = Field(
        POLICY_LOSS_DEFAULTS["clip_cov_ub"],
        description="clip_cov: upper bound of the centered covariance window (covariance)",
    )
    kl_cov_ratio: float = Field(
        POLICY_LOSS_DEFAULTS["kl_cov_ratio"],
        gt=0,
        le=1,
        description="kl_cov: fraction of valid tokens given the KL penalty (ratio)",
    )
    ppo_kl_coef: float = Field(
        POLICY_LOSS_DEFAULTS["ppo_kl_coef"],
        ge=0,
        description="kl_cov: coefficient of |log ratio| on the selected tokens (coefficient)",
    )


class ActorConfig(ConfigModel):
    """The PPO update of the policy: batching, clipping, loss aggregation, KL loss, optimizer."""

    strategy: Literal["deepspeed"] = Field(
        "deepspeed",
        description="Training backend [ppoflow: DeepSpeed ZeRO; verl uses fsdp] (choice)",
    )
    ppo_mini_batch_size: int = Field(
        256,
        ge=1,
        description="Prompts per optimizer step; × rollout.n sequences, split over DP ranks (prompts)",
    )
    ppo_micro_batch_size_per_gpu: int | None = Field(
        None,
        ge=1,
        description="Sequences per forward/backward pass on one rank; null = the rank's whole mini-batch [ppoflow: verl requires it] (sequences)",
    )
    use_dynamic_bsz: bool = Field(
        False,
        description="Pack micro-batches by token count (ppo_max_token_len_per_gpu) instead of by sequence count (bool)",
    )
    ppo_max_token_len_per_gpu: int = Field(
        16384, ge=1, description="Token budget of one micro-batch when use_dynamic_bsz (tokens)"
    )
    ppo_epochs: int = Field(1, ge=1, description="Passes over each step's batch (epochs)")
    shuffle: bool = Field(
        False, description="Shuffle rows before splitting into mini-batches (bool)"
    )
    data_loader_seed: int = Field(
        42, description="Seed of the mini-batch shuffle; + DP rank on each rank (seed)"
    )
    clip_ratio: float = Field(
        ACTOR_LOSS_DEFAULTS["clip_ratio"],
        gt=0,
        lt=1,
        description="PPO clip range ε; the fallback for clip_ratio_low/high (ratio)",
    )
    clip_ratio_low: float | None = Field(
        ACTOR_LOSS_DEFAULTS["clip_ratio_low"],
        gt=0,
        lt=1,
        description="Lower clip ε_low (ratio ≥ 1 − ε_low); null = clip_ratio [ppoflow: verl defaults to 0.2, so clip_ratio alone changes neither side] (ratio)",
    )
    clip_ratio_high: float | None = Field(
        ACTOR_LOSS_DEFAULTS["clip_ratio_high"],
        gt=0,
        description="Upper clip ε_high (ratio ≤ 1 + ε_high); null = clip_ratio [ppoflow: verl defaults to 0.2] (ratio)",
    )
    clip_ratio_c: float = Field(
        ACTOR_LOSS_DEFAULTS["clip_ratio_c"],
        gt=1,
        description="Dual-clip bound c for negative advantages; must be > 1 (ratio)",
    )
    tau_pos: float = Field(
        ACTOR_LOSS_DEFAULTS["tau_pos"],
        gt=0,
        description="sapo: gate temperature for A > 0 (temperature)",
    )
    tau_neg: float = Field(
        ACTOR_LOSS_DEFAULTS["tau_neg"],
        gt=0,
        description="sapo: gate temperature for A ≤ 0 (temperature)",
    )
    policy_loss: PolicyLossConfig = Field(
        default_factory=PolicyLossConfig, description="Policy loss choice and its knobs (section)"
    )
    loss_agg_mode: LossAggMode = Field(
        ACTOR_LOSS_DEFAULTS["loss_agg_mode"],
        description="How token losses become one loss; token-mean divides by the mini-batch's token count summed over all DP ranks, which ppoflow always passes, so any DP size is valid (choice)",
    )
    loss_scale_factor: float | None = Field(
        None,
        gt=0,
        description="seq-mean-token-sum-norm divisor; null = the padded response length; only valid with that mode (tokens)",
    )
    entropy_coeff: float = Field(
        ACTOR_LOSS_DEFAULTS["entropy_coeff"],
        description="Weight of the entropy bonus subtracted from the policy loss (coefficient)",
    )
    calculate_entropy: bool = Field(
        False, description="Compute the entropy even when entropy_coeff is 0, for metrics (bool)"
    )
    use_kl_loss: bool = Field(
        ACTOR_LOSS_DEFAULTS["use_kl_loss"],
        description="Add kl_loss_coef × KL(π‖π_ref) to the actor loss; needs the reference policy (bool)",
    )
    kl_loss_coef: float = Field(
        ACTOR_LOSS_DEFAULTS["kl_loss_coef"], ge=0, description="Weight of the KL loss (coefficient)"
    )
    kl_loss_type: KlEstimatorName = Field(
        ACTOR_LOSS_DEFAULTS["kl_loss_type"],
        description="KL estimator of the KL loss; '+' = k2 gradient (name)",
    )
    optim: OptimConfig = Field(default_factory=OptimConfig, description="Actor optimizer (section)")
    zero_stage: Literal[0, 1, 2, 3] = Field(
        3,
        description="DeepSpeed ZeRO stage: 0 none, 1 optimizer state, 2 + gradients, 3 + parameters sharded [ppoflow-only; 3 matches verl's FSDP full sharding] (stage)",
    )
    param_offload: bool = Field(
        False,
        description="Offload parameters to CPU memory; needs zero_stage 3 [ppoflow-only] (bool)",
    )
    optimizer_offload: bool = Field(
        False,
        description="Offload optimizer state to CPU memory; needs zero_stage ≥ 1 [ppoflow-only] (bool)",
    )


class ValKwargsConfig(ConfigModel):
    """Sampling used for validation rollouts (greedy by default)."""

    n: int = Field(1, ge=1, description="Samples per validation prompt (samples)")
    temperature: float = Field(0.0, ge=0, description="Sampling temperature (temperature)")
    top_p: float = Field(1.0, gt=0, le=1, description="Nucleus sampling mass (probability)")
    top_k: int = Field(-1, ge=-1, description="Top-k sampling; -1 = off (tokens)")
    do_sample: bool = Field(False, description="Sample; false = greedy decoding (bool)")


class RolloutConfig(ConfigModel):
    """Generation: backend, sampling, lengths, and the log-prob passes that share its batching."""

    name: RolloutBackendName = Field(
        "vllm",
        description="Rollout backend, a name in stages.engines.rollout_backends.ROLLOUT_BACKENDS: hf generate or vLLM [ppoflow: verl requires it to be set] (choice)",
    )
    n: int = Field(1, ge=1, description="Responses sampled per prompt, the group size G (samples)")
    temperature: float = Field(1.0, ge=0, description="Sampling temperature (temperature)")
    top_p: float = Field(1.0, gt=0, le=1, description="Nucleus sampling mass (probability)")
    top_k: int = Field(-1, ge=-1, description="Top-k sampling; -1 = off (tokens)")
    do_sample: bool = Field(True, description="Sample; false = greedy decoding (bool)")
    ignore_eos: bool = Field(False, description="Keep generating past the EOS token (bool)")
    prompt_length: int | None = Field(
        None,
        ge=1,
        description="Prompt width given to the engine; null = data.max_prompt_length (tokens)",
    )
    response_length: int | None = Field(
        None,
        ge=1,
        description="Most tokens generated per response; null = data.max_response_length (tokens)",
    )
    dtype: Dtype = Field("bfloat16", description="Dtype of the generation engine's weights (dtype)")
    seed: int = Field(42, description="Seed of the generation engine's sampler (seed)")
    tensor_model_parallel_size: int = Field(
        2,
        ge=1,
        description="vLLM tensor-parallel degree: one engine spans this many actor ranks (ray backend), hf needs 1 (devices)",
    )
    gpu_memory_utilization: float = Field(
        0.5, gt=0, le=1, description="Fraction of device memory vLLM may take (ratio)"
    )
    enforce_eager: bool = Field(
        False,
        description="Disable CUDA graphs: vLLM's, and the hf rollout's compiled decode on CUDA (bool)",
    )
    free_cache_engine: bool = Field(
        True, description="vLLM: release the KV cache between rollouts (bool)"
    )
    max_num_batched_tokens: int = Field(
        8192, ge=1, description="vLLM: token budget of one scheduler step (tokens)"
    )
    max_num_seqs: int = Field(256, ge=1, description="vLLM: most sequences in flight (sequences)")
    max_model_len: int | None = Field(
        None,
        ge=1,
        description="vLLM: context length; null = prompt_length + response_length (tokens)",
    )
    log_prob_micro_batch_size_per_gpu: int | None = Field(
        None,
        ge=1,
        description="Sequences per log-prob forward pass on one rank; null = actor.ppo_micro_batch_size_per_gpu (sequences)",
    )
    log_prob_use_dynamic_bsz: bool | None = Field(
        None,
        description="Pack log-prob micro-batches by tokens; null = actor.use_dynamic_bsz (bool)",
    )
    log_prob_max_token_len_per_gpu: int | None = Field(
        None,
        ge=1,
        description="Token budget of a log-prob micro-batch; null = actor.ppo_max_token_len_per_gpu (tokens)",
    )
    val_kwargs: ValKwargsConfig = Field(
        default_factory=ValKwargsConfig, description="Sampling for validation (section)"
    )
    multi_turn: MultiTurnConfig = Field(
        default_factory=MultiTurnConfig, description="Multi-turn rollouts with tools (section)"
    )
    agent: AgentConfig = Field(
        default_factory=AgentConfig, description="Agent-loop selection (section)"
    )


class RefConfig(ConfigModel):
    """The frozen reference policy (used for the KL loss or the KL-in-reward penalty)."""

    log_prob_micro_batch_size_per_gpu: int | None = Field(
        None,
        ge=1,
        description="Sequences per forward pass on one rank; null = actor.ppo_micro_batch_size_per_gpu (sequences)",
    )
    log_prob_use_dynamic_bsz: bool | None = Field(
        None, description="Pack micro-batches by tokens; null = actor.use_dynamic_bsz (bool)"
    )
    log_prob_max_token_len_per_gpu: int | None = Field(
        None,
        ge=1,
        description="Token budget of a micro-batch; null = actor.ppo_max_token_len_per_gpu (tokens)",
    )
    zero_stage: Literal[0, 1, 2, 3] | None = Field(
        None,
        description="ZeRO stage of the reference engine; null = actor.zero_stage [ppoflow-only] (stage)",
    )
    param_offload: bool = Field(
        False, description="Offload reference parameters to CPU memory; needs zero_stage 3 (bool)"
    )


class ActorRolloutRefConfig(ConfigModel):
    """verl's ``actor_rollout_ref`` block: one model, three roles."""

    model: ModelConfig = Field(default_factory=ModelConfig, description="Policy model (section)")
    actor: ActorConfig = Field(default_factory=ActorConfig, description="Policy update (section)")
    rollout: RolloutConfig = Field(
        default_factory=RolloutConfig, description="Generation (section)"
    )
    ref: RefConfig = Field(default_factory=RefConfig, description="Reference policy (section)")
