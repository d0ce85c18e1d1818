"""The schema of a DataProto: for every key its layer, dtype, shape and which dim is a token axis.

Dim 0 of every key is the row axis (B). Dim 1 is a *token axis* when it counts tokens:

- ``"response"``: the response axis R (``responses``, ``response_mask``, ``old_log_probs``, …, the
  keys of :data:`dataproto.keys.RESPONSE_TOKEN_KEYS`);
- ``"sequence"``: the full-sequence axis T = P + R or the prompt axis P (``input_ids``,
  ``attention_mask``, ``position_ids``, ``prompts``: :data:`dataproto.keys.SEQUENCE_TOKEN_KEYS`);
- ``None``: no token axis (1-D keys, non-tensor keys, unknown keys that cannot be inferred).

Inference rule for tensor keys that ``dataproto/keys.py`` does not list: a key with at least two
dims whose dim 1 equals the width of ``responses`` (when the batch holds ``responses``) is taken to
be on the response axis; every other unknown key gets ``None``. Known keys with fewer than two dims
also get ``None``.

The schema is what ``ppoflow inspect`` prints and what an artifact's manifest records.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch

from dataproto.keys import RESPONSE_TOKEN_KEYS, RESPONSES, SEQUENCE_TOKEN_KEYS

Layer = Literal["batch", "non_tensor_batch"]
TokenAxis = Literal["response", "sequence"] | None

_LAYERS = ("batch", "non_tensor_batch")
_TOKEN_AXES = ("response", "sequence", None)


@dataclass(frozen=True)
class KeySchema:
    """One key of a DataProto.

    Attributes:
        name: the key.
        layer: ``"batch"`` (a tensor in the TensorDict) or ``"non_tensor_batch"`` (a numpy array).
        dtype: torch dtype without the ``torch.`` prefix (``"bfloat16"``) or numpy dtype string
            (``"object"``, ``"int64"``, ``"<U5"``).
        shape: the full shape, dim 0 = rows.
        token_axis: what dim 1 counts (see the module docstring), or None.
    """

    name: str
    layer: Layer
    dtype: str
    shape: tuple[int, ...]
    token_axis: TokenAxis = None

    def __post_init__(self) -> None:
        if self.layer not in _LAYERS:
            raise ValueError(
                f"KeySchema {self.name!r}: layer {self.layer!r} is not one of {_LAYERS}"
            )
        if self.token_axis not in _TOKEN_AXES:
            raise ValueError(
                f"KeySchema {self.name!r}: token_axis {self.token_axis!r} is not one of {_TOKEN_AXES}"
            )


def torch_dtype_name(dtype: torch.dtype) -> str:
    """``torch.bfloat16`` → ``"bfloat16"``.

    >>> torch_dtype_name(torch.float32)
    'float32'
    """
    return str(dtype).removeprefix("torch.")


def _token_axis(name: str, shape: tuple[int, ...], response_width: int | None) -> TokenAxis:
    """The token axis of a tensor key (rule in the module docstring)."""
    if len(shape) < 2:
        return None
    if name in RESPONSE_TOKEN_KEYS:
        return "response"
    if name in SEQUENCE_TOKEN_KEYS:
        return "sequence"
    if response_width is not None and shape[1] == response_width:
        return "response"
    return None


def schema_of(data: Any) -> list[KeySchema]:
    """The schema of a DataProto: batch keys first (sorted), then non-tensor keys (sorted).

    ``data`` is anything with ``batch`` (TensorDict or None) and ``non_tensor_batch`` (dict of
    ndarrays) attributes, i.e. a DataProto or a DataProtoItem-like object.

    >>> from tensordict import TensorDict
    >>> from dataproto.protocol import DataProto
    >>> td = TensorDict({"responses": torch.zeros(2, 3, dtype=torch.long),
    ...                  "my_bonus": torch.zeros(2, 3)}, batch_size=[2])
    >>> dp = DataProto(batch=td, non_tensor_batch={"uid": np.array(["a", "b"], dtype=object)})
    >>> [(k.name, k.dtype, k.shape, k.token_axis) for k in schema_of(dp)]
    [('my_bonus', 'float32', (2, 3), 'response'), ('responses', 'int64', (2, 3), 'response'), ('uid', 'object', (2,), None)]
    """
    out: list[KeySchema] = []
    batch = data.batch
    if batch is not None:
        tensors = {str(k): v for k, v in batch.items()}
        responses = tensors.get(RESPONSES)
        width = int(responses.shape[1]) if responses is not None and responses.dim() >= 2 else None
        for name in sorted(tensors):
            value = tensors[name]
            if not isinstance(value, torch.Tensor):
                raise TypeError(
                    f"batch key {name!r} holds {type(value).__name__}; the schema expects a tensor"
                )
            shape = tuple(int(d) for d in value.shape)
            axis = _token_axis(name, shape, width)
            out.append(KeySchema(name, "batch", torch_dtype_name(value.dtype), shape, axis))
    for name in sorted(data.non_tensor_batch or {}):
        value = data.non_tensor_batch[name]
        if not isinstance(value, np.ndarray):
            raise TypeError(
                f"non_tensor_batch key {name!r} holds {type(value).__name__}; expected np.ndarray"
            )
        shape = tuple(int(d) for d in value.shape)
        out.append(KeySchema(name, "non_tensor_batch", str(value.dtype), shape, None))
    return out


def format_schema(schema: list[KeySchema]) -> str:
    """A plain-text table of the schema, one key per line.

    >>> print(format_schema([KeySchema("responses", "batch", "int64", (4, 8), "response"),
    ...                      KeySchema("uid", "non_tensor_batch", "object", (4,), None)]))
    key        layer             dtype   shape   token axis
    responses  batch             int64   (4, 8)  response
    uid        non_tensor_batch  object  (4,)    -
    """
    header = ("key", "layer", "dtype", "shape", "token axis")
    rows = [(k.name, k.layer, k.dtype, _shape_str(k.shape), k.token_axis or "-") for k in schema]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = [
        "  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)) for row in [header, *rows]
    ]
    return "\n".join(line.rstrip() for line in lines)


def _shape_str(shape: tuple[int, ...]) -> str:
    return "(" + ", ".join(str(d) for d in shape) + ("," if len(shape) == 1 else "") + ")"


def schema_to_json(schema: list[KeySchema]) -> list[dict[str, Any]]:
    """JSON-ready records (``json.dumps`` works on the result); inverse of :func:`schema_from_json`.

    >>> schema_to_json([KeySchema("uid", "non_tensor_batch", "object", (4,))])
    [{'name': 'uid', 'layer': 'non_tensor_batch', 'dtype': 'object', 'shape': [4], 'token_axis': None}]
    """
    return [
        {
            "name": k.name,
            "layer": k.layer,
            "dtype": k.dtype,
            "shape": list(k.shape),
            "token_axis": k.token_axis,
        }
        for k in schema
    ]


def schema_from_json(records: list[dict[str, Any]] | str) -> list[KeySchema]:
    """Rebuild a schema from :func:`schema_to_json` records, or from their JSON text.

    >>> s = [KeySchema("responses", "batch", "int64", (4, 8), "response")]
    >>> schema_from_json(json.dumps(schema_to_json(s))) == s
    True
    """
    if isinstance(records, str):
        records = json.loads(records)
    if not isinstance(records, list):
        raise TypeError(f"schema records must be a list of dicts, got {type(records).__name__}")
    out = []
    for i, rec in enumerate(records):
        expected = {"name", "layer", "dtype", "shape", "token_axis"}
        if not isinstance(rec, dict) or set(rec) != expected:
            got = sorted(rec) if isinstance(rec, dict) else type(rec).__name__
            raise ValueError(f"schema record {i}: expected keys {sorted(expected)}, got {got}")
        shape = tuple(int(d) for d in rec["shape"])
        out.append(KeySchema(rec["name"], rec["layer"], rec["dtype"], shape, rec["token_axis"]))
    return out
