"""Methods added to every vLLM worker (``LLM(worker_extension_cls=...)``) for actor weight sync.

vLLM imports this class by its dotted path inside each worker process and mixes it into the
worker, so ``self`` below is a vLLM ``Worker`` (``self.model_runner``, ``self.reload_weights``).
The driver calls the methods with ``llm.collective_rpc(<method>, args=(...,))``:

- an engine in the driver's process: ``ppoflow_load_weights(stream)`` with a lazy
  ``(name, tensor)`` iterator, consumed by one in-place reload (nothing copied on the way);
- an engine in other processes (tensors cannot cross its RPC, bytes can):
  ``ppoflow_stage_weights(bucket)`` once per safetensors bucket, each bucket's tensors moved to
  the model's device at once, then ``ppoflow_load_staged_weights()`` reloads from them;
- after either, ``ppoflow_probe_weights(names)``: digests of the tensors the sync probe checks
  (``stages.engines.weight_probe``).

Why one ``reload_weights`` over all tensors and not one per bucket: the in-place reload restores
every layer to checkpoint format, loads, then re-processes every layer (on CPU, vLLM re-packs
linear weights into kernels), so a reload given part of the weights would re-process layers it
did not load. With tied embeddings vLLM 0.32's CPU reload leaves ``lm_head`` on its old packed
copy, so it is re-packed here (a no-op on GPU, where the embedding method has nothing to pack).
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable, Iterator
from typing import Any

import torch

from stages.engines.weight_buckets import tensors_of

WEIGHT_SYNC_EXTENSION = "stages.engines.vllm_worker_ext.WeightSyncExtension"
#: the vLLM releases whose in-place reload this extension is written against (pyproject's pin)
TESTED_VLLM = ">=0.32,<0.34"


def checked_stream(payload: Any) -> Iterator[tuple[str, torch.Tensor]]:
    """``(name, tensor)`` pairs of ``payload``: one safetensors bucket (bytes) or an iterable of
    pairs, checked lazily; raises TypeError naming what is wrong."""
    if isinstance(payload, bytes | bytearray | memoryview):
        yield from tensors_of(payload)
        return
    if isinstance(payload, str) or not isinstance(payload, Iterable):
        raise TypeError(
            f"weights payload must be safetensors bytes or an iterable of (name, Tensor), got "
            f"{type(payload).__name__}"
        )
    for item in payload:
        if not (isinstance(item, tuple) and len(item) == 2 and isinstance(item[1], torch.Tensor)):
            raise TypeError(f"weights payload item must be (name, Tensor), got {item!r:.80}")
        yield item


def check_reload_signature(reload: Any, vllm_version: str) -> None:
    """Raise RuntimeError unless ``reload`` (a model runner's ``reload_weights``) takes a
    ``weights_iterator`` keyword, as vLLM 0.32 and 0.33 do."""
    if "weights_iterator" not in inspect.signature(reload).parameters:
        raise RuntimeError(
            f"vLLM {vllm_version}'s model runner has no reload_weights(weights_iterator=...), "
            f"which ppoflow's weight sync calls; install vllm{TESTED_VLLM}"
        )


class WeightSyncExtension:
    """Worker-side half of `VLLMRollout.sync_weights`."""

    def ppoflow_load_weights(self, payload: Any) -> int:
        """Load Hugging Face-named weights into the running model in place; returns the count.

        ``payload``: safetensors bytes or an iterable of ``(name, tensor)`` with the actor's
        parameter names (``model.layers.0.self_attn.q_proj.weight``, …), read once; vLLM's
        loader shards them for tensor parallelism and fuses q/k/v and gate/up itself.
        """
        import vllm
        from vllm.platforms import current_platform

        check_reload_signature(self.model_runner.reload_weights, vllm.__version__)  # type: ignore[attr-defined]
        count = 0

        def counted() -> Iterator[tuple[str, torch.Tensor]]:
            nonlocal count
            for item in checked_stream(payload):
                count += 1
                yield item

        self.reload_weights(weights_iterator=counted())  # type: ignore[attr-defined]
        model = self.model_runner.get_model()  # type: ignore[attr-defined]
        lm_head = getattr(model, "lm_head", None)
        quant_method = getattr(lm_head, "quant_method", None)
        if current_platform.is_cpu() and quant_method is not None:
            quant_method.process_weights_after_loading(lm_head)
        return count

    def ppoflow_probe_weights(self, names: list[str]) -> dict:
        """The digests of the model's tensors among ``names``, by vLLM's parameter names
        (``stages.engines.weight_probe.engine_digests``), for the sync probe."""
        from stages.engines.weight_probe import engine_digests

        model = self.model_runner.get_model()  # type: ignore[attr-defined]
        return engine_digests(model.named_parameters(), names)

    def ppoflow_stage_weights(self, bucket: bytes) -> int:
        """Keep one safetensors bucket's tensors, on the model's device, for
        :meth:`ppoflow_load_staged_weights`; returns the tensors staged so far."""
        device = next(self.model_runner.get_model().parameters()).device  # type: ignore[attr-defined]
        staged = self.__dict__.setdefault("_ppoflow_staged", [])
        staged.extend((name, tensor.to(device)) for name, tensor in tensors_of(bucket))
        return len(staged)

    def ppoflow_load_staged_weights(self) -> int:
        """:meth:`ppoflow_load_weights` from the staged tensors, which are then dropped."""
        staged = self.__dict__.pop("_ppoflow_staged", [])
        if not staged:
            raise RuntimeError("ppoflow_load_staged_weights: no weights were staged")
        return self.ppoflow_load_weights(iter(staged))
