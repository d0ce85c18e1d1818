"""Methods added to every vLLM worker (``LLM(worker_extension_cls=...)``) for actor weight sync.

vLLM imports this class by its dotted path inside each worker process and mixes it into the
worker, so ``self`` below is a vLLM ``Worker`` (``self.model_runner``, ``self.reload_weights``).
The driver calls the methods with ``llm.collective_rpc("ppoflow_load_weights", args=(...,))``.

Why ``reload_weights`` and not ``model.load_weights``: on CPU, vLLM replaces linear weights by
prepacked kernels after loading, so a second plain ``load_weights`` fails; the worker's in-place
reload re-runs the loader and the post-load processing for every layer, on every platform.
With tied embeddings vLLM 0.32's CPU reload leaves ``lm_head`` on its old packed copy, so it is
re-packed here (a no-op on GPU, where the embedding method has nothing to pack).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

WEIGHT_SYNC_EXTENSION = "stages.engines.vllm_worker_ext.WeightSyncExtension"


def unpack_weights(
    payload: bytes | Sequence[tuple[str, torch.Tensor]],
) -> list[tuple[str, torch.Tensor]]:
    """``[(name, tensor)]`` from safetensors bytes (multi-process engines) or from the list itself.

    Tensors cannot cross vLLM's multi-process RPC (they arrive as nested lists), bytes can.
    """
    if isinstance(payload, bytes | bytearray | memoryview):
        from safetensors.torch import load

        return list(load(bytes(payload)).items())
    is_named_list = isinstance(payload, list | tuple) and all(
        isinstance(item, tuple) and len(item) == 2 and isinstance(item[1], torch.Tensor)
        for item in payload
    )
    if is_named_list:
        return list(payload)
    raise TypeError(
        f"weights payload must be safetensors bytes or a list of (name, Tensor), got {type(payload).__name__}"
    )


class WeightSyncExtension:
    """Worker-side half of `VLLMRollout.sync_weights`."""

    def ppoflow_load_weights(self, payload: bytes | Sequence[tuple[str, torch.Tensor]]) -> int:
        """Load Hugging Face-named weights into the running model in place; returns the count.

        ``payload``: safetensors bytes or ``[(name, tensor)]`` with the actor's parameter names
        (``model.layers.0.self_attn.q_proj.weight``, …); vLLM's loader shards them for
        tensor parallelism and fuses q/k/v and gate/up itself.
        """
        from vllm.platforms import current_platform

        named = unpack_weights(payload)
        self.reload_weights(weights_iterator=iter(named))  # type: ignore[attr-defined]
        model = self.model_runner.get_model()  # type: ignore[attr-defined]
        lm_head = getattr(model, "lm_head", None)
        quant_method = getattr(lm_head, "quant_method", None)
        if current_platform.is_cpu() and quant_method is not None:
            quant_method.process_weights_after_loading(lm_head)
        return len(named)
