"""The role workers the flow calls: actor (log-probs, PPO update, HF rollouts), reference, critic.

One instance per data-parallel rank, built from the run config (``stages.config.PPORunConfig``)
inside the rank's process; a worker group (``worker_group``) dispatches DataProto batches to
them. Every method takes and returns a DataProto; metrics travel in ``meta_info["metrics"]``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import torch
from tensordict import TensorDict
from torch import Tensor

from dataproto import DataProto, keys
from stages.engines.actor import PPOUpdateSettings, compute_log_prob, update_actor
from stages.engines.adapters import (
    adapter_settings,
    adapters_off,
    merged_named_weights,
    weights_fingerprint,
    with_adapters,
)
from stages.engines.batching import MicroBatching
from stages.engines.checkpoint import load_engine_checkpoint, save_engine_checkpoint
from stages.engines.critic import ValueModel, compute_values, update_critic
from stages.engines.deepspeed_setup import EngineSettings, initialize_engine, step_lr_schedule
from stages.engines.dispatch import chunk_index
from stages.engines.efficiency import PassMeter
from stages.engines.logprob import ResponseLogProbModel
from stages.engines.models import load_causal_lm, load_value_model
from stages.engines.response_hidden import forward_layout
from stages.engines.rollout_backends import ROLLOUT_BACKENDS
from stages.engines.rollout_hf import SamplingSettings

if TYPE_CHECKING:
    from stages.config.schema_actor import ActorConfig, OptimConfig, RefConfig, RolloutConfig
    from stages.config.schema_critic import CriticConfig


def engine_settings(
    role_cfg: ActorConfig | CriticConfig,
    optim: OptimConfig,
    dtype: str,
    total_training_steps: int,
) -> EngineSettings:
    """EngineSettings from an actor/critic config slice and its ``optim`` block."""
    return EngineSettings(
        zero_stage=role_cfg.zero_stage,
        dtype=dtype,
        lr=optim.lr,
        weight_decay=optim.weight_decay,
        betas=tuple(optim.betas),
        clip_grad=optim.clip_grad,
        lr_scheduler=optim.lr_scheduler_type,
        warmup_steps=optim.warmup_steps(total_training_steps),
        total_steps=total_training_steps,
        min_lr_ratio=optim.min_lr_ratio,
        num_cycles=optim.num_cycles,
        offload_optimizer=role_cfg.optimizer_offload,
        offload_param=role_cfg.param_offload,
    )


def reference_settings(ref_cfg: RefConfig, dtype: str) -> EngineSettings:
    """The frozen reference's engine: ``ref.zero_stage`` and ``ref.param_offload`` (no optimizer)."""
    return EngineSettings(
        zero_stage=ref_cfg.zero_stage, dtype=dtype, offload_param=ref_cfg.param_offload
    )


def log_prob_micro_batching(cfg: RolloutConfig | RefConfig) -> MicroBatching:
    """The micro-batching of a log-prob pass from rollout.* / ref.* ``log_prob_*`` keys."""
    return MicroBatching(
        micro_batch_size=cfg.log_prob_micro_batch_size_per_gpu,
        use_dynamic_bsz=bool(cfg.log_prob_use_dynamic_bsz),
        max_token_len=cfg.log_prob_max_token_len_per_gpu,
    )


def sampling_settings(
    config: Any, tokenizer: Any, *, validate: bool, greedy: bool = False
) -> SamplingSettings:
    """Rollout sampling from rollout.* (training) or rollout.val_kwargs.* (validation).

    ``greedy=True`` decodes greedily whatever the config says (``do_sample=False``, temperature 1,
    no top-k / top-p: vLLM gets ``temperature=0``), with the same response length: ReMax's
    baseline rollout (verl's ``do_sample=False`` request). ``rollout.ignore_eos`` applies to every
    call (training, validation, greedy), as verl's rollout config does.
    """
    rollout = config.actor_rollout_ref.rollout
    source = rollout.val_kwargs if validate else rollout
    do_sample = source.do_sample and not greedy
    return SamplingSettings(
        response_length=rollout.response_length,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        temperature=source.temperature if do_sample else 1.0,
        top_p=source.top_p if do_sample else 1.0,
        top_k=source.top_k if do_sample else -1,
        do_sample=do_sample,
        ignore_eos=rollout.ignore_eos,
        max_batch_rows=rollout.max_num_seqs,
    )


