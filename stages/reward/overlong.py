"""DAPO's soft overlong punishment (arXiv:2503.14476 §3.4; verl's DAPO reward manager).

A response whose length L enters the last ``buffer_len`` tokens before ``max_resp_len`` gets a
penalty that grows linearly to ``-penalty_factor`` at ``max_resp_len``:

    expected = max_resp_len - buffer_len
    penalty  = min(-(L - expected) / buffer_len · penalty_factor, 0)
    reward   = score + penalty

L is the number of valid response tokens (``attention_mask`` over the response, so tool-output
tokens of a multi-turn trajectory count, as in verl). A response of L ≤ expected gets 0.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor


@dataclass(frozen=True)
class OverlongBuffer:
    """The shaping's settings (``reward.overlong_buffer``); ``max_resp_len`` already resolved."""

    enable: bool
    len: int
    penalty_factor: float
    log: bool
    max_resp_len: int

    def __post_init__(self) -> None:
        if self.enable and not 0 < self.len <= self.max_resp_len:
            raise ValueError(
                f"reward.overlong_buffer.len must be in (0, max_resp_len = {self.max_resp_len}] "
                f"tokens, got {self.len}"
            )


def overlong_penalty(
    response_lengths: Tensor, max_resp_len: int, buffer_len: int, penalty_factor: float
) -> Tensor:
    """(B,) the penalty of each response (module docstring), ≤ 0.

    Args:
        response_lengths: (B,) valid response tokens L per sample.

    Example (max_resp_len 20480, buffer 4096, factor 1.0: L = 16000 → 0, 18432 → −0.5,
    20480 → −1.0):
        >>> overlong_penalty(torch.tensor([16000, 18432, 20480]), 20480, 4096, 1.0)
        tensor([ 0.0000, -0.5000, -1.0000])
    """
    expected = max_resp_len - buffer_len
    exceed = response_lengths.to(torch.float32) - expected  # (B,)
    return torch.clamp(-exceed / buffer_len * penalty_factor, max=0.0)


def shape_overlong(
    seq_scores: Tensor, response_lengths: Tensor, buffer: OverlongBuffer
) -> tuple[Tensor, dict[str, np.ndarray]]:
    """(B,) ``seq_scores`` + the penalty, and with ``buffer.log`` the reward extras
    ``overlong_reward`` (the penalty, float) and ``overlong`` (penalty < 0, bool), as verl's DAPO
    manager logs them.

    Example (max_resp_len 8, buffer 4, factor 1: L = 4 → 0, 6 → −0.5, 8 → −1):
        >>> buffer = OverlongBuffer(True, 4, 1.0, True, 8)
        >>> shaped, extras = shape_overlong(torch.ones(3), torch.tensor([4, 6, 8]), buffer)
        >>> shaped, extras["overlong"].tolist()
        (tensor([1.0000, 0.5000, 0.0000]), [False, True, True])
    """
    penalty = overlong_penalty(
        response_lengths, buffer.max_resp_len, buffer.len, buffer.penalty_factor
    )  # (B,)
    extras: dict[str, np.ndarray] = {}
    if buffer.log:
        extras["overlong_reward"] = penalty.double().numpy()
        extras["overlong"] = (penalty < 0).numpy()
    return seq_scores + penalty, extras
