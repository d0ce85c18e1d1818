"""One readable error for a bad config: every problem, each naming its dotted key.

pydantic's raw ``ValidationError`` text is replaced by lines such as::

    actor_rollout_ref.actor.optim.lr: got -1.0; must be > 0
    trainer.totl_epochs: unknown key; did you mean 'total_epochs'?
    data.truncation: got 'both'; allowed: 'error', 'left', 'right' or 'middle'
"""

from __future__ import annotations

import difflib
import types
import typing
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, ValidationError

# pydantic error type -> what the field expects, in words.
EXPECTED = {
    "int_type": "an integer",
    "int_parsing": "an integer",
    "int_from_float": "an integer (no fractional part)",
    "float_type": "a number",
    "float_parsing": "a number",
    "bool_type": "a boolean (true or false)",
    "bool_parsing": "a boolean (true or false)",
    "string_type": "a string",
    "list_type": "a list",
    "tuple_type": "a list",
    "dict_type": "a mapping of keys",
    "model_type": "a mapping of keys",
    "model_attributes_type": "a mapping of keys",
}
BOUNDS = {"greater_than": ">", "greater_than_equal": "≥", "less_than": "<", "less_than_equal": "≤"}


class ConfigError(ValueError):
    """An invalid run config; ``problems`` holds one line per problem, each led by its key path."""

    def __init__(self, problems: Sequence[str], source: str = "config") -> None:
        self.problems = list(problems)
        self.source = source
        count = f"{len(self.problems)} problem" + ("s" if len(self.problems) != 1 else "")
        lines = "\n".join(f"  - {p}" for p in self.problems)
        super().__init__(f"invalid config ({source}): {count}\n{lines}")


def format_validation_error(error: ValidationError, root: type[BaseModel]) -> list[str]:
    """One line per problem in ``error``, raised while validating ``root``."""
    problems: list[str] = []
    for item in error.errors(include_url=False):
        if item["type"] == "cross_field":
            problems.extend(item["ctx"]["problems"].splitlines())
        else:
            problems.append(_describe(item, root))
    return problems


def dotted(loc: Sequence[str | int]) -> str:
    """('a', 'b', 0, 'c') -> 'a.b[0].c'."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "<root>"


def _describe(item: dict[str, Any], root: type[BaseModel]) -> str:
    """One error dict of pydantic as 'path: what was wrong; what is allowed'."""
    kind, loc, value = item["type"], item["loc"], item.get("input")
    path, ctx = dotted(loc), item.get("ctx") or {}
    if kind == "extra_forbidden":
        return f"{path}: unknown key{_unknown_key_hint(root, loc)}"
    if kind == "missing" and loc and isinstance(loc[-1], int):
        return f"{dotted(loc[:-1])}: too few items (item {loc[-1]} is missing)"
    if kind == "missing":
        return f"{path}: required key is missing"
    if kind == "literal_error":
        return f"{path}: got {value!r}; allowed: {ctx.get('expected')}"
    if kind in BOUNDS:
        bound = next(v for k, v in ctx.items() if k in ("gt", "ge", "lt", "le"))
        return f"{path}: got {value!r}; must be {BOUNDS[kind]} {bound}"
    if kind in ("too_short", "too_long"):
        return f"{path}: got {value!r}; {item['msg'].lower()}"
    if kind in EXPECTED:
        return f"{path}: got {value!r} ({type(value).__name__}); expected {EXPECTED[kind]}"
    message = item["msg"].removeprefix("Value error, ")
    return message if not loc else f"{path}: {message}"


def _unknown_key_hint(root: type[BaseModel], loc: Sequence[str | int]) -> str:
    """Did-you-mean among the section's ppoflow keys and verl's keys there (a verl name is then
    read as its ppoflow key, e.g. ``grad_clip`` → ``optim.clip_grad``)."""
    from stages.config.verl_keys import verl_children

    parent = dotted(loc[:-1]) if loc[:-1] else ""
    verl = {k[len(parent) + 1 :].split(".")[0] for k in verl_children(parent)} if parent else set()
    own = sibling_keys(root, loc[:-1])
    hint = suggest(str(loc[-1]), [*own, *sorted(verl - set(own))])
    return hint if hint.startswith("; did you mean") else suggest(str(loc[-1]), own)


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
