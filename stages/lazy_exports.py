"""A package's names loaded from their modules on first use (PEP 562).

A package whose ``__init__`` imported all its modules would make every process that imports one
light module of it (a scorer worker, the MLflow process) import the heavy ones too (torch,
transformers). :func:`lazy_exports` returns the package's module-level ``__getattr__`` and
``__dir__``: ``from package import name`` and ``package.name`` import ``name``'s module then.

Example:
    >>> getattr_, dir_ = lazy_exports("pkg", {"sqrt": "math", "dumps": "json"})
    >>> getattr_("sqrt")(16.0), "dumps" in dir_()
    (4.0, True)
    >>> getattr_("nope")
    Traceback (most recent call last):
    ...
    AttributeError: module 'pkg' has no attribute 'nope'
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(
    package: str, exports: Mapping[str, str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for ``package``, whose name ``n`` lives in module
    ``exports[n]`` (a full module name)."""

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(module), name)

    def __dir__() -> list[str]:
        return sorted(exports)

    return __getattr__, __dir__
