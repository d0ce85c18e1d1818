"""Equality and union of the three DataProto layers.

Two notions of equality, both NaN-aware (a NaN equals a NaN) and both short-circuiting on identity:

- :func:`deep_equal` (non-tensor layer, as verl's ``_deep_equal``): the two values must have the
  same Python type at every level; numpy arrays must agree in dtype and shape; object arrays,
  dicts, lists and tuples are compared element by element, recursively; a cycle counts as equal.
- :func:`loose_equal` (meta_info, as verl's ``==``): Python equality (``1 == 1.0``), made safe for
  numpy arrays and tensors (no "truth value is ambiguous" error) and NaN-aware.

Tensors (:func:`tensors_equal`) compare by value like ``torch.equal``: an int tensor equals a float
tensor holding the same numbers. Unions never overwrite: a shared key whose values differ raises
:class:`~dataproto.errors.DataProtoValueError` naming the key and the layer.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict

from dataproto.errors import DataProtoKeyError, DataProtoTypeError, DataProtoValueError, short_repr

__all__ = [
    "check_numpy_union",
    "check_tensor_union",
    "check_two_dict_union",
    "dataproto_equal",
    "deep_equal",
    "list_of_dict_to_dict_of_list",
    "loose_equal",
    "tensors_equal",
    "union_numpy_dict",
    "union_tensor_dict",
    "union_two_dict",
]


# --- tensors ---


def _same_view(a: torch.Tensor, b: torch.Tensor) -> bool:
    """True when ``a`` and ``b`` read the same memory the same way (so they are equal)."""
    return (
        a.device == b.device
        and a.dtype == b.dtype
        and a.shape == b.shape
        and a.stride() == b.stride()
        and a.data_ptr() == b.data_ptr()
        and not a.is_nested
    )


def tensors_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Value equality of two tensors, NaN == NaN, dtypes may differ (``torch.equal`` semantics).

    >>> tensors_equal(torch.tensor([1, 2]), torch.tensor([1.0, 2.0]))
    True
    >>> tensors_equal(torch.tensor([float("nan"), 1.0]), torch.tensor([float("nan"), 1.0]))
    True
    >>> tensors_equal(torch.zeros(2), torch.zeros(3))
    False
    """
    if a is b or _same_view(a, b):
        return True
    if a.shape != b.shape:
        return False
    if b.device != a.device:
        b = b.to(a.device)
    if torch.equal(a, b):
        return True
    if not (a.is_floating_point() or a.is_complex()) or not (
        b.is_floating_point() or b.is_complex()
    ):
        return False
    both_nan = torch.isnan(a) & torch.isnan(b)
    return bool(((a == b) | both_nan).all())


# --- python / numpy values ---


def _is_nan(x: Any) -> bool:
    return isinstance(x, float | np.floating) and math.isnan(x)


def _arrays_equal(a: np.ndarray, b: np.ndarray, strict: bool, visited: set) -> bool:
    if a.shape != b.shape or (strict and a.dtype != b.dtype):
        return False
    if (
        a.dtype == b.dtype
        and a.strides == b.strides
        and a.__array_interface__["data"][0] == b.__array_interface__["data"][0]
    ):
        return True  # the same memory read the same way
    if a.dtype != object and b.dtype != object:
        numeric = a.dtype.kind in "fc" and b.dtype.kind in "fc"
        return bool(np.array_equal(a, b, equal_nan=numeric))
    return all(x is y or _equal(x, y, strict, visited) for x, y in zip(a.flat, b.flat))


def _containers_equal(a: Any, b: Any, strict: bool, visited: set) -> bool | None:
    """Equality of dicts / lists / tuples / arrays / tensors; None when ``a`` is none of them."""
    if isinstance(a, np.ndarray) and isinstance(b, np.ndarray):
        return _arrays_equal(a, b, strict, visited)
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return tensors_equal(a, b)
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        if a.keys() != b.keys():
            return False
        return all(_equal(a[k], b[k], strict, visited) for k in a)
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        if type(a) is not type(b) or len(a) != len(b):
            return False
        return all(_equal(x, y, strict, visited) for x, y in zip(a, b))
    return None


