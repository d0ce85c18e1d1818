"""Where a sequence's scalar score goes in the (B, R) ``rm_scores`` tensor (docs/differences.md, difference 1).

Row i's score sits at index ``L_i - 1``, its last valid response token, where
``L_i = attention_mask[i, -R:].sum()`` is the valid response length (responses are right-padded);
every other position is 0, so ``rm_scores.sum(-1)`` gives the scores back.

Difference from verl (docs/differences.md, difference 1): a row with ``L_i = 0`` (empty / aborted response) gets nothing
written; verl writes index -1, the last padding column, where the score leaks into computations
that should only see valid tokens. Such a row is flagged aborted, and its score stays available
per sample to whoever keeps the ``scores`` vector.

Example:
    >>> mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0]])
    >>> rm_scores, is_aborted = assemble_rm_scores(torch.tensor([0.5, 1.0, 2.0]), mask)
    >>> rm_scores
    tensor([[0.0000, 0.0000, 0.5000, 0.0000],
            [1.0000, 0.0000, 0.0000, 0.0000],
            [0.0000, 0.0000, 0.0000, 0.0000]])
    >>> is_aborted
    tensor([False, False,  True])
"""

from __future__ import annotations

import torch
from torch import Tensor


def response_lengths(attention_mask: Tensor, response_width: int) -> Tensor:
    """Valid response length per row: ``L_i = attention_mask[i, -R:].sum()``.

    Args:
        attention_mask: (B, T) {0,1} with the response part in the last R columns, or (B, R)
            when ``response_width`` equals its width.
        response_width: R, the padded response width.

    Returns:
        (B,) int64 lengths in [0, R].
    """
    if attention_mask.dim() != 2 or not 0 < response_width <= attention_mask.shape[1]:
        raise ValueError(
            f"attention_mask must be (B, T) with T >= R = {response_width} > 0, "
            f"got shape {tuple(attention_mask.shape)}"
        )
    return attention_mask[:, -response_width:].long().sum(-1)


def assemble_rm_scores(
    scores: Tensor, attention_mask: Tensor, response_width: int | None = None
) -> tuple[Tensor, Tensor]:
    """Scatter one score per row to its last valid response token.

    ``rm_scores[i, L_i - 1] = scores[i]`` for ``L_i > 0``; everything else 0.

    Args:
        scores: (B,) float, one scalar per sequence.
        attention_mask: (B, T) {0,1} (response part = last R columns), or (B, R) response mask.
        response_width: R; defaults to the mask's width (pass it when giving the (B, T) mask).

    Returns:
        rm_scores: (B, R) float32.
        is_aborted: (B,) bool, True where ``L_i = 0`` (nothing was written for that row).
    """
    width = attention_mask.shape[-1] if response_width is None else response_width
    lengths = response_lengths(attention_mask, width)  # (B,)
    if scores.shape != lengths.shape:
        raise ValueError(
            f"scores must be (B,) = {tuple(lengths.shape)} to match attention_mask rows, "
            f"got {tuple(scores.shape)}"
        )
    is_aborted = lengths == 0  # (B,)
    rm_scores = torch.zeros(lengths.shape[0], width, dtype=torch.float32, device=scores.device)
    index = (lengths - 1).clamp(min=0).unsqueeze(-1)  # (B, 1); aborted rows point at 0 ...
    values = torch.where(is_aborted, 0.0, scores.float()).unsqueeze(-1)  # ... and write a 0 there
    rm_scores.scatter_(1, index.to(scores.device), values)
    return rm_scores, is_aborted
