"""Row indices for DataProto: normalize every accepted index form, then gather rows.

An index is a list, a 1-D numpy array or a 1-D torch tensor, holding either row numbers
(negative numbers count from the end, repeats allowed) or a boolean mask of length B.
:func:`row_positions` turns any of them into one int64 array of non-negative row numbers, so
each layer is gathered once with a plain index (``index_select`` for tensors, no per-key mask).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase

from dataproto.errors import DataProtoTypeError

__all__ = ["row_positions", "take_non_tensor_rows", "take_tensor_rows"]


class RowIndexError(IndexError, AssertionError):
    """An index is out of range or has the wrong shape / dtype for selecting rows."""


def _as_numpy(idxs: Any) -> np.ndarray:
    if isinstance(idxs, torch.Tensor):
        return idxs.detach().cpu().numpy()
    if isinstance(idxs, np.ndarray):
        return idxs
    if isinstance(idxs, list | tuple | range):
        array = np.asarray(idxs)
        return array if array.size else np.zeros(0, dtype=np.int64)
    raise DataProtoTypeError(
        f"row index must be a list, np.ndarray or torch.Tensor, got {type(idxs).__name__}"
    )


def row_positions(idxs: Any, length: int) -> np.ndarray:
    """Non-negative int64 row numbers for an index over ``length`` rows.

    >>> row_positions([2, -1, 0], 4).tolist()
    [2, 3, 0]
    >>> row_positions(np.array([True, False, True, False]), 4).tolist()
    [0, 2]
    >>> row_positions(torch.tensor([], dtype=torch.long), 4).tolist()
    []
    """
    array = _as_numpy(idxs)
    if array.ndim != 1:
        raise RowIndexError(
            f"row index must be 1-D, got shape {array.shape}"
            + ("; use an int (data[int(i)]) for one row" if array.ndim == 0 else "")
        )
    if array.dtype == np.bool_:
        if array.shape[0] != length:
            raise RowIndexError(
                f"boolean row mask has length {array.shape[0]}, but the DataProto has {length} rows"
            )
        return np.flatnonzero(array)
    if array.size == 0:
        return np.zeros(0, dtype=np.int64)
    if array.dtype.kind not in "iu":
        raise RowIndexError(f"row index must hold integers or bools, got dtype {array.dtype}")
    positions = array.astype(np.int64, copy=False)
    low, high = int(positions.min()), int(positions.max())
    if low < -length or high >= length:
        bad = low if low < -length else high
        raise RowIndexError(f"row index {bad} is out of range for a DataProto of {length} rows")
    if low < 0:
        positions = np.where(positions < 0, positions + length, positions)
    return positions


def _take(value: Any, index: torch.Tensor) -> Any:
    if isinstance(value, torch.Tensor) and not value.is_nested:
        return value.index_select(0, index)
    return value[index]


def take_tensor_rows(
    batch: TensorDictBase, positions: np.ndarray, device: Any = "keep"
) -> TensorDict:
    """A new TensorDict of ``batch``'s rows at ``positions`` (copies, never views).

    ``device="keep"`` gives the result ``batch.device``; pass None for no device.
    """
    index_cpu = torch.from_numpy(np.ascontiguousarray(positions, dtype=np.int64))
    by_device: dict[torch.device, torch.Tensor] = {index_cpu.device: index_cpu}
    source = {}
    for key, value in batch.items():
        where = value.device if value.device is not None else index_cpu.device
        if where not in by_device:
            by_device[where] = index_cpu.to(where)
        source[key] = _take(value, by_device[where])
    return TensorDict(
        source,
        batch_size=(len(positions),),
        device=batch.device if device == "keep" else device,
    )


def take_non_tensor_rows(
    non_tensor_batch: Mapping[str, np.ndarray], positions: np.ndarray
) -> dict[str, np.ndarray]:
    """Each array's rows at ``positions`` (numpy fancy indexing: copies)."""
    return {key: value[positions] for key, value in non_tensor_batch.items()}
