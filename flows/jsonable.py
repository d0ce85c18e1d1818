"""Plain values as canonical JSON data, for cache keys, run records and metric sinks.

A module of its own with no ppoflow imports, so a process that only logs (flows/sinks/mlflow_process.py)
can import it without torch.
"""

from __future__ import annotations

import enum
import math
import os
from collections.abc import Mapping
from typing import Any

import numpy as np


def jsonable(value: Any, where: str = "value") -> Any:
    """``value`` as canonical JSON data: pydantic models dumped, tuples as lists, paths as str.

    Non-finite floats become tagged objects (``{"float": "nan"}``) because JSON has no NaN.

    >>> jsonable((1, float("inf"), {"b": None}))
    [1, {'float': 'inf'}, {'b': None}]
    """
    if hasattr(value, "model_dump") and callable(value.model_dump):
        return jsonable(value.model_dump(mode="json"), where)
    if isinstance(value, enum.Enum):
        return jsonable(value.value, where)
    if isinstance(value, np.generic):
        return jsonable(value.item(), where)
    if isinstance(value, float):
        return value if math.isfinite(value) else {"float": repr(value)}
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if isinstance(value, Mapping):
        return {str(key): jsonable(item, f"{where}.{key}") for key, item in value.items()}
    if isinstance(value, list | tuple | frozenset | set):
        items = sorted(value, key=repr) if isinstance(value, set | frozenset) else value
        return [jsonable(item, f"{where}[{i}]") for i, item in enumerate(items)]
    raise TypeError(
        f"{where} is a {type(value).__name__}, which has no canonical JSON form; cache keys need "
        "plain config values (numbers, strings, lists, mappings, pydantic models)"
    )
