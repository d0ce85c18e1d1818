"""A copy of the policy apart from the trainer: the rollout engine of a schedule that generates
while the trainer updates (``stages.schedules``, ``rollout_apart``).

A replica holds the weights of the last :meth:`ProcessReplica.sync` and nothing else changes
them, so a batch it generates while the actor updates is the batch those weights generate. It is
called like a worker group (``call("generate_sequences", prompts, **kwargs)``, the actor worker's
keyword arguments, sampling settings from :func:`~stages.engines.roles.call_settings`), so the
rollout stage runs on it unchanged, given it as its ``actor`` engine.

Every backend's replica is :class:`ProcessReplica`: one process of its own (spawned, so its torch
RNG is its own: the main process's draws cannot move its sampling, and the other way round),
holding the engine its registry entry names (``RolloutBackendSpec.build_replica``):

- ``hf``: HF decoding on the model (:class:`HFChild`: ``generate``, or on CUDA a static cache and
  CUDA graphs); on the CPU its parameters are views of the shared buffers, so a sync copies
  nothing more;
- ``vllm``: a vLLM engine whose engine core runs in that process (:class:`VLLMChild`), loaded
  from the shared buffers as vLLM's own sync loads weights. On the CPU vLLM otherwise runs its
  engine core and its worker as two processes, the engine core polling the worker while it
  generates: a third process's worth of CPU taken from the trainer beside it.

The trainer fills shared-memory buffers at each sync (one copy per parameter, no pickling of
weights); prompts and responses go through a pipe. The process ends when its pipe's other end
closes: with the trainer, however that ends.

A replica runs beside the driver, whatever the worker backend: its weights come from the actor's
rank 0 (``ActorWorker.full_weights``: gathered under ZeRO-3, merged with LoRA), and it generates
the whole batch.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import traceback
from collections.abc import Iterable
from typing import Any

import torch
from torch import Tensor

from dataproto import DataProto
from dataproto import keys as K
from stages.engines.rollout_backends import ROLLOUT_METHODS
from stages.engines.weight_probe import SyncCheck, SyncProbe, engine_digests, is_probed


def _check_method(method: str) -> None:
    if method not in ROLLOUT_METHODS:
        raise ValueError(
            f"a rollout replica runs only {ROLLOUT_METHODS}; {method!r} runs on the actor"
        )


def _as_tensors(batch: DataProto) -> dict[str, Tensor]:
    return {name: batch.batch[name] for name in batch.batch.keys()}  # noqa: SIM118


class ProcessReplica:
    """A backend's replica (module docstring), for the run config ``config`` (the model
    directory and the sampling settings) and its tokenizer; the process starts here and builds
    its engine, ``child(spec)`` (:class:`HFChild`, :class:`VLLMChild`), onto the GPU where this
    process sees one."""

    world_size = 1

    def __init__(self, config: Any, tokenizer: Any, child: type, spec: dict[str, Any]) -> None:
        self.config, self.tokenizer, self.child = config, tokenizer, child
        context = multiprocessing.get_context("spawn")
        self._conn, end = context.Pipe()
        self._process = context.Process(
            target=serve_replica,
            args=(end, child, spec, torch.get_num_threads()),
            name="ppoflow-rollout-replica",
            daemon=True,
        )
        self._process.start()
        end.close()
        self._buffers: dict[str, Tensor] | None = None
        self.last_sync: SyncCheck | None = None  # the probe of the last sync (weight_probe)

    @property
    def pid(self) -> int | None:
        return self._process.pid

    def sync(self, weights: Iterable[tuple[str, Tensor]]) -> None:
        """Copy ``weights`` (name, full tensor) into the replica; the first sync hands it the
        shared buffers, later ones fill them and tell it so. Call it only while no generation
        runs."""
        probe = SyncProbe()
        if self._buffers is None:
            self._buffers = {
                name: tensor.detach().to("cpu", copy=True).share_memory_()
                for name, tensor in probe.tee(weights)
            }
            self.last_sync = probe.compare([self._ask(("weights", self._buffers))])
            return
        with torch.no_grad():
            for name, tensor in probe.tee(weights):
                self._buffers[name].copy_(tensor)
        self.last_sync = probe.compare([self._ask(("synced", None))])

    def call(self, method: str, batch: DataProto, **kwargs: Any) -> DataProto:
        """``generate_sequences(batch, **kwargs)`` on the replica's weights (the actor worker's
        arguments); the rollout layout of ``stages.engines.rollout_hf``."""
        from stages.engines.roles import call_settings

        _check_method(method)
        if self._buffers is None:
            raise RuntimeError("the rollout replica has no weights yet: sync it first")
        settings = call_settings(self.config, self.tokenizer, len(batch), **kwargs)
        out = DataProto.from_dict(self._ask(("generate", (_as_tensors(batch), settings))))
        out.meta_info[K.METRICS] = self.last_sync.metrics()  # the probe of its last sync
        return out

    def _ask(self, message: tuple) -> Any:
        try:
            self._conn.send(message)
            status, value = self._conn.recv()
        except (EOFError, OSError):  # a broken pipe, a reset, or the trainer closed its end
            raise RuntimeError(
                f"the rollout replica's process ({self._process.pid}) ended "
                f"(exit code {self._process.exitcode}); the run stops here and resumes from its "
                "last checkpoint"
            ) from None
        if status == "error":
            raise RuntimeError(f"the rollout replica failed:\n{value}")
        return value

    def kill(self) -> None:
        """End the process now (a generation it runs is abandoned)."""
        if self._process.is_alive():
            self._process.kill()
            self._process.join()

    def close(self) -> None:
        """End the process (it ends by itself when this one does)."""
        if self._process.is_alive():
            with contextlib.suppress(BrokenPipeError, OSError):
                self._conn.send(("close", None))
            self._process.join(timeout=10)
            if self._process.is_alive():
                self._process.kill()
                self._process.join()
        self._conn.close()


def serve_replica(conn: Any, child: type, spec: dict[str, Any], threads: int) -> None:
    """The replica process: build ``child(spec, device)``, then answer each message ``(kind,
    body)`` — ``weights`` (name → shared buffer, the first sync), ``synced`` (the buffers were
    refilled): both answered with the digests of the sync probe (``stages.engines.weight_probe``),
    ``generate`` ((prompt tensors, settings)), ``close`` — with ``("ok", answer)`` or
    ``("error", traceback)``, until the pipe closes."""
    torch.set_num_threads(threads)
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # the trainer's console shows its own lines only
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        engine = child(spec, device)
    except Exception:  # the trainer's next message hears why, not only that the process ended
        failed = traceback.format_exc()
        with contextlib.suppress(EOFError, OSError):
            conn.recv()
            conn.send(("error", f"building its engine failed:\n{failed}"))
        return
    buffers: dict[str, Tensor] = {}
    while True:
        try:
            kind, body = conn.recv()
        except (EOFError, OSError):
            engine.close()
            return
        try:
            answer = None
            if kind == "close":
                engine.close()
                return
            if kind == "weights":
                buffers = body
                answer = engine.load(buffers, first=True)
            elif kind == "synced":
                answer = engine.load(buffers, first=False)
            else:
                tensors, settings = body
                answer = _as_tensors(engine.generate(DataProto.from_dict(tensors), settings))
            conn.send(("ok", answer))
        except Exception:
            try:
                conn.send(("error", traceback.format_exc()))
            except (BrokenPipeError, OSError):
                return


class HFChild:
    """The ``hf`` replica's engine: the model directory loaded with HF (``spec``: the
    ``load_causal_lm`` arguments and ``enforce_eager``), generating with
    ``rollout_hf.generate_sequences`` by the decode path ``choose_decode_path`` picks for the
    device (on CUDA a static cache and CUDA graphs unless ``enforce_eager``; else ``generate``).
    A sync copies into the parameters in place, so compiled steps keep reading them."""

    def __init__(self, spec: dict[str, Any], device: torch.device) -> None:
        from stages.engines.models import load_causal_lm
        from stages.engines.rollout_hf import choose_decode_path

        spec = dict(spec)
        enforce_eager = spec.pop("enforce_eager")
        self.device = device
        self.lm = load_causal_lm(**spec).eval().to(device)
        self.params = dict(self.lm.named_parameters())
        self.decode = choose_decode_path(
            self.lm, device, enforce_eager=enforce_eager, weights_gathered=False
        )

    def load(self, buffers: dict[str, Tensor], first: bool) -> dict:
        """The parameters from the shared buffers (on the CPU they become views of them, so a
        later sync needs no copy here; on a GPU they are copied); the probe's digests."""
        if first:
            missing = sorted(set(self.params) - set(buffers))
            if missing:
                raise KeyError(f"the sync lacks parameters {missing[:5]}")
        with torch.no_grad():
            for name, buffer in buffers.items():
                if self.device.type == "cpu":
                    self.params[name].data = buffer
                else:
                    self.params[name].copy_(buffer, non_blocking=True)
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        return engine_digests(self.lm.named_parameters(), filter(is_probed, self.params))

    def generate(self, prompts: DataProto, settings: Any) -> DataProto:
        from stages.engines.rollout_hf import generate_sequences

        return generate_sequences(self.lm, prompts, settings, self.decode.run)

    def close(self) -> None:
        pass


