"""Rollout backends, looked up by ``actor_rollout_ref.rollout.name``; each entry declares its needs.

A :class:`RolloutBackendSpec` holds the function that generates one response per prompt row on the
actor worker, and what the backend needs from the rest of the config, so the config checks and
the engine builder ask the entry instead of comparing the name:

==========  ==============================  =========================  ==========  ====================
name        generates with                  max_tensor_parallel_size   row_seeded  log_probs_are_actors
==========  ==============================  =========================  ==========  ====================
``hf``      HF decoding on the actor's own  1                          False       True
            module (newest weights): a
            static cache and CUDA graphs
            on CUDA, else ``generate``
``vllm``    a vLLM engine in the actor      any that divides the       True        False
            rank's process, sent the        ranks
            weights after updates
==========  ==============================  =========================  ==========  ====================

At tensor parallelism 1 each actor rank holds its own engine: in the driver on the ``local``
backend, in the rank's process on ``ray`` (vLLM joins the rank's torch.distributed world), so
every device generates and trains. At t > 1 (``ray`` only) one vLLM engine spans t consecutive
actor ranks, each holding its shard in its own process (vLLM's ``external_launcher`` executor,
``roles.vllm_placement``); the actor's :data:`ROLLOUT_METHODS` are then dispatched to each
engine's ranks together (``ranks_per_chunk``, ``stages.engines.dispatch``).

Importing this module imports neither transformers nor vLLM; each ``generate`` imports its
engine on use.

Example:
    >>> ROLLOUT_BACKENDS.get("hf").row_seeded, ROLLOUT_BACKENDS.get("vllm").row_seeded
    (False, True)
    >>> ROLLOUT_BACKENDS.get("hf").log_probs_are_actors, ROLLOUT_BACKENDS.get("vllm").log_probs_are_actors
    (True, False)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from dataproto import DataProto
from dataproto import keys as K
from stages.registry import Registry

#: generate(actor worker, prompts (B, P) DataProto, SamplingSettings) -> rollout DataProto
#: (``prompts``, ``responses``, ``response_mask``, ``rollout_log_probs`` (B, R), full-sequence
#: ``input_ids`` / ``attention_mask`` / ``position_ids`` (B, T)), tensors on the host
GenerateFn = Callable[[Any, DataProto, Any], DataProto]


@dataclass(frozen=True)
class RolloutBackendSpec:
    """One ``ROLLOUT_BACKENDS`` entry.

    Attributes:
        generate: see :data:`GenerateFn`; called by ``ActorWorker.generate_sequences``.
        max_tensor_parallel_size: the largest ``rollout.tensor_model_parallel_size`` it runs
            with; None = any that divides the devices.
        why_max_tensor_parallel: the reason, for the message refusing a larger one.
        runs_tensor_parallel: a tensor-parallel degree above 1 that the config accepts also
            runs (one engine spanning that many ranks); False: the run refuses it.
        row_seeded: a call seeded s samples row i with its own seed s + i, independent of the
            other rows (vLLM's per-request seed), so data-parallel rank k, whose chunk starts at
            row k × len(chunk) of the batch, seeds with s + k × len(chunk) and any rank count
            samples the batch's rows alike; otherwise the call draws from one generator and
            each rank gets a seed of its own (``roles.rank_seed``).
        log_probs_are_actors: its ``rollout_log_probs`` are log softmax(raw logits /
            temperature) of the actor's own module with the step's pre-update weights, the
            quantity the old_log_prob stage recomputes; they differ from a recompute only by
            float rounding (incremental decoding against one full forward), so
            ``algorithm.rollout_correction.bypass_mode`` null reuses them.
        build_replica: (run config, tokenizer) → a copy of the policy apart from the trainer, for a
            schedule that generates while the trainer updates (``stages.engines.rollout_replica``);
            None: the backend has none, and such a schedule refuses it.
    """

    generate: GenerateFn
    max_tensor_parallel_size: int | None
    why_max_tensor_parallel: str
    runs_tensor_parallel: bool
    row_seeded: bool
    log_probs_are_actors: bool
    build_replica: Callable[[Any], Any] | None = None


ROLLOUT_BACKENDS: Registry[RolloutBackendSpec] = Registry("rollout backend")

#: the actor worker's methods that run on its rollout engine: with tensor parallelism t > 1 the
#: engine spans t ranks, which get each call's chunk together (``flows.engines.build_roles``)
ROLLOUT_METHODS = ("generate_sequences",)


def _hf_generate(worker: Any, prompts: DataProto, settings: Any) -> DataProto:
    """HF decoding on the actor's own module (ZeRO-3 parameters gathered around it), by the
    decode path ``rollout_hf.choose_decode_path`` picks: on CUDA a static cache with finished
    rows dropped, its step compiled into CUDA graphs unless ``rollout.enforce_eager`` or
    ZeRO-3; elsewhere HF ``generate`` (``stages.engines.hf_decode``)."""
    from stages.engines.roles import device_of, on_device, on_host
    from stages.engines.rollout_hf import choose_decode_path, generate_sequences

    device = device_of(worker.engine)
    decode = choose_decode_path(
        worker.lm,
        device,
        enforce_eager=worker.config.actor_rollout_ref.rollout.enforce_eager,
        weights_gathered=worker.engine.zero_optimization_stage() == 3,
    )
    with worker.full_parameters():
        out = generate_sequences(worker.lm, on_device(prompts, device), settings, decode.run)
    return on_host(out)


def _vllm_generate(worker: Any, prompts: DataProto, settings: Any) -> DataProto:
    """The actor's vLLM engine (built on first use, weights synced when stale; the probe of
    its last sync is reported with every rollout as ``rollout/weight_sync/*``,
    stages/engines/weight_probe.py). With
    ``rollout.free_cache_engine`` it then sleeps at level 2 where vLLM has a sleep mode (not on
    CPU): the KV cache and the weights are freed, not copied to the host, for the update to use;
    the engine is marked stale, so the next rollout wakes it and loads the actor's weights."""
    from stages.engines.roles import on_host

    engine = worker.vllm_rollout()
    out = engine.generate_sequences(on_host(prompts), settings)
    if engine.last_sync is not None:  # the probe of the weights the engine was last sent
        out.meta_info.setdefault(K.METRICS, {}).update(engine.last_sync.metrics())
    if worker.config.actor_rollout_ref.rollout.free_cache_engine and worker.vllm.sleep(level=2):
        worker.vllm_is_stale = True
    return out


def _hf_replica(config: Any, tokenizer: Any) -> Any:
    from stages.engines.rollout_replica import hf_replica

    return hf_replica(config, tokenizer)


def _vllm_replica(config: Any, tokenizer: Any) -> Any:
    from stages.engines.rollout_replica import vllm_replica

    return vllm_replica(config, tokenizer)


ROLLOUT_BACKENDS.add(
    "hf",
    RolloutBackendSpec(
        generate=_hf_generate,
        build_replica=_hf_replica,
        max_tensor_parallel_size=1,
        why_max_tensor_parallel="it generates on the actor rank's own module",
        runs_tensor_parallel=False,
        row_seeded=False,
        log_probs_are_actors=True,
    ),
)
ROLLOUT_BACKENDS.add(
    "vllm",
    RolloutBackendSpec(
        generate=_vllm_generate,
        build_replica=_vllm_replica,
        max_tensor_parallel_size=None,
        why_max_tensor_parallel="",
        runs_tensor_parallel=True,  # above 1, one engine spans that many ranks (external_launcher)
        row_seeded=True,
        log_probs_are_actors=False,  # its own kernels (and dtype): the recompute is the actor's
    ),
)