def device_of(model: Any) -> torch.device:
    """The device a DeepSpeed engine or a plain module computes on."""
    device = getattr(model, "device", None)
    return torch.device(device) if device is not None else next(model.parameters()).device


def on_device(batch: DataProto, device: torch.device) -> DataProto:
    """A shallow copy of ``batch`` whose tensors live on ``device`` (the caller's batch is not
    moved: ``DataProto.to`` would move it in place)."""
    if batch.batch is None or batch.batch.device == device:
        return batch
    return DataProto(
        batch=batch.batch.to(device),
        non_tensor_batch=batch.non_tensor_batch,
        meta_info=batch.meta_info,
    )


def on_host(delta: DataProto) -> DataProto:
    """``delta`` with its tensors on the CPU, where artifacts are written and batches merged."""
    if delta.batch is not None and delta.batch.device != torch.device("cpu"):
        delta.batch = delta.batch.to("cpu")
    return delta


def with_metrics(batch: DataProto | None, metrics: dict[str, Any]) -> DataProto:
    out = batch if batch is not None else DataProto(batch=None, non_tensor_batch={}, meta_info={})
    out.meta_info["metrics"] = metrics
    return out


class _CheckpointMixin:
    """``save_checkpoint`` / ``load_checkpoint`` of a worker holding a DeepSpeed ``engine``;
    ``adapter``: what its LoRA adapters record (None: full training), see :func:`adapter_record`."""

    engine: Any
    adapter: dict[str, Any] | None = None

    def save_checkpoint(self, directory: str, client_state: dict[str, Any] | None = None) -> str:
        """Weights (the adapters only, with adapters), optimizer, lr schedule and RNG states to
        ``directory`` (atomic)."""
        return str(
            save_engine_checkpoint(
                self.engine, directory, client_state=client_state, adapter=self.adapter
            )
        )

    def load_checkpoint(self, directory: str) -> dict[str, Any]:
        """Restore what :meth:`save_checkpoint` wrote; returns its client_state."""
        return load_engine_checkpoint(self.engine, directory, adapter=self.adapter)


def adapter_record(settings: Any, model_path: str) -> dict[str, Any] | None:
    """What a role's checkpoint records of its adapters: their settings and the fingerprint of
    the base model they sit on (``adapters.weights_fingerprint``); None without adapters."""
    if settings is None:
        return None
    return {**settings.record(), "base_model": weights_fingerprint(model_path)}


def vllm_kv_cache_bytes(rollout: Any, hf_config: Any) -> int:
    """KV-cache bytes for ``max_num_seqs`` sequences of ``max_model_len`` tokens: 2 (K and V) ×
    layers × KV heads × head_dim × bytes per element (rollout.dtype) per token. vLLM on CPU needs
    the size given (its default claims most of the machine's RAM)."""
    head_dim = getattr(hf_config, "head_dim", None) or (
        hf_config.hidden_size // hf_config.num_attention_heads
    )
    kv_heads = getattr(hf_config, "num_key_value_heads", None) or hf_config.num_attention_heads
    element = torch.finfo(getattr(torch, rollout.dtype)).bits // 8  # float32/bfloat16/float16
    per_token = 2 * hf_config.num_hidden_layers * kv_heads * head_dim * element
    return per_token * rollout.max_model_len * rollout.max_num_seqs


