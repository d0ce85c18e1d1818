"""The tensor layer of an artifact as one safetensors file: a streaming writer and mmap reader.

The file follows the safetensors layout: an 8-byte little-endian header length N, N bytes of JSON
header (``name → {dtype, shape, data_offsets}``, padded with spaces to a multiple of 8), then the
raw little-endian tensor bytes. The writer streams each tensor's bytes straight from its memory
into the file (no serialised copy of the whole batch), so a caller can hash while writing. Tensors
are laid out by element size, largest first, then by name, so every tensor starts on a multiple
of its element size and the memory-mapped views are aligned.

Reading uses ``safetensors.safe_open``: on a local file the tensors are views of a private
(copy-on-write) memory map, so opening costs O(header) and pages are read when touched; from
bytes (remote stores) ``safetensors.torch.load`` is used.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping
from typing import IO

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load as load_safetensors_bytes

from dataproto.schema import torch_dtype_name

#: torch dtype → safetensors dtype code
DTYPE_CODES: dict[torch.dtype, str] = {
    torch.bool: "BOOL",
    torch.uint8: "U8",
    torch.int8: "I8",
    torch.int16: "I16",
    torch.uint16: "U16",
    torch.int32: "I32",
    torch.uint32: "U32",
    torch.int64: "I64",
    torch.uint64: "U64",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.float32: "F32",
    torch.float64: "F64",
    torch.complex64: "C64",
    torch.float8_e4m3fn: "F8_E4M3",
    torch.float8_e5m2: "F8_E5M2",
}


def plain_tensor(name: str, value: object) -> torch.Tensor:
    """The CPU, contiguous, grad-free tensor to store for batch key ``name``.

    Raises:
        TypeError: for a non-tensor value, a nested/sparse tensor or an unsupported dtype.
    """
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"batch[{name!r}] holds a {type(value).__name__}, expected a torch.Tensor")
    if value.is_nested or value.layout != torch.strided:
        raise TypeError(
            f"batch[{name!r}]: {value.layout} / nested tensors cannot be stored; pad them to a "
            "dense tensor first"
        )
    if value.dtype not in DTYPE_CODES:
        supported = ", ".join(torch_dtype_name(d) for d in DTYPE_CODES)
        raise TypeError(
            f"batch[{name!r}]: dtype {value.dtype} is not storable; supported: {supported}"
        )
    return value.detach().to("cpu").resolve_conj().resolve_neg().contiguous()


def _layout_order(tensors: Mapping[str, torch.Tensor]) -> list[str]:
    """Names by element size (largest first), then name: keeps every view aligned."""
    return sorted(tensors, key=lambda n: (-tensors[n].element_size(), n))


def build_header(tensors: Mapping[str, torch.Tensor]) -> bytes:
    """The 8-byte length prefix plus the space-padded JSON header for ``tensors``.

    >>> h = build_header({"a": torch.zeros(2, dtype=torch.int64)})
    >>> len(h) % 8, h[8:].decode().strip()
    (0, '{"a":{"dtype":"I64","shape":[2],"data_offsets":[0,16]}}')
    """
    entries, offset = {}, 0
    for name in _layout_order(tensors):
        t = tensors[name]
        size = t.numel() * t.element_size()
        entries[name] = {
            "dtype": DTYPE_CODES[t.dtype],
            "shape": list(t.shape),
            "data_offsets": [offset, offset + size],
        }
        offset += size
    text = json.dumps(entries, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text


def write_tensor_file(tensors: Mapping[str, torch.Tensor], out: IO[bytes]) -> None:
    """Stream ``tensors`` (already :func:`plain_tensor`) as a safetensors file into ``out``."""
    out.write(build_header(tensors))
    for name in _layout_order(tensors):
        t = tensors[name]
        if t.numel():
            out.write(memoryview(t.reshape(-1).view(torch.uint8).numpy()))


def _check_against_schema(
    file: str,
    found: Mapping[str, tuple[str, tuple[int, ...]]],
    expected: Mapping[str, tuple[str, tuple[int, ...]]],
) -> None:
    if set(found) != set(expected):
        raise ValueError(
            f"{file}: tensors {sorted(found)} do not match the manifest's batch keys "
            f"{sorted(expected)}"
        )
    for name, (dtype, shape) in expected.items():
        if found[name] != (dtype, shape):
            raise ValueError(
                f"{file}: tensor {name!r} is {found[name][0]} {found[name][1]}, the manifest says "
                f"{dtype} {shape}"
            )


def open_tensor_file(
    path: str, file: str, expected: Mapping[str, tuple[str, tuple[int, ...]]]
) -> dict[str, torch.Tensor]:
    """Memory-map a local safetensors file and check its header against ``expected``.

    Args:
        path: the local file.
        file: its name for error messages.
        expected: name → (dtype name as in the schema, shape) from the manifest.

    Raises:
        ValueError: naming ``file`` when the header is unreadable or disagrees with ``expected``.
    """
    try:
        with safe_open(path, framework="pt", device="cpu") as handle:
            found = {}
            for name in handle.keys():  # noqa: SIM118 (safe_open handles are not mappings)
                piece = handle.get_slice(name)
                dtype = torch_dtype_name(_code_to_dtype(piece.get_dtype()))
                found[name] = (dtype, tuple(piece.get_shape()))
            _check_against_schema(file, found, expected)
            return {name: handle.get_tensor(name) for name in expected}
    except (SafetensorError, OSError, KeyError) as err:
        raise ValueError(f"{file}: unreadable safetensors file ({err})") from None


def load_tensor_bytes(
    data: bytes, file: str, expected: Mapping[str, tuple[str, tuple[int, ...]]]
) -> dict[str, torch.Tensor]:
    """Like :func:`open_tensor_file` for an in-memory file (remote stores); tensors are copies."""
    try:
        tensors = load_safetensors_bytes(data)
    except (SafetensorError, OSError) as err:
        raise ValueError(f"{file}: unreadable safetensors file ({err})") from None
    found = {n: (torch_dtype_name(t.dtype), tuple(t.shape)) for n, t in tensors.items()}
    _check_against_schema(file, found, expected)
    return tensors


_CODE_TO_DTYPE = {code: dtype for dtype, code in DTYPE_CODES.items()}


def _code_to_dtype(code: str) -> torch.dtype:
    """safe_open reports dtypes as codes ("F32") or torch names, depending on the version."""
    if code in _CODE_TO_DTYPE:
        return _CODE_TO_DTYPE[code]
    name = code.removeprefix("torch.")
    if isinstance(getattr(torch, name, None), torch.dtype):
        return getattr(torch, name)
    raise KeyError(f"unknown tensor dtype {code!r}")
