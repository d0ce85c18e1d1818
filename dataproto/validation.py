"""Checks run when a DataProto is built: layer types, one batch dim, equal row counts.

Each check raises an error that names the key, its row count and the DataProto's row count.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from tensordict import TensorDictBase

from dataproto.errors import DataProtoTypeError, DataProtoValueError

__all__ = ["check_layers", "common_batch_size", "to_object_arrays"]


def check_layers(batch: Any, non_tensor_batch: Any, meta_info: Any) -> None:
    """Raise unless ``batch`` has one batch dim and every non-tensor array has its row count.

    With no batch, the first non-tensor key sets the row count.

    >>> check_layers(None, {"uid": np.array(["a", "b"]), "n": np.array([1])}, {})
    Traceback (most recent call last):
    ...
    dataproto.errors.DataProtoValueError: non_tensor_batch key 'n' has 1 rows, but the DataProto has 2 rows (batch size taken from non_tensor_batch key 'uid')
    """
    rows, source = None, None
    if batch is not None:
        if not isinstance(batch, TensorDictBase):
            raise DataProtoTypeError(
                f"batch must be a TensorDict or None, got {type(batch).__name__}"
            )
        if len(batch.batch_size) != 1:
            raise DataProtoValueError(
                f"batch must have exactly one batch dim (rows), got batch_size "
                f"{tuple(batch.batch_size)}; use fold_batch_dim / unfold_batch_dim"
            )
        rows, source = batch.batch_size[0], "batch"
    if not isinstance(non_tensor_batch, dict):
        raise DataProtoTypeError(
            f"non_tensor_batch must be a dict, got {type(non_tensor_batch).__name__}"
        )
    if not isinstance(meta_info, dict):
        raise DataProtoTypeError(f"meta_info must be a dict, got {type(meta_info).__name__}")
    for key, value in non_tensor_batch.items():
        if not isinstance(value, np.ndarray):
            raise DataProtoTypeError(
                f"non_tensor_batch key {key!r} must be a np.ndarray (object dtype for Python "
                f"objects), got {type(value).__name__}; DataProto.from_dict converts lists"
            )
        if value.ndim == 0:
            raise DataProtoValueError(
                f"non_tensor_batch key {key!r} is a 0-d array; it needs one entry per row"
            )
        if rows is None:
            rows, source = value.shape[0], f"non_tensor_batch key {key!r}"
        elif value.shape[0] != rows:
            raise DataProtoValueError(
                f"non_tensor_batch key {key!r} has {value.shape[0]} rows, but the DataProto "
                f"has {rows} rows (batch size taken from {source})"
            )


def common_batch_size(tensors: Mapping[str, Any], num_batch_dims: int) -> tuple[int, ...] | None:
    """The shared leading ``num_batch_dims`` dims of all tensors (None when there are none).

    >>> common_batch_size({"a": torch.zeros(2, 3), "b": torch.zeros(2)}, 1)
    (2,)
    """
    batch_size, pivot = None, None
    for key, tensor in tensors.items():
        if not isinstance(tensor, torch.Tensor | TensorDictBase):
            raise DataProtoTypeError(
                f"tensor key {key!r} holds {type(tensor).__name__}; put non-tensors in non_tensors"
            )
        lead = tuple(tensor.shape[:num_batch_dims])
        if batch_size is None:
            batch_size, pivot = lead, key
        elif lead != batch_size:
            raise DataProtoValueError(
                f"tensor key {key!r} has leading shape {lead}, but {pivot!r} has {batch_size} "
                f"(num_batch_dims={num_batch_dims}); all tensors must share their row dims"
            )
    return batch_size


def to_object_arrays(non_tensors: Mapping[str, Any] | None) -> dict[str, np.ndarray]:
    """A new dict where each value that is not an ndarray becomes an object array.

    A list of equal-length lists becomes a 2-D object array (numpy's rule, as in verl).

    >>> {k: v.shape for k, v in to_object_arrays({"uid": ["a", "b"], "l": [[1, 2], [3, 4]]}).items()}
    {'uid': (2,), 'l': (2, 2)}
    """
    return {
        key: value if isinstance(value, np.ndarray) else np.array(value, dtype=object)
        for key, value in (non_tensors or {}).items()
    }
