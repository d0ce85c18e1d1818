"""``${…}`` interpolations resolved by OmegaConf over the fully merged config (verl's semantics).

verl composes its config with Hydra and reads it through OmegaConf, so its YAML files and scripts
use ``${data.max_prompt_length}``, ``${oc.select:key,default}``, ``${oc.env:VAR,default}`` and
relative forms such as ``${.ppo_mini_batch_size}``. ppoflow hands the merged tree (every file
layer, dict params and command-line override applied) to OmegaConf and keeps the resolved
values, so an interpolation sees the final value of the key it names, as in verl.

A tree without any ``${`` is returned unchanged without touching OmegaConf. A key whose
interpolation cannot be resolved (a missing key without default, an unset environment variable,
an unknown resolver) is one problem line naming the key; that key is removed, so the other keys
still validate and every problem is reported in one round.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

#: OmegaConf's marker of a mandatory value nobody set
MISSING = "???"


def resolve_interpolations(
    tree: Mapping[str, Any], background: Mapping[str, Any] | None = None
) -> tuple[dict[str, Any], list[str], set[str]]:
    """(resolved tree, problems, keys removed because they failed).

    ``background``: values an interpolation may name that ``tree`` does not set (ppoflow passes
    its schema defaults, since verl's config lists every key with its default); only ``tree``'s
    own keys are returned.

    >>> resolve_interpolations({"a": {"b": 3}, "c": "${a.b}", "d": "${oc.select:x.y,7}"})[0]
    {'a': {'b': 3}, 'c': 3, 'd': 7}
    >>> resolve_interpolations({"c": "${nope}"})[1]
    ["c: cannot resolve '${nope}': Interpolation key 'nope' not found"]
    """
    tree = dict(tree)
    raw = {path: value for path, value in iter_leaves(tree) if _is_interpolated(value)}
    if not raw:
        return tree, [], set()
    from omegaconf import OmegaConf

    try:
        conf = OmegaConf.create(_over(background, tree))
    except Exception as err:  # a value OmegaConf cannot hold (never from YAML or JSON)
        return tree, [f"<root>: cannot resolve interpolations: {_first_line(err)}"], set()
    problems, failed = [], set()
    for path, value in raw.items():
        try:
            OmegaConf.select(conf, path, throw_on_resolution_failure=True)
        except Exception as err:
            problems.append(f"{path}: cannot resolve {value!r}: {_first_line(err)}")
            failed.add(path)
    for path in failed:
        _remove(conf, path)
    resolved = OmegaConf.to_container(conf, resolve=True, throw_on_missing=False)
    return _only(resolved, tree), problems, failed


def _over(background: Mapping[str, Any] | None, tree: Mapping[str, Any]) -> dict[str, Any]:
    """``tree`` deep-merged over ``background``."""
    merged = dict(background or {})
    for key, value in tree.items():
        below = merged.get(key)
        both = isinstance(value, Mapping) and isinstance(below, Mapping)
        merged[key] = _over(below, value) if both else value
    return merged


def _only(resolved: Mapping[str, Any], shape: Mapping[str, Any]) -> dict[str, Any]:
    """The keys of ``resolved`` that ``shape`` has (the background's own keys dropped)."""
    out = {}
    for key, value in shape.items():
        if key not in resolved:
            continue
        if isinstance(value, Mapping) and value and isinstance(resolved[key], Mapping):
            out[key] = _only(resolved[key], value)
        else:
            out[key] = resolved[key]
    return out


class Evaluator:
    """What an expression (e.g. verl's default ``${oc.select:a.b,1}``) would give at a key of a
    resolved tree; relative interpolations resolve against the key's parent. The tree is handed
    to OmegaConf once, for any number of keys.

    >>> Evaluator({"a": {"b": 4}, "c": {"d": 1}}).at("c.d", "${a.b}")
    4
    """

    def __init__(
        self, tree: Mapping[str, Any], background: Mapping[str, Any] | None = None
    ) -> None:
        from omegaconf import OmegaConf

        self._conf = OmegaConf.create(_over(background, tree))

    def at(self, key: str, expression: str) -> Any:
        """Raises when the expression cannot be resolved there."""
        from omegaconf import OmegaConf

        sentinel = object()
        before = OmegaConf.select(self._conf, key, default=sentinel)
        OmegaConf.update(self._conf, key, expression, merge=False, force_add=True)
        try:
            value = OmegaConf.select(self._conf, key, throw_on_resolution_failure=True)
            return OmegaConf.to_container(value) if OmegaConf.is_config(value) else value
        finally:
            if before is sentinel:
                _remove(self._conf, key)
            else:
                OmegaConf.update(self._conf, key, before, merge=False)


def missing_values(tree: dict[str, Any]) -> list[str]:
    """One problem per key still holding OmegaConf's ``???`` (a mandatory value nobody set);
    those keys are removed from ``tree`` (so the schema does not report them a second time)."""
    missing = [path for path, value in iter_leaves(tree) if value == MISSING]
    for path in missing:
        *parents, leaf = path.split(".")
        node = tree
        for part in parents:
            node = node[part]
        del node[leaf]
    return [f"{path}: '???' marks a value that must be set; set {path}=…" for path in missing]


def iter_leaves(tree: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    """(dotted key, value) of every non-mapping value and every empty mapping."""
    for key, value in tree.items():
        path = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            yield from iter_leaves(value, path + ".")
        else:
            yield path, value


def _is_interpolated(value: Any) -> bool:
    if isinstance(value, str):
        return "${" in value
    if isinstance(value, list | tuple):
        return any(_is_interpolated(v) for v in value)
    return False


def _remove(conf: Any, path: str) -> None:
    parent_path, _, leaf = path.rpartition(".")
    from omegaconf import OmegaConf

    parent = OmegaConf.select(conf, parent_path) if parent_path else conf
    del parent[leaf]


def _first_line(err: Exception) -> str:
    return next(
        (line.strip() for line in str(err).splitlines() if line.strip()), type(err).__name__
    )


__all__ = ["MISSING", "Evaluator", "iter_leaves", "missing_values", "resolve_interpolations"]
