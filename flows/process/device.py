"""``trainer.device``: where a run's ranks compute, applied before any engine is built.

- ``cuda``: every rank takes a CUDA device; a machine where torch sees none is refused in one
  line before any model is loaded (instead of training on the CPU without a word).
- ``cpu``: CUDA is hidden from this process (``CUDA_VISIBLE_DEVICES=""``, inherited by the
  reward workers; Ray ranks are then given no GPU), so the engines, rollouts and checkpoints run
  on the CPU even on a machine with GPUs. CUDA cannot be hidden once this process has
  initialized it; that is refused in one line too, naming what to set instead.
"""

from __future__ import annotations

import os
from typing import Any

import torch


def apply_device(config: Any) -> str:
    """Make ``config.trainer.device`` hold for this process (module docstring); returns it.

    Raises:
        RuntimeError: ``cuda`` without a CUDA device, or ``cpu`` after CUDA was initialized.
    """
    device = config.trainer.device
    if device == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError(
                "trainer.device = 'cuda' but torch sees no CUDA device on this machine "
                "(torch.cuda.is_available() is False); set trainer.device=cpu to train on the CPU"
            )
        return device
    if torch.cuda.is_initialized():
        raise RuntimeError(
            "trainer.device = 'cpu' but CUDA is already initialized in this process, so it "
            "cannot be hidden any more; start ppoflow with CUDA_VISIBLE_DEVICES= (empty) or set "
            "trainer.device=cuda"
        )
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    return device