def call_settings(
    config: Any,
    tokenizer: Any,
    rows: int,
    validate: bool = False,
    greedy: bool = False,
    seed: int | None = None,
    max_new_tokens: int | None = None,
) -> SamplingSettings:
    """The sampling settings of one ``generate_sequences`` call on ``rows`` prompt rows on this
    rank (:meth:`ActorWorker.generate_sequences` documents the arguments): the ``rollout.*`` /
    ``val_kwargs.*`` settings, ``max_new_tokens`` as the response length, and ``seed`` offset
    for this rank as the backend's entry (``row_seeded``) says."""
    rollout = config.actor_rollout_ref.rollout
    settings = sampling_settings(config, tokenizer, validate=validate, greedy=greedy)
    if max_new_tokens is not None:
        settings = replace(settings, response_length=max_new_tokens)
    if seed is not None:
        chunk = chunk_index(_rank(), rollout.tensor_model_parallel_size)
        seed = (
            rank_seed(seed, 0) + chunk * rows
            if ROLLOUT_BACKENDS.get(rollout.name).row_seeded
            else rank_seed(seed, chunk)
        )
        settings = replace(settings, seed=seed)
    return settings


def build_vllm_rollout(
    config: Any,
    hf_config: Any,
    *,
    tensor_parallel_size: int,
    in_process: bool | None,
    executor: Mapping[str, str],
) -> Any:
    """A ``VLLMRollout`` of :func:`vllm_rollout_arguments`."""
    from stages.engines.rollout_vllm import VLLMRollout

    return VLLMRollout(
        **vllm_rollout_arguments(
            config,
            hf_config,
            tensor_parallel_size=tensor_parallel_size,
            in_process=in_process,
            executor=executor,
        )
    )


def vllm_rollout_arguments(
    config: Any,
    hf_config: Any,
    *,
    tensor_parallel_size: int,
    in_process: bool | None,
    executor: Mapping[str, str],
) -> dict[str, Any]:
    """``VLLMRollout``'s arguments for the run's model directory with the ``rollout.*`` engine
    settings (on the CPU a KV cache of :func:`vllm_kv_cache_bytes` for ``hf_config``), its engine
    core in this process or not (``in_process``), ``executor``: further engine keywords (the
    executor backend); on the CPU, no chunked prefill (the comment below). Plain data, so another
    process can build the same engine."""
    rollout = config.actor_rollout_ref.rollout
    on_cpu = not torch.cuda.is_available()
    return {
        "model_path": str(config.actor_rollout_ref.model.path),
        "dtype": rollout.dtype,
        "max_model_len": rollout.max_model_len,
        "tensor_parallel_size": tensor_parallel_size,
        "gpu_memory_utilization": rollout.gpu_memory_utilization,
        "kv_cache_memory_bytes": vllm_kv_cache_bytes(rollout, hf_config) if on_cpu else None,
        "enforce_eager": rollout.enforce_eager,
        "seed": rollout.seed,
        "in_process": in_process,
        "engine_kwargs": {
            "max_num_seqs": rollout.max_num_seqs,
            "max_num_batched_tokens": rollout.max_num_batched_tokens,
            # a seeded request whose prompt vLLM prefills in chunks rewinds its sampler's
            # generator between chunks, which a CPU generator cannot do ("CPU Generator does
            # not use offset"): on the CPU prompts are prefilled whole
            **({"enable_chunked_prefill": False} if on_cpu else {}),
            **executor,
        },
    }


