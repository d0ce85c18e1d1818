"""Run each forward at the width its rows need, not at ``max_prompt_length + max_response_length``.

Batches keep verl's layout: prompts left-padded to P columns, responses right-padded to R, so a
(B, T = P + R) batch of short prompts and short answers is mostly padding (the demo: 25 real
tokens in 80 columns). Columns that are padding in *every* row can be dropped before the model
runs, without changing any real token's result:

* leading columns where no row has a real token: padding is masked out of attention, and the
  position ids of the real tokens are kept as they are;
* trailing columns where no row has a real token: the model is causal, so nothing after a row's
  last real token reaches it.

Outputs are padded back to R response columns with zeros there (callers mask response padding
with ``response_mask``). In float32 the results equal the full-width ones up to the rounding of
differently shaped kernels (≤ 1e-5 in the tests); the same holds for gradients, since the dropped
columns enter no loss.
"""

from __future__ import annotations

import torch
from torch import Tensor


def real_span(attention_mask: Tensor, response_length: int) -> tuple[int, int]:
    """``(start, stop)``: the columns ``[start, stop)`` of a (B, T) batch that some row needs.

    ``start`` ≤ P − 1 (the last prompt column predicts the first response token, so it is always
    kept) and ``stop`` ≥ P + 1 (at least one response column), P = T − ``response_length``.

    Example (P = 4, R = 3; the first column and the last response column are padding everywhere):
        >>> mask = torch.tensor([[0, 0, 1, 1, 1, 0, 0], [0, 1, 1, 1, 1, 1, 0]])
        >>> real_span(mask, 3)
        (1, 6)
    """
    total = attention_mask.shape[1]
    prompt_length = total - response_length
    used = attention_mask.bool().any(dim=0)  # (T,) some row has a real token there
    columns = used.nonzero().flatten()
    if columns.numel() == 0:
        return prompt_length - 1, prompt_length + 1
    start = min(int(columns[0]), prompt_length - 1)
    stop = max(int(columns[-1]) + 1, prompt_length + 1)
    return start, stop


def pad_response_columns(values: Tensor | None, response_length: int) -> Tensor | None:
    """(B, R') → (B, R): zeros appended on the right (trimmed response padding)."""
    if values is None or values.shape[1] == response_length:
        return values
    return torch.nn.functional.pad(values, (0, response_length - values.shape[1]), value=0.0)


def first_used_column(attention_mask: Tensor) -> int:
    """The first column of a (B, P) left-padded prompt batch where some row has a real token
    (the generation input needs nothing before it); P − 1 at most.

    >>> first_used_column(torch.tensor([[0, 0, 1], [0, 1, 1]]))
    1
    """
    used = attention_mask.bool().any(dim=0).nonzero().flatten()
    last = attention_mask.shape[1] - 1
    return min(int(used[0]), last) if used.numel() else last


__all__ = ["first_used_column", "pad_response_columns", "real_span"]
