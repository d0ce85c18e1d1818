"""Human-readable summaries of a DataProto: ``get_data_info`` and ``print_size``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from dataproto.protocol import DataProto

__all__ = ["data_info", "size_message", "type_info"]


def type_info(value: Any) -> str:
    """Recursive type description of a meta_info value (verl's format, sorted where it had a set).

    >>> type_info([1, "a", 2.0])
    'list[float|int|str]'
    >>> type_info({"lr": 0.1}), type_info((1, "x")), type_info({})
    ('dict[str: float]', 'tuple(int, str)', 'dict')
    >>> type_info(np.zeros((2, 3)))
    'ndarray(2, 3) (float64)'
    """
    if isinstance(value, list):
        element_types = sorted({type_info(v) for v in value[:3]})
        return f"list[{'|'.join(element_types) if element_types else '...'}]"
    if isinstance(value, tuple):
        return f"tuple({', '.join(type_info(v) for v in value)})"
    if isinstance(value, dict):
        if not value:
            return "dict"
        key, item = next(iter(value.items()))
        return f"dict[{type_info(key)}: {type_info(item)}]"
    if isinstance(value, np.ndarray):
        return f"ndarray{value.shape} ({value.dtype})"
    return type(value).__name__


def data_info(data: DataProto) -> str:
    """The text of ``DataProto.get_data_info``: batch, non_tensor_batch, meta_info, schema."""
    from dataproto.schema import format_schema, schema_of

    lines = ["batch"]
    if data.batch is not None:
        for key, tensor in data.batch.items():
            if hasattr(tensor, "shape") and hasattr(tensor, "dtype"):
                device = f" {tensor.device}" if getattr(tensor, "device", None) is not None else ""
                lines.append(f"  {key}: {tuple(tensor.shape)} ({tensor.dtype}){device}")
            else:
                lines.append(f"  {key}: {type(tensor).__name__}")
    lines.append("non_tensor_batch")
    for key, array in data.non_tensor_batch.items():
        lines.append(f"  {key}: ndarray{array.shape} ({array.dtype})")
    lines.append("meta_info")
    for key, value in data.meta_info.items():
        lines.append(f"  {key}: {type_info(value)}")
    lines.append("schema")
    lines.extend("  " + line for line in format_schema(schema_of(data)).splitlines())
    return "\n".join(lines)


def size_message(data: DataProto, prefix: str = "") -> str:
    """``"Size of tensordict: X GB, size of non_tensor_batch: Y GB"`` (verl's wording)."""
    tensor_bytes = 0
    if data.batch is not None:
        tensor_bytes = sum(t.element_size() * t.numel() for t in data.batch.values(True, True))
    numpy_bytes = sum(array.nbytes for array in data.non_tensor_batch.values())
    message = (
        f"Size of tensordict: {tensor_bytes / 1024**3} GB, "
        f"size of non_tensor_batch: {numpy_bytes / 1024**3} GB"
    )
    return f"{prefix}, {message}" if prefix else message
