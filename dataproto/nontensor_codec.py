"""Pickle-free, type-preserving JSON encoding of non-tensor arrays and meta_info.

What an object-dtype array (or meta_info) may hold, recursively, and how it is written:

======================================  =============================================
value                                   JSON
======================================  =============================================
None, bool, int, str, finite float      itself (``1`` stays int, ``1.0`` stays float)
float NaN / +inf / −inf                 ``{"$float": "nan" | "inf" | "-inf"}``
list                                    JSON array
dict with str keys                      JSON object
tuple                                   ``{"$tuple": [...]}``
dict with other keys (int, tuple, …)    ``{"$dict": [[key, value], ...]}``
numpy bool/int/uint/float16-64/str_     ``{"$np": [dtype, value]}`` (meta_info: plain Python)
numpy array (numeric, bool, object)     ``{"$ndarray": [dtype, shape, flat values]}``
======================================  =============================================

A JSON object is read as a tag only when it has exactly one key and that key is a tag above; a
plain dict of that form is written in the ``$dict`` form, so no user dict is ever misread.
Anything else (arbitrary objects, tensors, sets, complex numbers, bytes, …) is rejected when
encoding, with a ``TypeError`` naming the key, the row, the path inside the value and the type.
Strings are written with ASCII escapes, so every Python str (lone surrogates included) round-trips.
"""

from __future__ import annotations

import io
import json
import math
from typing import Any

import numpy as np

OBJECT_ARRAY_FORMAT = "ppoflow-object-array"
OBJECT_ARRAY_VERSION = 1
_TAGS = frozenset({"$float", "$tuple", "$dict", "$np", "$ndarray"})
_NP_SCALAR_DTYPES = frozenset(
    {"bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"}
    | {"float16", "float32", "float64", "str"}
)
_NONFINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}


class UnsupportedValue(Exception):
    """Internal: a value that cannot be encoded; ``path`` grows as the error unwinds."""

    def __init__(self, value: Any, reason: str = "") -> None:
        super().__init__(reason)
        self.type_name = f"{type(value).__module__}.{type(value).__qualname__}"
        self.reason = reason
        self.path: list[str] = []

    def where(self) -> str:
        return "".join(self.path)


SUPPORTED = (
    "None, bool, int, float, str, list, tuple, dict, numpy scalars and numpy arrays of those"
)


def encode_value(value: Any, *, numpy_scalars: str = "preserve") -> Any:
    """Encode one value into JSON-ready data (table in the module docstring).

    Args:
        numpy_scalars: ``"preserve"`` tags numpy scalars with their dtype; ``"python"`` converts
            them to the equal Python scalar (used for meta_info).

    Raises:
        UnsupportedValue: for a value outside the table; its ``path`` locates it.

    >>> encode_value({"a": (1, 2.0, float("nan")), 3: None})
    {'$dict': [['a', {'$tuple': [1, 2.0, {'$float': 'nan'}]}], [3, None]]}
    """
    kind = type(value)
    if value is None or kind in (bool, int, str):
        return value
    if kind is float:
        return value if math.isfinite(value) else {"$float": _nonfinite_name(value)}
    if kind is list:
        return _encode_items(value, numpy_scalars)
    if kind is tuple:
        return {"$tuple": _encode_items(value, numpy_scalars)}
    if kind is dict:
        return _encode_dict(value, numpy_scalars)
    if isinstance(value, np.generic):
        return _encode_np_scalar(value, numpy_scalars)
    if kind is np.ndarray:
        return _encode_ndarray(value, numpy_scalars)
    raise UnsupportedValue(value)


def _nonfinite_name(value: float) -> str:
    return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")


def _encode_items(items: list | tuple, numpy_scalars: str) -> list:
    out = []
    for i, item in enumerate(items):
        try:
            out.append(encode_value(item, numpy_scalars=numpy_scalars))
        except UnsupportedValue as err:
            err.path.insert(0, f"[{i}]")
            raise
    return out


def _encode_dict(value: dict, numpy_scalars: str) -> dict:
    plain = all(type(k) is str for k in value) and not (
        len(value) == 1 and next(iter(value)) in _TAGS
    )
    pairs = []
    for key, item in value.items():
        try:
            enc_key = key if plain else encode_value(key, numpy_scalars=numpy_scalars)
            pairs.append((enc_key, encode_value(item, numpy_scalars=numpy_scalars)))
        except UnsupportedValue as err:
            err.path.insert(0, f"[{key!r}]")
            raise
    return dict(pairs) if plain else {"$dict": [list(p) for p in pairs]}


def _encode_np_scalar(value: np.generic, numpy_scalars: str) -> Any:
    name = "str" if isinstance(value, np.str_) else value.dtype.name
    if name not in _NP_SCALAR_DTYPES:
        raise UnsupportedValue(value, f"numpy dtype {value.dtype} is not storable")
    python_value = encode_value(str(value) if name == "str" else value.item())
    return python_value if numpy_scalars == "python" else {"$np": [name, python_value]}


def _encode_ndarray(value: np.ndarray, numpy_scalars: str) -> dict:
    if value.dtype != object and value.dtype.name not in _NP_SCALAR_DTYPES - {"str"}:
        raise UnsupportedValue(value, f"numpy array dtype {value.dtype} is not storable")
    flat = value.ravel().tolist() if value.dtype != object else list(value.ravel())
    items = _encode_items(flat, numpy_scalars)
    return {"$ndarray": [value.dtype.name, list(value.shape), items]}