class ActorWorker(_CheckpointMixin):
    """The policy on a DeepSpeed engine: ``compute_log_prob``, ``update_actor``, rollouts (HF
    ``generate`` on the engine's module, or a vLLM engine when ``rollout.name`` is ``vllm``)."""

    def __init__(self, config: Any, *, total_training_steps: int) -> None:
        from stages.data.tokenizer import load_tokenizer

        self.config = config
        model_cfg, actor = config.actor_rollout_ref.model, config.actor_rollout_ref.actor
        adapter = adapter_settings(model_cfg, "actor_rollout_ref.model")
        lm = with_adapters(
            load_causal_lm(
                model_cfg.path,
                dtype=model_cfg.dtype,
                attn_implementation=model_cfg.attn_implementation,
                gradient_checkpointing=model_cfg.enable_gradient_checkpointing,
                trust_remote_code=model_cfg.trust_remote_code,
            ),
            adapter,
            "CAUSAL_LM",
        )
        self.adapter = adapter_record(adapter, model_cfg.path)
        self.tokenizer = load_tokenizer(model_cfg.tokenizer_path or model_cfg.path)
        settings = engine_settings(actor, actor.optim, model_cfg.dtype, total_training_steps)
        self.engine = initialize_engine(
            ResponseLogProbModel(lm, forward_layout(model_cfg.use_remove_padding)), settings
        )
        self.update_settings = PPOUpdateSettings(
            mini_batch_size=config.derived.actor_mini_batch_size_per_rank,
            epochs=actor.ppo_epochs,
            shuffle=actor.shuffle,
            seed=actor.data_loader_seed + _rank(),
            micro=MicroBatching(
                actor.ppo_micro_batch_size_per_gpu,
                actor.use_dynamic_bsz,
                actor.ppo_max_token_len_per_gpu,
            ),
            loss_scale_factor=actor.loss_scale_factor,
        )
        self.vllm: Any = None  # the VLLMRollout, built on the first vLLM rollout
        self.vllm_is_stale = False  # the actor's weights changed since vLLM last got them
        device = device_of(self.engine)
        self.update_meter = PassMeter("perf/mfu/actor", "actor", lm.config, device, backward=True)
        self.infer_meter = PassMeter(
            "perf/mfu/actor_infer", "actor", lm.config, device, backward=False
        )

    @property
    def lm(self) -> torch.nn.Module:
        """The Hugging Face model inside the engine (generation, export, weight sync); with LoRA
        the PEFT model wrapping it (generating with its adapters on)."""
        return self.engine.module.lm

    def compute_ref_log_prob(self, batch: DataProto) -> DataProto:
        """Delta: ``ref_log_prob`` (B, R) at meta_info temperature, from this actor's own module
        with its LoRA adapters off: the base model (``derived.reference_in_actor``; ref.*
        micro-batching). An actor without adapters refuses: its reference is a model of its own."""
        self.engine.eval()
        try:
            with adapters_off(self.lm):
                delta, _ = compute_log_prob(
                    self.engine,
                    on_device(batch, device_of(self.engine)),
                    log_prob_micro_batching(self.config.actor_rollout_ref.ref),
                )
        finally:
            self.engine.train()
        return ref_log_prob_delta(delta)

    def compute_log_prob(self, batch: DataProto) -> DataProto:
        """Delta: ``old_log_probs`` (B, R) and ``entropys`` (B, R) at meta_info temperature."""
        batch = on_device(batch, device_of(self.engine))
        efficiency: dict[str, float] = {}
        self.engine.eval()
        try:
            with self.infer_meter.measure(batch.batch[keys.ATTENTION_MASK], efficiency):
                delta, _ = compute_log_prob(
                    self.engine,
                    batch,
                    log_prob_micro_batching(self.config.actor_rollout_ref.rollout),
                    calculate_entropy=True,
                )
        finally:
            self.engine.train()
        return with_metrics(on_host(delta), efficiency)

    def update_actor(self, batch: DataProto) -> DataProto:
        """One training step's PPO update; metrics (``actor/*``) in meta_info; then the lr
        schedule advances by one step."""
        actor = self.config.actor_rollout_ref.actor
        # bypass mode runs no old_log_prob pass, which measures actor/entropy: the update does
        bypass = bool(self.config.algorithm.rollout_correction.bypass_mode)
        needs_entropy = actor.entropy_coeff != 0 or actor.calculate_entropy or bypass
        batch = on_device(batch, device_of(self.engine))
        efficiency: dict[str, float] = {}
        with self.update_meter.measure(
            batch.batch[keys.ATTENTION_MASK], efficiency, passes=actor.ppo_epochs
        ):
            metrics = update_actor(
                self.engine, batch, self.update_settings, actor, needs_entropy=needs_entropy
            )
        metrics.update(efficiency)
        step_lr_schedule(self.engine)
        self.vllm_is_stale = True
        return with_metrics(None, metrics)

    def load_checkpoint(self, directory: str) -> dict[str, Any]:
        """Restore a :meth:`save_checkpoint` directory; the vLLM engine gets the weights before
        its next rollout."""
        self.vllm_is_stale = True
        return super().load_checkpoint(directory)

    def generate_sequences(
        self,
        prompts: DataProto,
        validate: bool = False,
        greedy: bool = False,
        seed: int | None = None,
        max_new_tokens: int | None = None,
    ) -> DataProto:
        """One response per prompt row (``rollout_hf``'s layout) from the ``rollout.name`` entry of
        ``ROLLOUT_BACKENDS``: HF ``generate`` on the actor's module (``hf``), or the vLLM engine
        of :meth:`vllm_rollout` (``vllm``).

        ``validate``: sample with rollout.val_kwargs.*; ``greedy``: decode greedily (ReMax's
        baseline; see :func:`sampling_settings`); ``seed``: sample with that seed, the same
        responses in any process: offset by this rank's first row in the batch where the backend
        seeds each row (``row_seeded``: any rank count samples alike), else by the rank's chunk
        index (:func:`rank_seed`: ranks draw differently). The ranks of one tensor-parallel engine
        (``rollout.tensor_model_parallel_size`` consecutive ranks) got one chunk together and
        seed alike (:func:`chunk_index`). ``max_new_tokens``: generate at most that many tokens
        (the output is that wide) instead of ``rollout.response_length``: an agent loop's turn
        gets the rest of its trajectory's budget (``stages.agent.rollout``)."""
        settings = call_settings(
            self.config, self.tokenizer, len(prompts), validate, greedy, seed, max_new_tokens
        )
        return ROLLOUT_BACKENDS.get(self.config.actor_rollout_ref.rollout.name).generate(
            self, prompts, settings
        )

    def vllm_rollout(self) -> Any:
        """The ``VLLMRollout`` holding the actor's current weights: built on first use from the
        model directory (rollout.* engine settings), and sent the actor's weights
        (:meth:`named_weights`) whenever an update or a checkpoint load changed them since."""
        if self.vllm is None:
            rollout = self.config.actor_rollout_ref.rollout
            in_process, executor = vllm_placement(
                rollout.tensor_model_parallel_size, _world_size(), os.environ
            )
            self.vllm = build_vllm_rollout(
                self.config,
                self.lm.config,
                tensor_parallel_size=rollout.tensor_model_parallel_size,
                in_process=in_process,
                executor=executor,
            )
        if self.vllm_is_stale:
            self.vllm.sync_weights(self.named_weights())
            self.vllm_is_stale = False
        return self.vllm

    def close(self) -> None:
        """Shut the vLLM engine down (if one was built); the DeepSpeed engine goes with the worker."""
        if self.vllm is not None:
            self.vllm.close()
            self.vllm = None

    def full_weights(self) -> dict[str, Tensor] | None:
        """Every HF parameter's full tensor (:meth:`named_weights`: gathered under ZeRO-3,
        merged with LoRA) on rank 0, None on the other ranks, which take part in the gathers;
        for a rollout replica apart from the ranks (``stages.engines.rollout_replica``). In this
        process the tensors are the parameters themselves where no gather or merge made new
        ones (the caller copies them)."""
        weights = {name: tensor.detach().cpu() for name, tensor in self.named_weights()}
        return weights if _rank() == 0 else None

    def named_weights(self) -> Iterator[tuple[str, Tensor]]:
        """(name, full tensor) of every HF parameter, lazily, for syncing an external rollout
        engine. Under ZeRO-3 each parameter is gathered alone and copied out of the gather before
        it is yielded, so at most one full parameter beyond this rank's partition is held at a
        time (every rank must read the stream to its end, in the same order: each gather is a
        collective); otherwise the parameters themselves are yielded (no copy). With LoRA
        adapters: the base model's names, each adapted weight merged, W + (α/r)·B·A, into a new
        tensor (``adapters.merged_named_weights``; adapter and base untouched)."""
        if self.adapter is not None:
            yield from merged_named_weights(self.lm, self._gather())
            return
        if self.engine.zero_optimization_stage() != 3:
            for name, param in self.lm.named_parameters():
                yield name, param.detach()
            return
        import deepspeed

        for name, param in self.lm.named_parameters():
            with deepspeed.zero.GatheredParameters([param]):
                full = param.detach().clone()
            yield name, full

    def _gather(self):
        """ZeRO-3: ``GatheredParameters`` (a context over a list of parameters); else None."""
        if self.engine.zero_optimization_stage() != 3:
            return None
        import deepspeed

        return lambda params: deepspeed.zero.GatheredParameters(params)

    @contextmanager
    def full_parameters(self):
        """ZeRO-3 keeps 1/d of each parameter per rank: gather them for generation / export."""
        if self.engine.zero_optimization_stage() == 3:
            import deepspeed

            with deepspeed.zero.GatheredParameters(list(self.lm.parameters())):
                yield
        else:
            yield


