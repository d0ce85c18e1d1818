"""DataProtoItem: one row of a DataProto (what ``data[i]`` returns for an int ``i``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tensordict import TensorDict


@dataclass
class DataProtoItem:
    """One row: ``batch`` is the row's TensorDict (batch_size ``[]``) or None, ``non_tensor_batch``
    maps each key to the row's element, ``meta_info`` is the parent's dict (the same object).

    No checks run on construction (as in verl).

    >>> import torch
    >>> from dataproto import DataProto
    >>> item = DataProto.from_dict({"x": torch.tensor([5, 6])}, {"uid": ["a", "b"]})[1]
    >>> int(item.batch["x"]), item.non_tensor_batch["uid"]
    (6, 'b')
    """

    batch: TensorDict | None = None
    non_tensor_batch: dict[str, Any] = field(default_factory=dict)
    meta_info: dict[str, Any] = field(default_factory=dict)