def decode_value(data: Any) -> Any:
    """Inverse of :func:`encode_value`.

    >>> decode_value(encode_value({"a": (1, 2.0)})) == {"a": (1, 2.0)}
    True
    >>> type(decode_value(encode_value(np.float32(0.5))))
    <class 'numpy.float32'>
    """
    if isinstance(data, list):
        return [decode_value(item) for item in data]
    if not isinstance(data, dict):
        return data
    if len(data) == 1:
        ((tag, body),) = data.items()
        if tag in _TAGS:
            return _decode_tag(tag, body)
    return {key: decode_value(item) for key, item in data.items()}


def _decode_tag(tag: str, body: Any) -> Any:
    if tag == "$float":
        return _NONFINITE[body]
    if tag == "$tuple":
        return tuple(decode_value(item) for item in body)
    if tag == "$dict":
        return {decode_value(k): decode_value(v) for k, v in body}
    if tag == "$np":
        name, raw = body
        return np.str_(raw) if name == "str" else np.dtype(name).type(decode_value(raw))
    name, shape, items = body
    return object_array([decode_value(item) for item in items], shape, np.dtype(name))


def object_array(
    items: list, shape: list[int] | tuple[int, ...], dtype: Any = object
) -> np.ndarray:
    """An array of ``shape`` filled element by element (lists stay list elements, never sub-axes).

    >>> object_array([[1], [2, 3]], (2,)).tolist()
    [[1], [2, 3]]
    """
    out = np.empty(len(items), dtype=dtype)
    for i, item in enumerate(items):
        out[i] = item
    return out.reshape(tuple(shape))


def encode_object_array(key: str, array: np.ndarray) -> bytes:
    """JSON bytes for an object-dtype array of any shape (values flattened in C order).

    Raises:
        TypeError: naming ``key``, the row (dim-0 index), the path inside the value and its type.

    >>> json.loads(encode_object_array("uid", np.array([["a", 1]], dtype=object)))
    {'format': 'ppoflow-object-array', 'version': 1, 'shape': [1, 2], 'values': ['a', 1]}
    """
    flat = list(array.ravel())
    if all(type(v) is str for v in flat):  # fast path: uid, data_source, …
        values = flat
    else:
        row_stride = max(1, math.prod(array.shape[1:]))
        values = []
        # a repeated batch (repeat(n, interleave)) holds the same dict / list object in n rows:
        # encode each object once (the array keeps them alive, so ids are not reused meanwhile)
        encoded: dict[int, Any] = {}
        for i, item in enumerate(flat):
            known = encoded.get(id(item))
            if known is not None:
                values.append(known)
                continue
            try:
                values.append(encode_value(item))
            except UnsupportedValue as err:
                raise TypeError(_unsupported_message(key, i // row_stride, err)) from None
            if type(item) in (dict, list, tuple):
                encoded[id(item)] = values[-1]
    doc = {"format": OBJECT_ARRAY_FORMAT, "version": OBJECT_ARRAY_VERSION}
    doc |= {"shape": list(array.shape), "values": values}
    return json.dumps(doc, ensure_ascii=True, allow_nan=False).encode()


def _unsupported_message(key: str, row: int, err: UnsupportedValue) -> str:
    inner = f" at {err.where()}" if err.path else ""
    reason = f" ({err.reason})" if err.reason else ""
    return (
        f"non_tensor_batch[{key!r}] row {row}{inner}: a {err.type_name} cannot be stored without "
        f"pickle{reason}; supported: {SUPPORTED}. Convert it first (e.g. tensor.tolist())."
    )


def decode_object_array(data: bytes) -> np.ndarray:
    """Inverse of :func:`encode_object_array`; raises ValueError on another format or version."""
    doc = json.loads(data)
    if doc.get("format") != OBJECT_ARRAY_FORMAT or doc.get("version") != OBJECT_ARRAY_VERSION:
        raise ValueError(
            f"not a {OBJECT_ARRAY_FORMAT} v{OBJECT_ARRAY_VERSION} document: format "
            f"{doc.get('format')!r} version {doc.get('version')!r}"
        )
    return object_array([decode_value(v) for v in doc["values"]], doc["shape"])


def encode_numeric_array(key: str, array: np.ndarray) -> bytes:
    """``.npy`` bytes of a non-object array (``np.save`` with ``allow_pickle=False``)."""
    buffer = io.BytesIO()
    try:
        np.save(buffer, array, allow_pickle=False)
    except ValueError as err:
        raise TypeError(
            f"non_tensor_batch[{key!r}]: dtype {array.dtype} needs pickle to be saved ({err})"
        ) from None
    return buffer.getvalue()


def decode_numeric_array(data: bytes) -> np.ndarray:
    """Inverse of :func:`encode_numeric_array` (``np.load`` with ``allow_pickle=False``)."""
    return np.load(io.BytesIO(data), allow_pickle=False)


def encode_meta_info(meta_info: dict) -> bytes:
    """JSON bytes of meta_info; numpy scalars become Python scalars.

    Raises:
        TypeError: naming the key path (``meta_info['metrics']['loss'][2]``) and the type.

    >>> encode_meta_info({"temperature": np.float64(0.7), "steps": (1, 2)})
    b'{"temperature": 0.7, "steps": {"$tuple": [1, 2]}}'
    """
    if not isinstance(meta_info, dict):
        raise TypeError(f"meta_info must be a dict, got {type(meta_info).__name__}")
    try:
        encoded = encode_value(meta_info, numpy_scalars="python")
    except UnsupportedValue as err:
        reason = f" ({err.reason})" if err.reason else ""
        raise TypeError(
            f"meta_info{err.where()}: a {err.type_name} cannot be stored without pickle{reason}; "
            f"supported: {SUPPORTED}. Convert it first (e.g. tensor.tolist() or .item())."
        ) from None
    return json.dumps(encoded, ensure_ascii=True, allow_nan=False).encode()


def decode_meta_info(data: bytes) -> dict:
    """Inverse of :func:`encode_meta_info`."""
    return decode_value(json.loads(data))
