"""The schema's key tree: which model sits at a key path, its keys, the closest to a mistyped one.

Shared by the error messages (:mod:`stages.config.errors`) and the reading of verl's keys
(:mod:`stages.config.verl_keys`), which import it and not each other's internals.

Example:
    >>> nested_model(int | None) is None, suggest("totl_epochs", ["total_epochs", "test_freq"])
    (True, "; did you mean 'total_epochs'?")
"""

from __future__ import annotations

import difflib
import types
import typing
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel


def suggest(key: str, known: Sequence[str]) -> str:
    """'; did you mean …?' for the closest known keys, else the list of known keys.

    >>> suggest("totl_epochs", ["total_epochs", "test_freq"])
    "; did you mean 'total_epochs'?"
    """
    if not known:
        return ""
    close = difflib.get_close_matches(key, known, n=3, cutoff=0.6)
    if close:
        return "; did you mean " + " or ".join(repr(c) for c in close) + "?"
    return "; known keys here: " + ", ".join(sorted(known))


def sibling_keys(root: type[BaseModel], parent_loc: Sequence[str | int]) -> list[str]:
    """Field names of the model found at ``parent_loc`` under ``root`` (empty if none)."""
    model = model_at(root, parent_loc)
    return list(model.model_fields) if model is not None else []


def model_at(root: type[BaseModel], loc: Sequence[str | int]) -> type[BaseModel] | None:
    """The config model class at a key path, or None when the path leaves the model tree."""
    model: type[BaseModel] | None = root
    for part in loc:
        if model is None or isinstance(part, int) or part not in model.model_fields:
            return None
        model = nested_model(model.model_fields[part].annotation)
    return model


def nested_model(annotation: Any) -> type[BaseModel] | None:
    """The BaseModel class inside ``annotation`` (``X``, ``X | None``), or None."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        for arg in typing.get_args(annotation):
            found = nested_model(arg)
            if found is not None:
                return found
    return None
