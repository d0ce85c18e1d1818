"""What crosses the reward boundary, and how: plain data as JSON, in length-prefixed frames.

Nothing a scorer worker sends is unpickled or executed by the driver. Both directions carry
*plain data* in the artifact's own encoding (``dataproto.nontensor_codec``, which this module
mirrors without importing numpy, so a worker holds only the standard library unless its scorer
imported numpy):

======================================  =============================================
value                                   JSON
======================================  =============================================
None, bool, int, str, finite float      itself
float NaN / +inf / −inf                 ``{"$float": "nan" | "inf" | "-inf"}``
list; dict with str keys                JSON array; JSON object
tuple                                   ``{"$tuple": [...]}``
dict with other keys (int, tuple, …)    ``{"$dict": [[key, value], ...]}``
numpy bool/int/uint/float16-64/str_     ``{"$np": [dtype, value]}``
numpy array (numeric, bool, object)     ``{"$ndarray": [dtype, shape, flat values]}``
======================================  =============================================

Anything else (a set, bytes, an arbitrary object, a subclass of a listed type) is refused by
:func:`to_plain` with :class:`NotPlain`, which names the path inside the value and the type.
:func:`from_plain` is the strict inverse for data that may come from an untrusted worker: a
malformed tag, an unknown numpy dtype or a shape that does not match its values is a
``ValueError``, and it builds only the types of the table (numpy is imported for a numpy tag).

Frames: a 4-byte big-endian length, then that many bytes of JSON. A frame from a worker longer
than :data:`MAX_FRAME_BYTES` is refused by the driver before it is read; a worker keeps each
result within :data:`MAX_RESULT_BYTES` (a larger one is that sample's ``invalid`` outcome).
"""

from __future__ import annotations

import json
import math
import socket
import struct
import sys
from typing import Any

#: one sample's encoded result (score, extras, message) may take at most this many bytes
MAX_RESULT_BYTES = 4 << 20
#: a frame from a worker: one or more results (together at most MAX_RESULT_BYTES) + its envelope
MAX_FRAME_BYTES = MAX_RESULT_BYTES + (64 << 10)
#: a failure message is cut to this many characters
MAX_MESSAGE_CHARS = 4000
SUPPORTED = (
    "None, bool, int, float, str, list, tuple, dict, numpy scalars and numpy arrays of those"
)

_HEADER = struct.Struct(">I")
TAGS = frozenset({"$float", "$tuple", "$dict", "$np", "$ndarray"})
NP_SCALAR_DTYPES = frozenset(
    {"bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"}
    | {"float16", "float32", "float64", "str"}
)
_NP_ARRAY_DTYPES = (NP_SCALAR_DTYPES - {"str"}) | {"object"}
_NONFINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}
_SCALARS = frozenset({str, int, bool, type(None)})  # plain as they are
isfinite = math.isfinite


class NotPlain(Exception):
    """A value outside the table; ``path`` (``['a'][0]``) locates it inside the encoded value."""

    def __init__(self, value: Any, reason: str = "") -> None:
        super().__init__(reason)
        self.type_name = f"{type(value).__module__}.{type(value).__qualname__}"
        self.reason = reason
        self.path: list[str] = []

    def where(self) -> str:
        return "".join(self.path)


# --- encoding (worker: results; driver: samples) --------------------------------------------


def to_plain(value: Any) -> Any:
    """JSON-ready data for ``value`` (module table); equal to ``nontensor_codec.encode_value``.

    >>> to_plain({"a": (1, 2.0, float("nan")), 3: None})
    {'$dict': [['a', {'$tuple': [1, 2.0, {'$float': 'nan'}]}], [3, None]]}
    >>> to_plain({1, 2})
    Traceback (most recent call last):
    ...
    stages.reward.wire.NotPlain
    """
    kind = type(value)
    if kind in _SCALARS:
        return value
    if kind is float:
        return value if isfinite(value) else {"$float": _nonfinite_name(value)}
    if kind is list:
        return _items(value)
    if kind is tuple:
        return {"$tuple": _items(value)}
    if kind is dict:
        return _dict(value)
    np = sys.modules.get("numpy")  # a numpy value exists only where numpy was imported
    if np is not None:
        if isinstance(value, np.generic):
            return _np_scalar(value, np)
        if kind is np.ndarray:
            return _ndarray(value)
    raise NotPlain(value)


def _nonfinite_name(value: float) -> str:
    return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")


