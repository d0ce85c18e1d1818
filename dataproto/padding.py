"""Padding a DataProto to a multiple of a divisor, and the auto-padding switch.

Dispatching a batch to D data-parallel ranks needs ``len(data) % D == 0``. The usual pattern::

    padded, pad_size = pad_dataproto_to_divisor(data, D)
    outputs = [work(chunk) for chunk in padded.chunk(D)]
    result = unpad_dataproto(DataProto.concat(outputs), pad_size)

Auto-padding (verl's switch) lets ``chunk`` accept an uneven length instead of raising. It is on
when any of these holds:

- the object's ``meta_info["_verl_auto_padding"]`` is true (``from_dict(..., auto_padding=True)``);
- ``DataProtoConfig.auto_padding = True`` was set (process-wide);
- the environment variable ``VERL_AUTO_PADDING`` is ``1`` or ``true`` (any case), read at each check.
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING, TypeVar

import numpy as np

from dataproto.errors import DataProtoTypeError, DataProtoValueError

if TYPE_CHECKING:
    from dataproto.protocol import DataProto

__all__ = [
    "AUTO_PADDING_ENV",
    "AUTO_PADDING_KEY",
    "DataProtoConfig",
    "pad_dataproto_to_divisor",
    "unpad_dataproto",
]

logger = logging.getLogger(__name__)

AUTO_PADDING_KEY = "_verl_auto_padding"  # meta_info flag that turns auto-padding on per object
AUTO_PADDING_ENV = "VERL_AUTO_PADDING"  # "1"/"true" turns it on process-wide

D = TypeVar("D", bound="DataProto")


class _DataProtoConfigMeta(type):
    """Makes ``DataProtoConfig.auto_padding`` a validated class-level property (verl's API)."""

    _auto_padding: bool = False
    auto_padding_key = AUTO_PADDING_KEY

    @property
    def auto_padding(cls) -> bool:
        from_env = os.getenv(AUTO_PADDING_ENV, "false").strip().upper() in ("TRUE", "1")
        return from_env or _DataProtoConfigMeta._auto_padding

    @auto_padding.setter
    def auto_padding(cls, enabled: bool) -> None:
        if not isinstance(enabled, bool):
            raise DataProtoTypeError(
                f"DataProtoConfig.auto_padding must be a bool, got {enabled!r} "
                f"({type(enabled).__name__})"
            )
        _DataProtoConfigMeta._auto_padding = enabled


class DataProtoConfig(metaclass=_DataProtoConfigMeta):
    """Process-wide DataProto settings (verl compatible).

    >>> DataProtoConfig.auto_padding = True
    >>> DataProtoConfig.auto_padding
    True
    >>> DataProtoConfig.auto_padding = False
    """


def _check_count(name: str, value: object, *, allow_zero: bool) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise DataProtoTypeError(f"{name} must be an int, got {value!r} ({type(value).__name__})")
    if value < 0 or (value == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise DataProtoValueError(f"{name} must be {bound}, got {value}")
    return int(value)


def pad_dataproto_to_divisor(data: D, size_divisor: int) -> tuple[D, int]:
    """Append rows, cycling from row 0, until ``len(data) % size_divisor == 0``.

    Returns ``(padded, pad_size)``. When nothing is needed (including an empty DataProto, which
    logs a warning) the same object comes back with ``pad_size = 0``. The padded rows are copies
    of real rows, so a metric over them must drop the last ``pad_size`` rows (``unpad_dataproto``).

    >>> import torch
    >>> from dataproto import DataProto
    >>> data = DataProto.from_dict({"x": torch.arange(3)})
    >>> padded, pad_size = pad_dataproto_to_divisor(data, 8)
    >>> padded.batch["x"].tolist(), pad_size
    ([0, 1, 2, 0, 1, 2, 0, 1], 5)
    """
    size_divisor = _check_count(
        "pad_dataproto_to_divisor: size_divisor", size_divisor, allow_zero=False
    )
    length = len(data)
    if length == 0:
        logger.warning("pad_dataproto_to_divisor: the DataProto has no rows; nothing padded")
        return data, 0
    if length % size_divisor == 0:
        return data, 0
    pad_size = size_divisor - length % size_divisor
    rows = np.arange(length + pad_size) % length  # 0..L-1, then 0, 1, ... cycling
    return data.select_idxs(rows), pad_size


def unpad_dataproto(data: D, pad_size: int) -> D:
    """Drop the last ``pad_size`` rows (``data[:-pad_size]``); ``pad_size = 0`` returns ``data``.

    >>> import torch
    >>> from dataproto import DataProto
    >>> unpad_dataproto(DataProto.from_dict({"x": torch.arange(8)}), 5).batch["x"].tolist()
    [0, 1, 2]
    """
    pad_size = _check_count("unpad_dataproto: pad_size", pad_size, allow_zero=True)
    if pad_size > len(data):
        raise DataProtoValueError(
            f"unpad_dataproto: pad_size {pad_size} exceeds the DataProto's {len(data)} rows"
        )
    return data[:-pad_size] if pad_size else data