class VLLMChild:
    """The ``vllm`` replica's engine: a ``VLLMRollout`` built in this process with its engine
    core here too (``spec``: ``roles.vllm_rollout_arguments``, ``in_process``), sent the shared
    buffers as the on-policy sync sends the actor's weights."""

    def __init__(self, spec: dict[str, Any], device: torch.device) -> None:
        from stages.engines.rollout_vllm import VLLMRollout

        self.vllm = VLLMRollout(**spec)

    def load(self, buffers: dict[str, Tensor], first: bool) -> dict:
        """``sync_weights`` from the buffers; the engine's digests of the probed tensors (its
        own probe's answer, not asked again)."""
        self.vllm.sync_weights(buffers.items())
        return self.vllm.last_digests[0]

    def generate(self, prompts: DataProto, settings: Any) -> DataProto:
        return self.vllm.generate_sequences(prompts, settings)

    def close(self) -> None:
        """Shut the engine down; vLLM's lines about its own shutdown stay out of the console."""
        vllm_logger = logging.getLogger("vllm")
        vllm_logger.setLevel(logging.ERROR)
        self.vllm.close()


def build_replica(config: Any, tokenizer: Any) -> Any:
    """The replica the run's rollout backend builds (``RolloutBackendSpec.build_replica``)."""
    from stages.engines.rollout_backends import ROLLOUT_BACKENDS

    name = config.actor_rollout_ref.rollout.name
    return ROLLOUT_BACKENDS.get(name).build_replica(config, tokenizer)


