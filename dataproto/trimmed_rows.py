"""Padding left off on disk: each row of a (B, C) tensor stored from its first to its last real entry.

verl's layout pads every row to the batch's widths: prompts on the left to P columns, responses
on the right to R, so most of a real run's (B, T) and (B, R) tensors is one repeated value (the
pad id, 0 in masks and in masked log-probs). A 2-D tensor is stored *trimmed* when that saves at
least an eighth of its bytes: the **fill** value (the one most rows start or end with), each row's
span ``[start, stop)`` of entries that are not the fill, and the spans' entries back to back:

    values = concat_i tensor[i, start_i : stop_i]        (N,) with N = Σ (stop_i − start_i)
    spans  = [[start_i, stop_i] for each row]            (B, 2)

A row that is all fill has the span [0, 0]. Loading writes the fill everywhere and the values into
their spans. Entries are compared by their bits (an integer view of the same width), except that a
float zero of either sign counts as the fill 0.0: every entry inside a span comes back bit for bit
(−0.0 and NaN payloads included), and padding zeros come back as +0.0, equal under ``==`` and
``torch.equal``. The choice of fill and spans depends only on the tensor's values, so equal
tensors are stored alike and the artifact fingerprint stays a function of the content.

The artifact stores ``values`` under the key's name and ``spans`` under ``<name>#spans`` (both then
narrowed by ``dataproto/compact_dtypes.py``); its manifest lists each trimmed key's fill (as the
bits' integer) and N in ``batch.trimmed``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch import Tensor

#: the suffix of a trimmed key's spans tensor in the file
SPANS_SUFFIX = "#spans"
#: bit-view dtype per element size
_BIT_VIEWS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
#: store trimmed only when that writes at most this fraction of the dense bytes
_MAX_KEPT_FRACTION = 7 / 8


def _bits(tensor: Tensor) -> Tensor:
    """An integer view of ``tensor``'s bits (same shape and element size)."""
    return tensor.view(_BIT_VIEWS[tensor.element_size()])


@dataclass(frozen=True)
class TrimmedRows:
    """One trimmed tensor: ``values`` (N,), ``spans`` (B, 2) int64, ``fill`` (the bits, an int)."""

    values: Tensor
    spans: Tensor
    fill: int


def _fill_bits(edges: Tensor) -> int:
    """The bit pattern most rows start or end with (the smallest of equally common ones), from
    the (2B,) bits of the rows' first and last entries."""
    patterns, counts = torch.unique(edges, return_counts=True)  # sorted patterns
    return int(patterns[int(torch.argmax(counts))])


def _row_spans(real: Tensor) -> Tensor:
    """(B, 2) int64 [start, stop) from the first to the last True of each row of a (B, C) bool
    tensor; [0, 0] for a row without one."""
    columns = real.shape[1]
    as_bytes = real.view(torch.uint8)
    start = as_bytes.argmax(dim=1)  # the first True (0 when none)
    stop = columns - as_bytes.flip(1).argmax(dim=1)
    empty = ~real.any(dim=1)
    return torch.stack([start.masked_fill(empty, 0), stop.masked_fill(empty, 0)], dim=1)


def _span_cells(spans: Tensor, columns: int) -> Tensor:
    """(B, columns) bool: True inside each row's span."""
    column = torch.arange(columns, dtype=torch.int32)
    return (column >= spans[:, :1].to(torch.int32)) & (column < spans[:, 1:].to(torch.int32))


def _canonical_bits(tensor: Tensor) -> Tensor:
    """The bits compared against the fill: a float −0.0 counts as +0.0 (padding zeros of either
    sign are padding); every other value by its own bits."""
    if tensor.is_floating_point():
        tensor = torch.where(tensor == 0, torch.zeros((), dtype=tensor.dtype), tensor)
    return _bits(tensor)


def _real_cells(tensor: Tensor, fill: int) -> Tensor:
    """(B, C) bool: the entries that are not the fill (for a float fill of 0.0, not ±0.0)."""
    if tensor.is_floating_point() and fill == 0:
        return tensor != 0  # NaN != 0 too
    return _bits(tensor) != fill