class RefWorker:
    """The frozen reference policy: ``compute_ref_log_prob`` only, no optimizer state."""

    def __init__(self, config: Any) -> None:
        model_cfg, ref = config.actor_rollout_ref.model, config.actor_rollout_ref.ref
        lm = load_causal_lm(
            model_cfg.path,
            dtype=model_cfg.dtype,
            attn_implementation=model_cfg.attn_implementation,
            trust_remote_code=model_cfg.trust_remote_code,
        )
        self.config = config
        self.model = initialize_engine(
            ResponseLogProbModel(lm, forward_layout(model_cfg.use_remove_padding)),
            reference_settings(ref, model_cfg.dtype),
            trainable=False,
        )

    def compute_ref_log_prob(self, batch: DataProto) -> DataProto:
        """Delta: ``ref_log_prob`` (B, R) at meta_info temperature."""
        delta, _ = compute_log_prob(
            self.model,
            on_device(batch, device_of(self.model)),
            log_prob_micro_batching(self.config.actor_rollout_ref.ref),
        )
        return ref_log_prob_delta(delta)


def ref_log_prob_delta(delta: DataProto) -> DataProto:
    """A log-prob pass's ``old_log_probs`` (B, R), on the host, as the ``ref_log_prob`` delta."""
    logprobs = delta.batch[keys.OLD_LOG_PROBS].cpu()
    return DataProto(
        batch=TensorDict({keys.REF_LOG_PROB: logprobs}, batch_size=[len(logprobs)]),
        non_tensor_batch={},
        meta_info={},
    )