def hf_replica(config: Any, tokenizer: Any) -> ProcessReplica:
    """The ``hf`` backend's replica: :class:`HFChild` on the run's model directory."""
    model = config.actor_rollout_ref.model
    spec = {
        "path": model.path,
        "dtype": model.dtype,
        "attn_implementation": model.attn_implementation,
        "trust_remote_code": model.trust_remote_code,
        "enforce_eager": config.actor_rollout_ref.rollout.enforce_eager,
    }
    return ProcessReplica(config, tokenizer, HFChild, spec)


def vllm_replica(config: Any, tokenizer: Any) -> ProcessReplica:
    """The ``vllm`` backend's replica: :class:`VLLMChild`, the rollout's engine settings, the
    engine core in the replica's process and, there, the model (vLLM's ``uni`` executor)."""
    from transformers import AutoConfig

    from stages.engines.roles import vllm_rollout_arguments

    model = config.actor_rollout_ref.model
    hf_config = AutoConfig.from_pretrained(model.path, trust_remote_code=model.trust_remote_code)
    spec = vllm_rollout_arguments(
        config,
        hf_config,
        tensor_parallel_size=1,
        in_process=True,
        executor={"distributed_executor_backend": "uni"},
    )
    return ProcessReplica(config, tokenizer, VLLMChild, spec)
