"""Moving a DataProto between processes (pickle / Ray) and to / from a single TensorDict.

Pickle state is ``(batch_bytes, non_tensor_batch, meta_info)`` as in verl. ``batch_bytes`` is a
``torch.save`` of a plain dict ``{"batch_size", "device", "tensors"}`` (None when there is no
batch), loaded back with ``torch.load(weights_only=True)``: the tensor payload itself never runs
pickle code. This is for transport between ppoflow's own processes; artifacts on disk use the
safe format in ``dataproto.artifact``.
"""

from __future__ import annotations

import io
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from tensordict import NonTensorData, NonTensorStack, TensorDict, TensorDictBase

from dataproto.errors import DataProtoKeyError, DataProtoValueError

if TYPE_CHECKING:
    from dataproto.protocol import DataProto

__all__ = ["batch_from_bytes", "batch_to_bytes", "from_tensordict", "to_tensordict"]


def batch_to_bytes(batch: TensorDictBase | None) -> bytes | None:
    """Serialize a TensorDict's tensors, batch size and device (None stays None)."""
    if batch is None:
        return None
    payload = {
        "batch_size": [int(d) for d in batch.batch_size],
        "device": None if batch.device is None else str(batch.device),
        "tensors": batch.to_dict(),
    }
    buffer = io.BytesIO()
    torch.save(payload, buffer)
    return buffer.getvalue()


def batch_from_bytes(data: bytes | None) -> TensorDict | None:
    """Inverse of :func:`batch_to_bytes`; tensors land on CPU when CUDA is unavailable."""
    if data is None:
        return None
    map_location = None if torch.cuda.is_available() else "cpu"
    payload = torch.load(io.BytesIO(data), weights_only=True, map_location=map_location)
    device = payload["device"]
    if device is not None and map_location == "cpu":
        device = "cpu"
    return TensorDict(payload["tensors"], batch_size=payload["batch_size"], device=device)


def to_tensordict(data: DataProto) -> TensorDict:
    """One TensorDict: tensors as they are, non-tensors as ``NonTensorStack``s of
    ``NonTensorData`` rows, meta_info entries as ``NonTensorData``.

    >>> from dataproto import DataProto
    >>> td = to_tensordict(DataProto.from_dict({"x": torch.zeros(2)}, {"uid": ["a", "b"]}, {"step": 3}))
    >>> sorted(td.keys()), list(td["uid"]), td["step"]
    (['step', 'uid', 'x'], ['a', 'b'], 3)
    """
    source: dict[str, Any] = dict(data.batch.items()) if data.batch is not None else {}
    for key, value in data.non_tensor_batch.items():
        if key in source:
            raise DataProtoKeyError(
                f"to_tensordict: key {key!r} is in both 'batch' and 'non_tensor_batch'"
            )
        source[key] = NonTensorStack.from_list([NonTensorData(row) for row in value])
    for key, value in data.meta_info.items():
        if key in source:
            raise DataProtoKeyError(
                f"to_tensordict: meta_info key {key!r} is also a batch or non-tensor key"
            )
        source[key] = NonTensorData(value)
    device = data.batch.device if data.batch is not None else None
    return TensorDict(source, batch_size=[len(data)], device=device)


def from_tensordict(
    cls: type[DataProto],
    tensor_dict: TensorDictBase,
    meta_info: dict | None = None,
    num_batch_dims: int = 1,
) -> DataProto:
    """Split a TensorDict into the three layers (inverse of :func:`to_tensordict`).

    Tensors (and sub-TensorDicts) go to ``batch``, ``NonTensorStack`` entries become object
    arrays, ``NonTensorData`` entries go to ``meta_info`` (added to the given dict).
    """
    if num_batch_dims != 1:
        raise DataProtoValueError(
            f"from_tensordict: only num_batch_dims=1 is supported, got {num_batch_dims}"
        )
    meta = {} if meta_info is None else meta_info
    tensors: dict[str, Any] = {}
    non_tensors: dict[str, np.ndarray] = {}
    for key, value in tensor_dict.items():
        if isinstance(value, NonTensorStack):
            rows = [row.data if isinstance(row, NonTensorData) else row for row in value]
            non_tensors[key] = np.array(rows, dtype=object)
        elif isinstance(value, NonTensorData):
            meta[key] = value.data
        else:
            tensors[key] = value
    batch = None
    if tensors:
        rows = next(iter(tensors.values())).shape[:1]
        batch = TensorDict(tensors, batch_size=rows, device=tensor_dict.device)
    return cls(batch=batch, non_tensor_batch=non_tensors, meta_info=meta)