class CriticWorker(_CheckpointMixin):
    """The value model on a DeepSpeed engine: ``compute_values`` and ``update_critic``."""

    def __init__(self, config: Any, *, total_training_steps: int) -> None:
        self.config = config
        critic = config.critic
        adapter = adapter_settings(critic.model, "critic.model")
        backbone = with_adapters(
            load_value_model(
                critic.model.path,
                dtype=critic.model.dtype,
                attn_implementation=critic.model.attn_implementation,
                gradient_checkpointing=critic.model.enable_gradient_checkpointing,
                trust_remote_code=critic.model.trust_remote_code,
            ),
            adapter,
            "TOKEN_CLS",
        )
        self.adapter = adapter_record(adapter, critic.model.path)
        settings = engine_settings(critic, critic.optim, critic.model.dtype, total_training_steps)
        self.engine = initialize_engine(
            ValueModel(backbone, forward_layout(critic.model.use_remove_padding)), settings
        )
        self.micro = MicroBatching(
            critic.ppo_micro_batch_size_per_gpu,
            critic.use_dynamic_bsz,
            critic.ppo_max_token_len_per_gpu,
        )
        self.update_settings = PPOUpdateSettings(
            mini_batch_size=config.derived.critic_mini_batch_size_per_rank,
            epochs=critic.ppo_epochs,
            shuffle=critic.shuffle,
            seed=critic.data_loader_seed + _rank(),
            micro=self.micro,
            loss_scale_factor=critic.loss_scale_factor,
        )
        self.update_meter = PassMeter(
            "perf/mfu/critic", "critic", backbone.config, device_of(self.engine), backward=True
        )

    def compute_values(self, batch: DataProto) -> DataProto:
        """Delta: ``values`` (B, R) of the responses (critic.ppo_micro_batch_size_per_gpu rows
        per forward)."""
        self.engine.eval()
        try:
            return on_host(
                compute_values(self.engine, on_device(batch, device_of(self.engine)), self.micro)
            )
        finally:
            self.engine.train()

    def update_critic(self, batch: DataProto) -> DataProto:
        """One training step's value update; metrics (``critic/*``) in meta_info; then the lr
        schedule advances by one step."""
        batch = on_device(batch, device_of(self.engine))
        efficiency: dict[str, float] = {}
        with self.update_meter.measure(
            batch.batch[keys.ATTENTION_MASK], efficiency, passes=self.config.critic.ppo_epochs
        ):
            metrics = update_critic(self.engine, batch, self.update_settings, self.config.critic)
        metrics.update(efficiency)
        step_lr_schedule(self.engine)
        return with_metrics(None, metrics)


