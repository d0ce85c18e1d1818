"""Splitting rows (chunk sizes) and joining them (``DataProto.concat``).

``concat`` has three parts: rows of tensors, rows of arrays, and meta_info.

meta_info merge (verl semantics): every key other than ``"metrics"`` must hold equal values in
every element that has it, and the union of keys is kept. ``"metrics"`` values are gathered
across elements (a list is extended, a dict appended, None skipped) and the gathered list of
dicts becomes a dict of lists whose keys come from the first dict.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase

from dataproto.equality import list_of_dict_to_dict_of_list, loose_equal
from dataproto.errors import DataProtoKeyError, DataProtoValueError, short_repr

__all__ = ["chunk_sizes", "concat_batches", "concat_non_tensors", "merge_meta_infos"]

METRICS_KEY = "metrics"

_PAD_HINT = (
    "pad first with `padded, pad_size = pad_dataproto_to_divisor(data, {n})` (and "
    "`unpad_dataproto(result, pad_size)` after), or enable auto-padding "
    "(`DataProto.from_dict(..., auto_padding=True)` or `DataProtoConfig.auto_padding = True`)"
)


def chunk_sizes(length: int, chunks: int, *, torch_style: bool, padding: bool) -> list[int]:
    """Row counts of the ``chunks`` pieces of ``length`` rows (``DataProto.chunk``).

    Without ``padding`` the length must be divisible. With it, ``torch_style`` (there is a
    batch) follows ``torch.chunk``: pieces of ceil(length / chunks) rows, which may give fewer
    than ``chunks`` pieces (an error); otherwise ``np.array_split``: sizes differ by at most 1.

    >>> chunk_sizes(10, 4, torch_style=True, padding=True), chunk_sizes(10, 4, torch_style=False, padding=True)
    ([3, 3, 3, 1], [3, 3, 2, 2])
    >>> chunk_sizes(5, 4, torch_style=True, padding=True)
    Traceback (most recent call last):
    ...
    dataproto.errors.DataProtoValueError: chunk: with auto-padding, 5 rows cut torch-style into pieces of 2 rows give only 3 chunks, not 4; pad with pad_dataproto_to_divisor(data, 4) first
    """
    if isinstance(chunks, bool) or not isinstance(chunks, int | np.integer) or chunks <= 0:
        raise DataProtoValueError(f"chunk: chunks must be a positive int, got {chunks!r}")
    if length % chunks and not padding:
        raise DataProtoValueError(
            f"chunk: {length} rows do not split into {chunks} equal chunks "
            f"({length} % {chunks} = {length % chunks}); " + _PAD_HINT.format(n=chunks)
        )
    if not torch_style:
        small, extra = divmod(length, chunks)
        return [small + 1] * extra + [small] * (chunks - extra)
    if length == 0:
        return [0] * chunks
    size = -(-length // chunks)  # ceil
    sizes = [size] * (length // size) + ([length % size] if length % size else [])
    if len(sizes) != chunks:
        raise DataProtoValueError(
            f"chunk: with auto-padding, {length} rows cut torch-style into pieces of {size} rows "
            f"give only {len(sizes)} chunks, not {chunks}; "
            f"pad with pad_dataproto_to_divisor(data, {chunks}) first"
        )
    return sizes


def concat_batches(batches: Sequence[TensorDictBase | None]) -> TensorDict | None:
    """Row-wise ``torch.cat`` of TensorDicts with the same keys (all None gives None).

    >>> a = TensorDict({"x": torch.tensor([1])}, batch_size=[1])
    >>> concat_batches([a, a])["x"].tolist()
    [1, 1]
    """
    present = [b is not None for b in batches]
    if not any(present):
        return None
    if not all(present):
        index = present.index(not present[0])
        raise DataProtoValueError(
            f"concat: element {index} has batch {'None' if present[0] else 'present'} while "
            f"element 0 has batch {'present' if present[0] else 'None'}; all must agree"
        )
    first_keys = list(batches[0].keys())
    expected = set(first_keys)
    for index, batch in enumerate(batches[1:], start=1):
        keys = set(batch.keys())
        if keys != expected:
            raise DataProtoKeyError(
                f"concat: layer 'batch' of element {index} has keys {sorted(keys)}, element 0 has "
                f"{sorted(expected)} (missing {sorted(expected - keys)}, extra {sorted(keys - expected)})"
            )
    source = {key: torch.cat([b.get(key) for b in batches], dim=0) for key in first_keys}
    devices = {b.device for b in batches}
    rows = sum(int(b.batch_size[0]) for b in batches)
    return TensorDict(
        source, batch_size=(rows,), device=devices.pop() if len(devices) == 1 else None
    )


def concat_non_tensors(dicts: Sequence[Mapping[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Row-wise ``np.concatenate`` per key; every element must have element 0's keys."""
    first = dicts[0]
    for index, entry in enumerate(dicts[1:], start=1):
        if entry.keys() != first.keys():
            missing, extra = (
                sorted(first.keys() - entry.keys()),
                sorted(entry.keys() - first.keys()),
            )
            raise DataProtoKeyError(
                f"concat: layer 'non_tensor_batch' of element {index} is missing keys {missing} "
                f"and has extra keys {extra} compared with element 0"
            )
    return {key: np.concatenate([entry[key] for entry in dicts], axis=0) for key in first}


def merge_meta_infos(metas: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Merge meta_info dicts (see the module docstring).

    >>> merge_meta_infos([{"t": 1.0, "metrics": [{"a": 1}]}, {"t": 1.0, "metrics": {"a": 2}}])
    {'t': 1.0, 'metrics': {'a': [1, 2]}}
    >>> merge_meta_infos([{"t": 1.0}, {"t": 0.5}])
    Traceback (most recent call last):
    ...
    dataproto.errors.DataProtoValueError: concat: conflicting values for meta_info key 't': element 0 has 1.0, element 1 has 0.5
    """
    merged: dict[str, Any] = {}
    origin: dict[str, int] = {}
    gathered: list = []
    for index, meta in enumerate(metas):
        for key, value in meta.items():
            if key == METRICS_KEY:
                if isinstance(value, list):
                    gathered.extend(value)
                elif value is not None:
                    gathered.append(value)
            elif key not in merged:
                merged[key], origin[key] = value, index
            elif not loose_equal(merged[key], value):
                raise DataProtoValueError(
                    f"concat: conflicting values for meta_info key {key!r}: element "
                    f"{origin[key]} has {short_repr(merged[key])}, element {index} has {short_repr(value)}"
                )
    if gathered:
        merged[METRICS_KEY] = list_of_dict_to_dict_of_list(gathered)
    return merged
