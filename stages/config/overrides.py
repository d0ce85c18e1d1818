"""Command-line overrides in Hydra's grammar, parsed by Hydra's own parser (as verl reads them).

* ``key=value`` sets a key; ``+key=value`` and ``++key=value`` set it too: ppoflow's schema
  declares every key, so "add" and "force-add" mean "set" (Hydra refuses ``+`` on a key that the
  config already has; ppoflow's base config writes every key, so that refusal would reject
  every verl script that uses ``+``).
* ``~key`` deletes a key from the merged config, so its default applies; ``~key=value`` deletes it
  only if it holds that value (Hydra's rule).
* Values read as Hydra reads them: ``1e-6`` and ``-2.5E+3`` are floats, ``true``/``False`` bools,
  ``null`` None, ``[a,b]`` lists, ``{a: 1}`` mappings (merged into the section), ``'quoted text'``
  strings, and ``${…}`` interpolations are kept for :mod:`stages.config.interpolation`.
* Hydra features that belong to its launcher are refused with one line each: sweeps (``a=1,2``)
  and config groups (``group/option``, ``key@package``).

Every problem is collected (one line per bad override) so the caller reports them with the rest.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

GRAMMAR_DOC = "https://hydra.cc/docs/advanced/override_grammar/basic/"


@dataclass(frozen=True)
class Override:
    """One parsed override: set ``key`` to ``value``, or delete it (``delete``)."""

    text: str
    key: str
    value: Any
    delete: bool = False
    #: ``~key=value``: delete only if the key holds ``value``
    delete_if_value: bool = False


@functools.cache
def _parser() -> Any:
    """Hydra's override parser (built once: importing it is slow)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    return OverridesParser.create()


def parse_overrides(texts: Sequence[str]) -> tuple[list[Override], list[str]]:
    """Parse every override; returns the good ones and one problem line per bad one.

    >>> good, bad = parse_overrides(["a.b=1e-6", "+c=[x, 1]", "~d", "e=1,2"])
    >>> [(o.key, o.value, o.delete) for o in good]
    [('a.b', 1e-06, False), ('c', ['x', 1], False), ('d', None, True)]
    >>> bad[0].split(":")[0]
    "override 'e=1,2'"
    """
    good: list[Override] = []
    problems: list[str] = []
    for text in texts:
        try:
            good.append(parse_one(text))
        except ValueError as err:
            problems.append(str(err))
    return good, problems


def parse_one(text: str) -> Override:
    """One ``key=value`` / ``+key=value`` / ``++key=value`` / ``~key[=value]`` string.

    Raises ``ValueError`` with a one-line message naming the override and the fix.
    """
    from hydra.errors import HydraException

    if not isinstance(text, str):
        raise ValueError(f"override {text!r}: expected a 'key=value' string")
    try:
        parsed = _parser().parse_override(text.strip())
    except HydraException as err:
        raise ValueError(_grammar_problem(text, err)) from None
    key = parsed.key_or_group
    if not key:
        raise ValueError(
            f"override {text!r}: no key before '='; expected key.path=value "
            "(e.g. trainer.total_epochs=2)"
        )
    if parsed.package is not None or "/" in key:
        raise ValueError(
            f"override {text!r}: config groups (group/option, key@package) are Hydra composition, "
            "which ppoflow does not do; set keys directly (key.path=value)"
        )
    if parsed.is_sweep_override():
        raise ValueError(
            f"override {text!r}: a comma-separated value is a Hydra sweep (multirun), and ppoflow "
            f"trains one config; for a list write {key}=[a,b], for text with a comma quote it: "
            f"{key}='a,b'"
        )
    if parsed.is_delete():
        has_value = "=" in text
        return Override(text, key, parsed.value() if has_value else None, True, has_value)
    return Override(text, key, _plain(parsed.value()))


def _plain(value: Any) -> Any:
    """Hydra's parsed value as plain Python containers (lists and dicts all the way down)."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def _grammar_problem(text: str, err: Exception) -> str:
    """Hydra's parse error as one line, with the common fixes."""
    detail = next((line.strip() for line in str(err).splitlines() if line.strip()), "")
    if "=" not in text:
        return f"override {text!r}: expected key.path=value (e.g. trainer.total_epochs=2)"
    key, _, raw = text.partition("=")
    return (
        f"override {text!r}: not valid in Hydra's override grammar ({detail}); quote a value "
        f"that has special characters (~, =, quotes, brackets), e.g. {key}='{raw}' "
        f"(grammar: {GRAMMAR_DOC})"
    )


__all__ = ["Override", "parse_one", "parse_overrides"]