def vllm_placement(
    tensor_parallel_size: int, world_size: int, environ: Mapping[str, str]
) -> tuple[bool | None, dict[str, str]]:
    """Where the actor's vLLM engine runs: ``(in_process, engine kwargs)`` for ``VLLMRollout``.

    - tensor parallelism 1: in the actor's own process (weights then reach it as the actor's
      own tensors, streamed, with no copy: 8.7× faster than across processes for a
      100M-parameter model on CPU, bench/weight_sync.py);
    - ``tensor_parallel_size`` t > 1 in a rank of a torch.distributed world of ``world_size``
      ranks (the ray backend): one engine spans t consecutive ranks, each rank holding its
      shard in its own process (vLLM's ``external_launcher`` executor, which builds its
      tensor-parallel groups from the ranks' world: ranks t·j … t·j + t − 1 form engine j);
      ``world_size`` must be a multiple of t;
    - t > 1 outside a world (``world_size`` 1): vLLM's own worker processes.

    ``in_process`` is None (vLLM reads its variable) where ``VLLM_ENABLE_V1_MULTIPROCESSING`` is
    in ``environ``, except for an engine spanning ranks, which must run in process.

    >>> vllm_placement(1, 2, {}), vllm_placement(2, 1, {})
    ((True, {}), (False, {}))
    >>> vllm_placement(2, 4, {})
    (True, {'distributed_executor_backend': 'external_launcher'})
    >>> vllm_placement(1, 1, {"VLLM_ENABLE_V1_MULTIPROCESSING": "1"})
    (None, {})
    """
    from stages.engines.rollout_vllm import MULTIPROCESSING_SWITCH

    user_set = MULTIPROCESSING_SWITCH in environ
    if tensor_parallel_size == 1 or world_size == 1:
        return (None if user_set else tensor_parallel_size == 1), {}
    if world_size % tensor_parallel_size:
        raise ValueError(
            f"actor_rollout_ref.rollout.tensor_model_parallel_size={tensor_parallel_size} does "
            f"not divide the {world_size} actor ranks; each vLLM engine spans that many ranks"
        )
    if environ.get(MULTIPROCESSING_SWITCH, "0") != "0":
        raise ValueError(
            f"{MULTIPROCESSING_SWITCH}={environ[MULTIPROCESSING_SWITCH]}: a vLLM engine spanning "
            f"{tensor_parallel_size} ranks runs in the ranks' own processes (external_launcher); "
            "unset it or set it to 0"
        )
    return True, {"distributed_executor_backend": "external_launcher"}


def rank_seed(seed: int, rank: int) -> int:
    """The sampling seed of data-parallel rank ``rank`` for a call seeded ``seed``: below 2**62,
    with room for one seed per row above it (vLLM).

    >>> rank_seed(5, 0), rank_seed(5, 1) != rank_seed(5, 0)
    (5, True)
    """
    return (seed + rank * 0x9E3779B97F4A7C15) % 2**62


def _rank() -> int:
    return torch.distributed.get_rank() if torch.distributed.is_initialized() else 0


def _world_size() -> int:
    return torch.distributed.get_world_size() if torch.distributed.is_initialized() else 1
