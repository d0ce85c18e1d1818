"""How well an engine call used its device: MFU and peak device memory, verl's keys.

Around a worker's call (:class:`PassMeter`): the wall seconds of the call, the device synchronised
at its end, then

- ``perf/mfu/{role}`` = F · passes / (seconds · peak), F the FLOPs of one pass over the call's
  rows (``stages.metrics.flops``: forward + backward for an update, a third of that for a
  forward-only pass), each row counted by its real tokens (attention-mask sum); ``passes`` =
  the update's ``ppo_epochs`` (1 for a forward pass); peak = the device's dense bf16 FLOP/s.
  Each rank measures its own rows and seconds; ranks' values are averaged.
- ``{prefix}/perf/max_memory_allocated_gb`` and ``…_reserved_gb``: the most device memory torch's
  allocator has held since the process started, in GiB (a max over ranks).

Both only on a device whose peak is known (CUDA devices of the table); elsewhere nothing is
added, so a CPU run logs neither (tests hand a peak in to check the arithmetic on the CPU).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import Tensor

from stages.metrics.flops import (
    DecoderShape,
    device_peak_flops,
    model_flops_utilization,
    training_flops,
)

GIB = float(1 << 30)


class PassMeter:
    """The efficiency metrics of one kind of pass of one model on one device.

    Args:
        mfu_key: e.g. ``perf/mfu/actor``.
        memory_prefix: e.g. ``actor``, giving ``actor/perf/max_memory_allocated_gb``.
        model_config: the Hugging Face config of the model (its sizes give the FLOPs).
        device: where the model runs.
        backward: whether the pass also computes gradients (an update) or only the forward.
        peak_flops: the device's peak FLOP/s; None = the table's value for a CUDA device, and none
            (no metrics) elsewhere.
    """

    def __init__(
        self,
        mfu_key: str,
        memory_prefix: str,
        model_config: Any,
        device: torch.device,
        *,
        backward: bool,
        peak_flops: float | None = None,
    ) -> None:
        self.mfu_key = mfu_key
        self.memory_prefix = memory_prefix
        self.device = device
        self.backward = backward
        self.shape = DecoderShape.of(model_config)
        if peak_flops is None and device.type == "cuda":
            peak_flops = device_peak_flops(torch.cuda.get_device_name(device))
        self.peak = peak_flops

    @contextmanager
    def measure(
        self, attention_mask: Tensor, metrics: dict[str, Any], passes: int = 1
    ) -> Iterator[None]:
        """Time the ``with`` body and add this pass's metrics to ``metrics`` (nothing on a device
        without a known peak; no MFU for a model whose shape is not estimated)."""
        if self.peak is None:
            yield
            return
        on_cuda = self.device.type == "cuda"
        start = time.perf_counter()
        yield
        if on_cuda:
            torch.cuda.synchronize(self.device)
        seconds = time.perf_counter() - start
        if self.shape is not None and seconds > 0:
            flops = training_flops(self.shape, attention_mask.sum(-1).tolist())
            flops = flops * passes if self.backward else flops * passes / 3
            metrics[self.mfu_key] = model_flops_utilization(flops, seconds, self.peak)
        if not on_cuda:
            return
        prefix = f"{self.memory_prefix}/perf"
        metrics[f"{prefix}/max_memory_allocated_gb"] = (
            torch.cuda.max_memory_allocated(self.device) / GIB
        )
        metrics[f"{prefix}/max_memory_reserved_gb"] = (
            torch.cuda.max_memory_reserved(self.device) / GIB
        )