def _equal(a: Any, b: Any, strict: bool, visited: set) -> bool:
    if a is b:
        return True
    if strict and type(a) is not type(b):
        return False
    if _is_nan(a) and _is_nan(b):
        return True
    pair = (id(a), id(b))
    if pair in visited:
        return True  # a cycle: equal so far on this path
    visited.add(pair)
    try:
        result = _containers_equal(a, b, strict, visited)
        if result is not None:
            return result
        if isinstance(a, np.ndarray | torch.Tensor) or isinstance(b, np.ndarray | torch.Tensor):
            return False  # an array against a scalar or another container type
        try:
            return bool(a == b)
        except (TypeError, ValueError):
            return False  # objects whose == has no single truth value are not "equal"
    finally:
        visited.discard(pair)


def deep_equal(a: Any, b: Any) -> bool:
    """Strict recursive equality (same types at every level, NaN == NaN), verl's ``_deep_equal``.

    >>> nan = float("nan")
    >>> deep_equal(np.array([{"x": [1, nan]}], dtype=object), np.array([{"x": [1, nan]}], dtype=object))
    True
    >>> deep_equal(np.array([1, 2]), np.array([1.0, 2.0]))  # dtypes differ
    False
    >>> deep_equal(1, 1.0)
    False
    """
    return _equal(a, b, strict=True, visited=set())


def loose_equal(a: Any, b: Any) -> bool:
    """Python ``==`` made NaN-aware and safe for arrays and tensors (for meta_info values).

    >>> loose_equal(1, 1.0), loose_equal({"t": float("nan")}, {"t": float("nan")})
    (True, True)
    >>> loose_equal(np.array([1, 2]), np.array([1, 3]))
    False
    """
    return _equal(a, b, strict=False, visited=set())


def dataproto_equal(a: Any, b: Any) -> bool:
    """Same row count, same keys per layer, equal values (tensor dtypes must match too).

    Works on anything with ``batch`` / ``non_tensor_batch`` / ``meta_info`` (a DataProto).

    >>> from dataproto import DataProto
    >>> x = DataProto.from_dict({"x": torch.tensor([1.0, float("nan")])}, {"uid": ["a", "b"]})
    >>> dataproto_equal(x, x.select_idxs([0, 1])), dataproto_equal(x, x[:1])
    (True, False)
    """
    if len(a) != len(b) or (a.batch is None) != (b.batch is None):
        return False
    if a.batch is not None:
        keys = set(a.batch.keys(True, True))
        if keys != set(b.batch.keys(True, True)):
            return False
        for key in keys:
            mine, theirs = a.batch.get(key), b.batch.get(key)
            if mine.dtype != theirs.dtype or not tensors_equal(mine, theirs):
                return False
    if a.non_tensor_batch.keys() != b.non_tensor_batch.keys():
        return False
    if not all(deep_equal(v, b.non_tensor_batch[k]) for k, v in a.non_tensor_batch.items()):
        return False
    return loose_equal(a.meta_info, b.meta_info)


# --- unions ---


def check_tensor_union(td1: TensorDict | None, td2: TensorDict | None) -> None:
    """Raise unless ``td2`` can be merged into ``td1`` without overwriting a different value."""
    if td1 is None or td2 is None:
        return
    if td1.batch_size != td2.batch_size:
        raise DataProtoValueError(
            f"union: batch sizes differ: {tuple(td1.batch_size)} vs {tuple(td2.batch_size)}; "
            "both DataProtos must hold the same rows"
        )
    mine_keys = set(td1.keys())  # (TensorDict has no `in`; iterating it walks rows)
    for key in list(td2.keys()):
        if key in mine_keys:
            mine, theirs = td1.get(key), td2.get(key)
            if not tensors_equal(mine, theirs):
                raise DataProtoValueError(
                    f"union: key {key!r} in layer 'batch' holds different values on the two sides "
                    f"(self {tuple(mine.shape)} {mine.dtype}, other {tuple(theirs.shape)} "
                    f"{theirs.dtype}); union never overwrites: rename or pop one of them first"
                )