def _items(items: list | tuple) -> list:
    out = []
    for i, item in enumerate(items):
        kind = type(item)
        if kind in _SCALARS or (kind is float and isfinite(item)):  # the common case, inline
            out.append(item)
            continue
        try:
            out.append(to_plain(item))
        except NotPlain as err:
            err.path.insert(0, f"[{i}]")
            raise
    return out


def _dict(value: dict) -> dict:
    out = {}
    for key, item in value.items():
        if type(key) is not str:
            return _pairs(value)
        kind = type(item)
        if kind in _SCALARS or (kind is float and isfinite(item)):  # the common case, inline
            out[key] = item
            continue
        try:
            out[key] = to_plain(item)
        except NotPlain as err:
            err.path.insert(0, f"[{key!r}]")
            raise
    if len(out) == 1 and next(iter(out)) in TAGS:  # a plain dict that would read as a tag
        return _pairs(value)
    return out


def _pairs(value: dict) -> dict:
    pairs = []
    for key, item in value.items():
        try:
            pairs.append([to_plain(key), to_plain(item)])
        except NotPlain as err:
            err.path.insert(0, f"[{key!r}]")
            raise
    return {"$dict": pairs}


def _np_scalar(value: Any, np: Any) -> dict:
    name = "str" if isinstance(value, np.str_) else value.dtype.name
    if name not in NP_SCALAR_DTYPES:
        raise NotPlain(value, f"numpy dtype {value.dtype} is not storable")
    return {"$np": [name, to_plain(str(value) if name == "str" else value.item())]}


def _ndarray(value: Any) -> dict:
    if value.dtype.name not in _NP_ARRAY_DTYPES:
        raise NotPlain(value, f"numpy array dtype {value.dtype} is not storable")
    flat = value.ravel().tolist() if value.dtype.name != "object" else list(value.ravel())
    return {"$ndarray": [value.dtype.name, list(value.shape), _items(flat)]}


# --- decoding (driver: results, untrusted; worker: samples) ---------------------------------


def from_plain(data: Any) -> Any:
    """The value :func:`to_plain` encoded; ``ValueError`` for anything it cannot have produced.

    >>> from_plain(to_plain({"a": (1, 2.0), 3: [None]}))
    {'a': (1, 2.0), 3: [None]}
    >>> from_plain({"$np": ["V999999999", 0]})
    Traceback (most recent call last):
    ...
    ValueError: $np: dtype 'V999999999' is not one of the plain numpy dtypes
    """
    kind = type(data)
    if kind in _SCALARS:
        return data
    if kind is float:
        if not isfinite(data):
            raise ValueError("a non-finite float outside a $float tag")
        return data
    if kind is list:
        return [item if type(item) in _SCALARS else from_plain(item) for item in data]
    if kind is not dict:
        raise ValueError(f"a {kind.__name__} is not JSON data")
    if len(data) == 1:
        ((tag, body),) = data.items()
        if tag in TAGS:
            return _tag(tag, body)
    return {key: item if type(item) in _SCALARS else from_plain(item) for key, item in data.items()}


def _tag(tag: str, body: Any) -> Any:
    if tag == "$float":
        if type(body) is not str or body not in _NONFINITE:
            raise ValueError(f"$float: {body!r} is not nan, inf or -inf")
        return _NONFINITE[body]
    if type(body) is not list:
        raise ValueError(f"{tag}: the body is a {type(body).__name__}, not a list")
    if tag == "$tuple":
        return tuple(from_plain(item) for item in body)
    if tag == "$dict":
        out = {}
        for pair in body:
            if type(pair) is not list or len(pair) != 2:
                raise ValueError("$dict: an entry is not a [key, value] pair")
            key = from_plain(pair[0])
            try:
                out[key] = from_plain(pair[1])
            except TypeError:
                raise ValueError(f"$dict: a {type(key).__name__} key is not hashable") from None
        return out
    if tag == "$np":
        return _np_value(body)
    return _ndarray_value(body)


def _np_value(body: list) -> Any:
    if len(body) != 2:
        raise ValueError("$np: expected [dtype, value]")
    name, raw = body
    if type(name) is not str or name not in NP_SCALAR_DTYPES:
        raise ValueError(f"$np: dtype {name!r} is not one of the plain numpy dtypes")
    value = from_plain(raw)
    import numpy as np

    if name == "str":
        if type(value) is not str:
            raise ValueError("$np: a str_ scalar whose value is not a str")
        return np.str_(value)
    if type(value) not in (bool, int, float):
        raise ValueError(f"$np: a {name} scalar whose value is a {type(value).__name__}")
    try:
        return np.dtype(name).type(value)
    except (OverflowError, ValueError, TypeError) as exc:
        raise ValueError(f"$np: {value!r} is not a {name}: {exc}") from None


