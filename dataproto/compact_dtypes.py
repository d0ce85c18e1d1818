"""Lossless narrow dtypes for an artifact's integer tensors on disk.

Token ids, masks and position ids live in memory as int64 (verl's layout), but their values
are small: a mask holds 0 and 1, position ids stay below the sequence length, token ids below
the vocabulary size. On disk each integer tensor is stored in the narrowest integer dtype that
holds every one of its values — ``uint8`` (0…255), ``int8`` (-128…127), ``uint16``
(0…65,535), ``int16``, ``int32`` — and cast back to its in-memory dtype when the artifact is
loaded, so a load returns exactly the tensor that was saved (same dtype, same values).

The choice depends only on the tensor's minimum and maximum, so equal tensors are always stored
alike and the artifact fingerprint stays a function of the content. Floating-point and bool
tensors are stored as they are (narrowing them would lose information or save nothing). A
tensor already in its narrowest dtype is stored as it is.

The manifest lists the stored dtype of every narrowed key (``batch.stored``); the schema keeps
the in-memory dtype, which the load restores.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

#: narrowest first; each with its (min, max)
_NARROW_INTS: tuple[tuple[torch.dtype, int, int], ...] = tuple(
    (dtype, int(torch.iinfo(dtype).min), int(torch.iinfo(dtype).max))
    for dtype in (torch.uint8, torch.int8, torch.uint16, torch.int16, torch.int32)
)
#: the dtype names a manifest's ``batch.stored`` may give
STORED_DTYPE_NAMES = frozenset(str(dtype).removeprefix("torch.") for dtype, _, _ in _NARROW_INTS)
#: the integer dtypes narrowed; uint64 is not (torch has no min / max for it, nor a wider
#: signed dtype to take them in)
_INTEGER_DTYPES = {
    torch.uint8,
    torch.int8,
    torch.uint16,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.uint32,
}
_NO_MIN_MAX = {torch.uint16, torch.uint32}  # torch computes neither: read them as int64


def storage_dtype(tensor: torch.Tensor) -> torch.dtype:
    """The dtype ``tensor`` is stored in: for an integer tensor the narrowest of uint8, int8,
    uint16, int16, int32 that holds its minimum and maximum (never wider than its own dtype);
    any other tensor keeps its dtype.

    >>> storage_dtype(torch.tensor([0, 1, 1]))
    torch.uint8
    >>> storage_dtype(torch.tensor([-1, 300])), storage_dtype(torch.tensor([151_000]))
    (torch.int16, torch.int32)
    >>> storage_dtype(torch.tensor([0.5])), storage_dtype(torch.tensor([], dtype=torch.int64))
    (torch.float32, torch.uint8)
    """
    if tensor.dtype not in _INTEGER_DTYPES:
        return tensor.dtype
    if tensor.numel() == 0:
        return torch.uint8
    values = tensor.to(torch.int64) if tensor.dtype in _NO_MIN_MAX else tensor
    low, high = int(values.min()), int(values.max())
    own = tensor.element_size()
    for dtype, dtype_min, dtype_max in _NARROW_INTS:
        if dtype_min <= low and high <= dtype_max and dtype.itemsize <= own:
            return dtype
    return tensor.dtype


def narrow_tensors(
    tensors: Mapping[str, torch.Tensor],
) -> tuple[dict[str, torch.Tensor], dict[str, torch.dtype]]:
    """(the tensors to write, name → stored dtype of each key stored narrower than in memory).

    >>> stored, narrowed = narrow_tensors({"mask": torch.ones(2, dtype=torch.int64)})
    >>> stored["mask"].dtype, narrowed
    (torch.uint8, {'mask': torch.uint8})
    """
    stored: dict[str, torch.Tensor] = {}
    narrowed: dict[str, torch.dtype] = {}
    for name, tensor in tensors.items():
        dtype = storage_dtype(tensor)
        if dtype != tensor.dtype:
            stored[name], narrowed[name] = tensor.to(dtype), dtype
        else:
            stored[name] = tensor
    return stored, narrowed


def widen_tensors(
    tensors: Mapping[str, torch.Tensor], dtypes: Mapping[str, torch.dtype]
) -> dict[str, torch.Tensor]:
    """The loaded tensors in their in-memory dtypes (``dtypes``: name → dtype from the schema);
    a narrowed tensor becomes a new tensor, the others stay the file's views.

    >>> widen_tensors({"m": torch.ones(2, dtype=torch.uint8)}, {"m": torch.int64})["m"].dtype
    torch.int64
    """
    return {
        name: tensor if tensor.dtype == dtypes[name] else tensor.to(dtypes[name])
        for name, tensor in tensors.items()
    }
