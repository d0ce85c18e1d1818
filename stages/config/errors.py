"""One readable error for a bad config: every problem, each naming its dotted key.

pydantic's raw ``ValidationError`` text is replaced by lines such as::

    actor_rollout_ref.actor.optim.lr: got -1.0; must be > 0
    trainer.totl_epochs: unknown key; did you mean 'total_epochs'?
    data.truncation: got 'both'; allowed: 'error', 'left', 'right' or 'middle'

The walk of the schema's key tree and the did-you-mean (``nested_model``, ``model_at``,
``sibling_keys``, ``suggest``) live in :mod:`stages.config.model_tree`, shared with the reading of
verl's keys, and are importable from here as before.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, ValidationError

from stages.config.model_tree import model_at, nested_model, sibling_keys, suggest
from stages.config.verl_keys import verl_children

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
    """('a', 'b', 0, 'c') -> 'a.b[0].c'.

    >>> dotted(("a", "b", 0, "c")), dotted(())
    ('a.b[0].c', '<root>')
    """
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "<root>"


def _describe(item: dict[str, Any], root: type[BaseModel]) -> str:
    """One error dict of pydantic as 'path: what was wrong; what is allowed'."""
    kind, loc, value = item["type"], item["loc"], item.get("input")
    if loc and loc[-1] == "[key]":  # a mapping's key failed: the key is the path's last part
        loc = loc[:-1]
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
    parent = dotted(loc[:-1]) if loc[:-1] else ""
    verl = {k[len(parent) + 1 :].split(".")[0] for k in verl_children(parent)} if parent else set()
    own = sibling_keys(root, loc[:-1])
    hint = suggest(str(loc[-1]), [*own, *sorted(verl - set(own))])
    return hint if hint.startswith("; did you mean") else suggest(str(loc[-1]), own)


__all__ = [
    "BOUNDS",
    "EXPECTED",
    "ConfigError",
    "dotted",
    "format_validation_error",
    "model_at",
    "nested_model",
    "sibling_keys",
    "suggest",
]


class ConfigWarning(UserWarning):
    """A legal config setting that is probably a mistake (e.g. GRPO with rollout.n = 1)."""


class ConfigNotice(UserWarning):
    """How a verl setting was read: a verl key mapped to ppoflow's, or one with no effect."""