def _may_pay(tensor: Tensor, fill: int) -> bool:
    """Whether trimming can leave off an eighth of the cells: only rows that start or end with
    the fill have padding to leave off (an O(B) bound, so dense tensors cost next to nothing)."""
    edges = _canonical_bits(torch.stack([tensor[:, 0], tensor[:, -1]], dim=1))  # (B, 2)
    padded_rows = int((edges == fill).any(dim=1).sum())
    return padded_rows * tensor.shape[1] >= (1 - _MAX_KEPT_FRACTION) * tensor.numel()


def trim_rows(tensor: Tensor) -> TrimmedRows | None:
    """The trimmed form of a (B, C) CPU contiguous tensor, or None when it is not 2-D with at
    least two columns or would keep more than 7/8 of its entries.

    >>> t = torch.tensor([[0, 0, 5, 6], [0, 7, 0, 0], [0, 0, 0, 0]])
    >>> trimmed = trim_rows(t)
    >>> trimmed.values.tolist(), trimmed.spans.tolist(), trimmed.fill
    ([5, 6, 7], [[2, 4], [1, 2], [0, 0]], 0)
    >>> torch.equal(restore_rows(trimmed.values, trimmed.spans, trimmed.fill, (3, 4)), t)
    True
    """
    if tensor.dim() != 2 or tensor.shape[1] < 2 or tensor.shape[0] == 0:
        return None
    fill = _fill_bits(_canonical_bits(torch.cat([tensor[:, 0], tensor[:, -1]])))
    if not _may_pay(tensor, fill):
        return None
    spans = _row_spans(_real_cells(tensor, fill))
    kept = int((spans[:, 1] - spans[:, 0]).sum())
    if kept > _MAX_KEPT_FRACTION * tensor.numel():
        return None
    cells = _span_cells(spans, tensor.shape[1]).numpy()
    values_bits = _bits(tensor).numpy()[cells]  # row by row, each span in order (numpy's boolean
    # indexing is several times faster than torch's on CPU; bits, so bfloat16 goes through too)
    values = torch.from_numpy(values_bits).view(tensor.dtype)
    return TrimmedRows(values=values, spans=spans, fill=fill)


def restore_rows(values: Tensor, spans: Tensor, fill: int, shape: tuple[int, int]) -> Tensor:
    """The (B, C) tensor of ``values`` (its dtype) in ``spans`` and ``fill`` (bits) elsewhere.

    Raises:
        ValueError: spans that are not (B, 2) within [0, C] with start ≤ stop, or whose lengths do
            not add up to len(values).
    """
    rows, columns = shape
    spans = spans.to(torch.int64)
    if tuple(spans.shape) != (rows, 2):
        raise ValueError(f"spans have shape {tuple(spans.shape)}; expected ({rows}, 2)")
    start, stop = spans[:, 0], spans[:, 1]
    if bool(((start < 0) | (stop > columns) | (start > stop)).any()):
        raise ValueError(f"a span lies outside [0, {columns}] or ends before it starts")
    if int((stop - start).sum()) != len(values):
        raise ValueError(
            f"the spans hold {int((stop - start).sum())} entries; the file {len(values)}"
        )
    out = torch.empty(rows, columns, dtype=values.dtype)
    out_bits = _bits(out)
    out_bits.fill_(fill)
    out_bits.numpy()[_span_cells(spans, columns).numpy()] = _bits(values.contiguous()).numpy()
    return out


def trim_tensors(
    tensors: Mapping[str, Tensor],
) -> tuple[dict[str, Tensor], dict[str, dict[str, int]]]:
    """(the file's tensors, name → {"fill", "count"} of each key stored trimmed).

    A trimmed key is stored as its values under its name plus its spans under
    ``name + SPANS_SUFFIX``; a key is left dense when that name is taken.
    """
    stored: dict[str, Tensor] = {}
    trimmed: dict[str, dict[str, int]] = {}
    for name, tensor in tensors.items():
        result = None if name + SPANS_SUFFIX in tensors else trim_rows(tensor)
        if result is None:
            stored[name] = tensor
            continue
        stored[name], stored[name + SPANS_SUFFIX] = result.values, result.spans
        trimmed[name] = {"fill": result.fill, "count": len(result.values)}
    return stored, trimmed


__all__ = ["SPANS_SUFFIX", "TrimmedRows", "restore_rows", "trim_rows", "trim_tensors"]