def _ndarray_value(body: list) -> Any:
    if len(body) != 3:
        raise ValueError("$ndarray: expected [dtype, shape, values]")
    name, shape, items = body
    if type(name) is not str or name not in _NP_ARRAY_DTYPES:
        raise ValueError(f"$ndarray: dtype {name!r} is not one of the plain numpy dtypes")
    if type(shape) is not list or any(type(n) is not int or n < 0 for n in shape):
        raise ValueError(f"$ndarray: shape {shape!r} is not a list of sizes")
    if type(items) is not list or math.prod(shape) != len(items):
        raise ValueError(f"$ndarray: shape {shape} does not hold the values given")
    values = [from_plain(item) for item in items]
    import numpy as np

    out = np.empty(len(values), dtype=np.dtype(name))
    try:
        for i, item in enumerate(values):
            out[i] = item
    except (OverflowError, ValueError, TypeError) as exc:
        raise ValueError(f"$ndarray: a value does not fit dtype {name}: {exc}") from None
    return out.reshape(tuple(shape))


# --- JSON and frames ------------------------------------------------------------------------


def _no_constant(name: str) -> Any:
    raise ValueError(f"JSON constant {name} is not plain data (non-finite floats are tagged)")


_ENCODER = json.JSONEncoder(ensure_ascii=True, allow_nan=False, separators=(",", ":"))
_DECODER = json.JSONDecoder(parse_constant=_no_constant)
# the C encoder behind _ENCODER, made once (JSONEncoder.encode makes one per call, which costs
# more than encoding a small result); no circular check: to_plain has walked the value already
_C_ENCODER = (
    None
    if json.encoder.c_make_encoder is None
    else json.encoder.c_make_encoder(
        None, None, json.encoder.encode_basestring_ascii, None, ":", ",", False, False, False
    )
)


def dumps(data: Any) -> bytes:
    """Compact ASCII JSON of plain data (every str round-trips, lone surrogates included).

    >>> dumps([1, (2.5, "x"), {"a": None}])
    b'[1,[2.5,"x"],{"a":null}]'
    """
    if _C_ENCODER is None:
        return _ENCODER.encode(data).encode()
    return "".join(_C_ENCODER(data, 0)).encode()


def loads(payload: bytes) -> Any:
    """JSON text to data; the non-standard ``NaN`` / ``Infinity`` literals are refused."""
    return _DECODER.decode(payload.decode("utf-8"))


def frame(payload: bytes) -> bytes:
    """``payload`` with its length header."""
    return _HEADER.pack(len(payload)) + payload


def send_frame(sock: socket.socket, payload: bytes) -> None:
    sock.sendall(frame(payload))


def recv_frame(sock: socket.socket) -> bytes | None:
    """The next frame's payload (blocking), or None at end of file (the worker's side)."""
    header = _recv_exactly(sock, _HEADER.size)
    if header is None:
        return None
    (size,) = _HEADER.unpack(header)
    payload = _recv_exactly(sock, size)
    if payload is None:
        return None
    return payload


def _recv_exactly(sock: socket.socket, size: int) -> bytes | None:
    chunks, left = [], size
    while left:
        chunk = sock.recv(min(left, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


class FrameTooLarge(Exception):
    """A frame header announced more than the reader accepts; nothing of it was read."""


class FrameReader:
    """Cuts a byte stream into frames without blocking (the driver's side of a worker socket).

    ``feed`` takes whatever ``recv`` returned and gives back every complete payload; a header
    over ``max_bytes`` raises :class:`FrameTooLarge` before its payload is buffered.
    """

    def __init__(self, max_bytes: int = MAX_FRAME_BYTES) -> None:
        self.max_bytes = max_bytes
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list[bytes]:
        self._buffer += data
        payloads = []
        while len(self._buffer) >= _HEADER.size:
            (size,) = _HEADER.unpack_from(self._buffer)
            if size > self.max_bytes:
                raise FrameTooLarge(
                    f"the worker sent a message of {size} bytes, over the {self.max_bytes}-byte bound"
                )
            end = _HEADER.size + size
            if len(self._buffer) < end:
                break
            payloads.append(bytes(self._buffer[_HEADER.size : end]))
            del self._buffer[:end]
        return payloads
