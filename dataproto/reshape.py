"""Reshapes and repeats: moving rows between the batch dim and the next dim, repeating rows.

- :func:`repeat_rows`: every row n times, interleaved [a, a, b, b] or tiled [a, b, a, b].
- :func:`sample_repeat_positions`: the row positions for a per-row repeat count.

- :func:`fold_batch_dim`: (B, …) → B' rows of (B/B', …).
- :func:`unfold_batch_dim`: the inverse, flattening the first ``batch_dims`` dims into rows.
- :func:`unfold_column_chunks`: (B, C, …) → (B·n, C/n, …) for chosen keys; other keys repeat
  each row n times, so row b's n column pieces become rows b·n … b·n + n − 1.

None of them changes its input.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, TypeVar

import numpy as np
import torch
from tensordict import TensorDict

from dataproto.errors import DataProtoTypeError, DataProtoValueError

if TYPE_CHECKING:
    from dataproto.protocol import DataProto

__all__ = [
    "fold_batch_dim",
    "repeat_rows",
    "sample_repeat_positions",
    "unfold_batch_dim",
    "unfold_column_chunks",
]

D = TypeVar("D", bound="DataProto")


def fold_batch_dim(data: D, new_batch_size: int) -> D:
    """Fold (B, …) into ``new_batch_size`` rows of shape (B / new_batch_size, …).

    >>> from dataproto import DataProto
    >>> folded = fold_batch_dim(DataProto.from_dict({"x": torch.arange(6)}), 2)
    >>> len(folded), folded.batch["x"].tolist()
    (2, [[0, 1, 2], [3, 4, 5]])
    """
    length = len(data)
    if new_batch_size <= 0 or length % new_batch_size != 0:
        raise DataProtoValueError(
            f"fold_batch_dim: {length} rows cannot be folded into {new_batch_size} rows "
            f"(need a positive divisor of {length})"
        )
    batch = None
    if data.batch is not None:
        source = {
            key: value.reshape(new_batch_size, -1, *value.shape[1:])
            for key, value in data.batch.items()
        }
        batch = TensorDict(source, batch_size=(new_batch_size,), device=data.batch.device)
    non_tensor = {
        key: np.reshape(value, (new_batch_size, -1, *value.shape[1:]))
        for key, value in data.non_tensor_batch.items()
    }
    return type(data)(batch=batch, non_tensor_batch=non_tensor, meta_info=data.meta_info)


def unfold_batch_dim(data: D, batch_dims: int = 2) -> D:
    """Flatten the first ``batch_dims`` dims of every value into rows (inverse of fold).

    >>> from dataproto import DataProto
    >>> data = DataProto.from_dict({"x": torch.arange(6)})
    >>> unfold_batch_dim(fold_batch_dim(data, 2)).batch["x"].tolist()
    [0, 1, 2, 3, 4, 5]
    """
    if batch_dims < 1:
        raise DataProtoValueError(f"unfold_batch_dim: batch_dims must be >= 1, got {batch_dims}")
    lead: tuple[int, ...] | None = None
    values = [
        *(data.batch.items() if data.batch is not None else ()),
        *data.non_tensor_batch.items(),
    ]
    for key, value in values:
        shape = tuple(value.shape[:batch_dims])
        if len(shape) < batch_dims or (lead is not None and shape != lead):
            raise DataProtoValueError(
                f"unfold_batch_dim: key {key!r} has shape {tuple(value.shape)}; every key needs the "
                f"same first {batch_dims} dims (first key had {lead})"
            )
        lead = shape
    rows = int(np.prod(lead)) if lead is not None else 0
    batch = None
    if data.batch is not None:
        source = {
            key: value.reshape(rows, *value.shape[batch_dims:]) for key, value in data.batch.items()
        }
        batch = TensorDict(source, batch_size=(rows,), device=data.batch.device)
    non_tensor = {
        key: np.reshape(value, (rows, *value.shape[batch_dims:]))
        for key, value in data.non_tensor_batch.items()
    }
    return type(data)(batch=batch, non_tensor_batch=non_tensor, meta_info=data.meta_info)


def _split_columns(key: str, value: torch.Tensor | np.ndarray, n_split: int):
    if value.ndim < 2 or value.shape[1] % n_split != 0:
        raise DataProtoValueError(
            f"unfold_column_chunks: key {key!r} has shape {tuple(value.shape)}; dim 1 must exist "
            f"and be divisible by n_split={n_split}"
        )
    return value.reshape(value.shape[0] * n_split, value.shape[1] // n_split, *value.shape[2:])


def unfold_column_chunks(data: D, n_split: int, split_keys: Iterable[str] | None = None) -> D:
    """Cut dim 1 of ``split_keys`` into ``n_split`` pieces that become rows; repeat other keys.

    ``split_keys=None`` splits nothing (every key is repeated).

    >>> from dataproto import DataProto
    >>> data = DataProto.from_dict({"x": torch.tensor([[1, 2, 3, 4]]), "y": torch.tensor([7])})
    >>> out = unfold_column_chunks(data, 2, split_keys=["x"])
    >>> out.batch["x"].tolist(), out.batch["y"].tolist()
    ([[1, 2], [3, 4]], [7, 7])
    """
    if n_split <= 0:
        raise DataProtoValueError(f"unfold_column_chunks: n_split must be > 0, got {n_split}")
    keys = set(split_keys or ())
    batch = None
    if data.batch is not None:
        source = {
            key: _split_columns(key, value, n_split)
            if key in keys
            else torch.repeat_interleave(value, n_split, dim=0)
            for key, value in data.batch.items()
        }
        rows = data.batch.batch_size[0] * n_split
        batch = TensorDict(source, batch_size=(rows,), device=data.batch.device)
    non_tensor = {
        key: _split_columns(key, value, n_split)
        if key in keys
        else np.repeat(value, n_split, axis=0)
        for key, value in data.non_tensor_batch.items()
    }
    return type(data)(batch=batch, non_tensor_batch=non_tensor, meta_info=data.meta_info)


def repeat_rows(data: D, repeat_times: int, interleave: bool) -> D:
    """Each row ``repeat_times`` times (``DataProto.repeat``); ``meta_info`` is shared.

    The new TensorDict has no device set (as in verl); its tensors stay where they were.

    >>> from dataproto import DataProto
    >>> repeat_rows(DataProto.from_dict({"x": torch.tensor([1, 2])}), 3, False).batch["x"].tolist()
    [1, 2, 1, 2, 1, 2]
    """
    if (
        isinstance(repeat_times, bool)
        or not isinstance(repeat_times, int | np.integer)
        or repeat_times < 0
    ):
        raise DataProtoValueError(f"repeat: repeat_times must be an int >= 0, got {repeat_times!r}")
    batch = None
    if data.batch is not None:
        if interleave:
            source = {k: v.repeat_interleave(repeat_times, dim=0) for k, v in data.batch.items()}
        else:
            source = {  # expand + one copy into the final layout (faster than Tensor.repeat)
                k: v.unsqueeze(0).expand(repeat_times, *v.shape).reshape(-1, *v.shape[1:])
                for k, v in data.batch.items()
            }
        batch = TensorDict(source, batch_size=(len(data) * repeat_times,))
    if interleave:
        non_tensor = {
            k: np.repeat(v, repeat_times, axis=0) for k, v in data.non_tensor_batch.items()
        }
    else:
        non_tensor = {
            k: np.tile(v, (repeat_times,) + (1,) * (v.ndim - 1))
            for k, v in data.non_tensor_batch.items()
        }
    return type(data)(batch=batch, non_tensor_batch=non_tensor, meta_info=data.meta_info)


def sample_repeat_positions(repeat_times: object, length: int) -> np.ndarray:
    """Row positions repeating row i ``repeat_times[i]`` times (list, tuple, 1-D array/tensor).

    >>> sample_repeat_positions((2, 0, 1), 3).tolist()
    [0, 0, 2]
    """
    if isinstance(repeat_times, torch.Tensor):
        repeat_times = repeat_times.detach().cpu().numpy()
    if not isinstance(repeat_times, list | tuple | np.ndarray):
        raise DataProtoTypeError(
            "sample_level_repeat: repeat_times must be a list, tuple, np.ndarray or torch.Tensor, "
            f"got {type(repeat_times).__name__}"
        )
    counts = np.asarray(repeat_times)
    if counts.size == 0:
        counts = counts.astype(np.int64)
    if counts.ndim != 1 or counts.shape[0] != length or counts.dtype.kind not in "iu":
        raise DataProtoValueError(
            f"sample_level_repeat: repeat_times must be {length} ints (one per row), got "
            f"shape {counts.shape} dtype {counts.dtype}"
        )
    if counts.size and counts.min() < 0:
        raise DataProtoValueError(f"sample_level_repeat: counts must be >= 0, got {counts.min()}")
    return np.repeat(np.arange(length), counts)