def union_tensor_dict(tensor_dict1: TensorDict, tensor_dict2: TensorDict) -> TensorDict:
    """Add ``tensor_dict2``'s keys to ``tensor_dict1`` in place and return it (verl semantics).

    A shared key must hold equal values (self's tensor and dtype are kept).

    >>> a = TensorDict({"x": torch.tensor([1, 2])}, batch_size=[2])
    >>> b = TensorDict({"x": torch.tensor([1.0, 2.0]), "y": torch.zeros(2)}, batch_size=[2])
    >>> sorted(union_tensor_dict(a, b).keys()), a["x"].dtype
    (['x', 'y'], torch.int64)
    """
    check_tensor_union(tensor_dict1, tensor_dict2)
    mine_keys = set(tensor_dict1.keys())
    for key in list(tensor_dict2.keys()):
        if key not in mine_keys:
            tensor_dict1[key] = tensor_dict2.get(key)
    return tensor_dict1


def check_numpy_union(dict1: Mapping[str, np.ndarray], dict2: Mapping[str, np.ndarray]) -> None:
    """Raise unless every key shared by the two non-tensor dicts holds deep-equal arrays."""
    for key, theirs in dict2.items():
        if key not in dict1:
            continue
        mine = dict1[key]
        for side, value in (("self", mine), ("other", theirs)):
            if not isinstance(value, np.ndarray):
                raise DataProtoTypeError(
                    f"union: key {key!r} in layer 'non_tensor_batch' of {side} holds "
                    f"{type(value).__name__}; expected np.ndarray"
                )
        if not deep_equal(mine, theirs):
            raise DataProtoValueError(
                f"union: key {key!r} in layer 'non_tensor_batch' holds different values on the two "
                f"sides (self {mine.shape} {mine.dtype}, other {theirs.shape} {theirs.dtype}); "
                "union never overwrites: rename or pop one of them first"
            )


def union_numpy_dict(
    tensor_dict1: dict[str, np.ndarray], tensor_dict2: Mapping[str, np.ndarray]
) -> dict[str, np.ndarray]:
    """Add ``tensor_dict2``'s arrays to ``tensor_dict1`` in place and return it (verl semantics).

    >>> a = {"uid": np.array(["p0", "p1"], dtype=object)}
    >>> sorted(union_numpy_dict(a, {"uid": a["uid"].copy(), "n": np.array([1, 2])}))
    ['n', 'uid']
    """
    check_numpy_union(tensor_dict1, tensor_dict2)
    tensor_dict1.update(tensor_dict2)
    return tensor_dict1


def check_two_dict_union(dict1: Mapping, dict2: Mapping, layer: str = "meta_info") -> None:
    """Raise unless every key shared by the two dicts holds (loosely) equal values."""
    for key, theirs in dict2.items():
        if key in dict1 and not loose_equal(dict1[key], theirs):
            raise DataProtoValueError(
                f"union: key {key!r} in layer {layer!r} differs: self has "
                f"{short_repr(dict1[key])}, other has {short_repr(theirs)}; union never overwrites"
            )


def union_two_dict(dict1: dict, dict2: Mapping) -> dict:
    """Merge ``dict2`` into ``dict1`` in place (shared keys must be equal) and return it.

    >>> union_two_dict({"temperature": 1.0}, {"temperature": 1, "step": 3})
    {'temperature': 1, 'step': 3}
    """
    check_two_dict_union(dict1, dict2)
    dict1.update(dict2)
    return dict1


def list_of_dict_to_dict_of_list(list_of_dict: Iterable[Mapping]) -> dict[str, list]:
    """``[{"a": 1}, {"a": 2}]`` → ``{"a": [1, 2]}``; the keys come from the first dict.

    A later dict may lack a key (its list is then shorter) but may not add one.

    >>> list_of_dict_to_dict_of_list([{"loss": 1.0, "lr": 0.1}, {"loss": 0.5}])
    {'loss': [1.0, 0.5], 'lr': [0.1]}
    """
    items = list(list_of_dict)
    if not items:
        return {}
    output: dict[str, list] = {}
    for index, entry in enumerate(items):
        if not isinstance(entry, Mapping):
            raise DataProtoTypeError(
                f"list_of_dict_to_dict_of_list: element {index} is {type(entry).__name__}; "
                "expected a dict"
            )
        if index == 0:
            output = {key: [] for key in entry}
        for key, value in entry.items():
            if key not in output:
                raise DataProtoKeyError(
                    f"list_of_dict_to_dict_of_list: key {key!r} of element {index} is not among "
                    f"the first element's keys {sorted(output)}"
                )
            output[key].append(value)
    return output
