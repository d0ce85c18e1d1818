"""Load a run config as verl does: YAML layers < dict params < overrides, then ``${…}``, then verl keys.

* ``load_config(None)`` is the pydantic defaults alone (what ``configs/ppo_trainer.yaml`` shows).
* A YAML file may start with ``base: other.yaml`` (relative to the file): the other file is loaded
  first and this one is deep-merged over it (mappings merge key by key; lists and values replace).
  Each file of the chain is one config layer.
* ``params`` (e.g. Prefect deployment parameters) may be nested dicts, dotted keys, or both: one
  layer after the files.
* ``overrides`` are command-line strings in Hydra's grammar (``key=value``, ``+key=value``,
  ``++key=value``, ``~key``; :mod:`stages.config.overrides`): the last layer.
* Then, on the merged tree: ``${…}`` interpolations are resolved by OmegaConf
  (:mod:`stages.config.interpolation`), verl's keys are mapped to ppoflow's or refused
  (:mod:`stages.config.verl_keys`; between two spellings of one key the later layer wins), and the
  result is validated.

Every failure is one :class:`ConfigError` listing every problem found in that one pass: override
syntax, interpolations, verl features, unknown keys, bad values and cross-field rules. Notices
(verl keys read as ppoflow keys, settings with no effect) are :class:`ConfigNotice` warnings.
"""

from __future__ import annotations

import copy
import re
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from stages.config.errors import ConfigError, dotted, format_validation_error
from stages.config.interpolation import iter_leaves, missing_values, resolve_interpolations
from stages.config.overrides import Override, parse_one, parse_overrides
from stages.config.paths import resolve_config_path
from stages.config.root import CROSS_FIELD_ERROR, ConfigNotice, PPORunConfig
from stages.config.verl_keys import schema_defaults, translate_verl_keys

BASE_KEY = "base"


#: the most values a config file may expand to through YAML aliases (``*name``): a 1 KB file of
#: nested aliases ("billion laughs") would otherwise expand to millions in every walk of the tree
MAX_EXPANDED_NODES = 100_000


class _Loader(yaml.SafeLoader):
    """Safe YAML that reads ``1e-6`` as a float (YAML 1.1 needs ``1.0e-6``), rejects duplicate
    keys instead of silently keeping the last one, and refuses a document whose aliases expand
    it past :data:`MAX_EXPANDED_NODES` values."""

    def get_single_node(self) -> Any:
        node = super().get_single_node()
        if node is not None:
            size = _expanded_size(node, {})
            if size > MAX_EXPANDED_NODES:
                raise yaml.composer.ComposerError(
                    None,
                    None,
                    f"its aliases (*name) expand it to {size:,} values, more than "
                    f"{MAX_EXPANDED_NODES:,}; write the values out instead of nesting aliases",
                    node.start_mark,
                )
        return node

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r}", key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def _expanded_size(node: yaml.Node, memo: dict[int, int]) -> int:
    """How many nodes ``node`` stands for once every alias is expanded (each shared node
    counted once per reference; linear in the composed graph)."""
    known = memo.get(id(node))
    if known is not None:
        return known
    if isinstance(node, yaml.SequenceNode):
        size = 1 + sum(_expanded_size(child, memo) for child in node.value)
    elif isinstance(node, yaml.MappingNode):
        size = 1 + sum(_expanded_size(k, memo) + _expanded_size(v, memo) for k, v in node.value)
    else:
        size = 1
    memo[id(node)] = size
    return size


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)


def parse_yaml(text: str, where: str) -> Any:
    """YAML text -> Python value, with ``where`` named in any syntax error.

    >>> try:
    ...     parse_yaml("data: {train_batch_size: [4}", "my.yaml")
    ... except ConfigError as err:
    ...     print(err.problems[0])
    my.yaml, line 1, column 28: not valid YAML: expected ',' or ']', but got '}' (while parsing a flow sequence that starts at line 1, column 26)
    """
    try:
        return yaml.load(text, Loader=_Loader)
    except yaml.YAMLError as err:
        raise ConfigError([yaml_problem(err, where)], where) from None


def yaml_problem(err: yaml.YAMLError, where: str) -> str:
    """PyYAML's error as one line: file, line and column first, then the problem and the
    construct it was in (PyYAML's own text repeats the source lines with a ``^`` marker)."""
    mark = getattr(err, "problem_mark", None)
    problem = getattr(err, "problem", None)
    if mark is None or problem is None:
        return f"{where}: not valid YAML: {' '.join(str(err).split())}"
    line = f"{where}, line {mark.line + 1}, column {mark.column + 1}: not valid YAML: {problem}"
    context, context_mark = getattr(err, "context", None), getattr(err, "context_mark", None)
    if context and context_mark is not None:
        starts = f"line {context_mark.line + 1}, column {context_mark.column + 1}"
        line += f" ({context} that starts at {starts})"
    elif context:
        line += f" ({context})"
    return line


Layer = tuple[str, dict[str, Any]]  # (name for messages, tree)


def read_config_layers(path: str | Path, _chain: tuple[Path, ...] = ()) -> list[Layer]:
    """The ``base:`` chain of a YAML config file as layers, the deepest base first."""
    path = resolve_config_path(path).resolve()
    if path in _chain:
        cycle = " -> ".join(str(p) for p in (*_chain, path))
        raise ConfigError([f"base: include cycle {cycle}"], str(path))
    tree = parse_yaml(path.read_text(encoding="utf-8"), str(path))
    if tree is None:
        tree = {}
    if not isinstance(tree, dict):
        raise ConfigError([f"{path}: top level must be a mapping of keys, got {tree!r}"], str(path))
    base = tree.pop(BASE_KEY, None)
    if base is None:
        return [(str(path), tree)]
    if not isinstance(base, str):
        raise ConfigError([f"{path}: base: expected a file name, got {base!r}"], str(path))
    base_path = Path(base).expanduser()
    base_path = base_path if base_path.is_absolute() else path.parent / base_path
    if not base_path.is_file():
        raise ConfigError([f"{path}: base: file not found: {base_path}"], str(path))
    return [*read_config_layers(base_path, (*_chain, path)), (str(path), tree)]


def read_config_tree(path: str | Path) -> dict[str, Any]:
    """The mapping in a YAML config file with its ``base:`` chain merged underneath it."""
    merged: dict[str, Any] = {}
    for _, tree in read_config_layers(path):
        merged = deep_merge(merged, tree)
    return merged


def deep_merge(base: Mapping[str, Any], update: Mapping[str, Any]) -> dict[str, Any]:
    """``update`` over ``base``: mappings merge recursively, anything else replaces.

    >>> deep_merge({"a": {"b": 1, "c": [1]}}, {"a": {"c": [2]}, "d": 0})
    {'a': {'b': 1, 'c': [2]}, 'd': 0}
    """
    merged = copy.deepcopy(dict(base))
    for key, value in update.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def parse_override(text: str) -> tuple[str, Any]:
    """``'a.b.c=value'`` -> ``('a.b.c', value)``, the value read by Hydra's override grammar.

    >>> parse_override("actor_rollout_ref.actor.optim.lr=1e-6")
    ('actor_rollout_ref.actor.optim.lr', 1e-06)
    >>> parse_override("trainer.logger=['console','wandb']")
    ('trainer.logger', ['console', 'wandb'])
    """
    try:
        override = parse_one(text)
    except ValueError as err:
        raise ConfigError([str(err)], "overrides") from None
    return override.key, override.value


def set_dotted(tree: dict[str, Any], key: str, value: Any) -> None:
    """Set ``tree['a']['b']['c'] = value`` for ``key = 'a.b.c'``, creating mappings on the way."""
    *parents, leaf = key.split(".")
    node = tree
    for part in parents:
        if not isinstance(node.get(part), dict):
            node[part] = {}
        node = node[part]
    node[leaf] = value


def params_tree(params: Mapping[str, Any]) -> dict[str, Any]:
    """Dict overrides (nested, dotted keys, or both) -> one nested mapping."""
    tree: dict[str, Any] = {}
    for key, value in params.items():
        nested: dict[str, Any] = {}
        set_dotted(nested, str(key), value)
        tree = deep_merge(tree, nested)
    return tree


class Composed:
    """Layers merged in order, with the index of the layer that last set each leaf (``origin``)."""

    def __init__(self) -> None:
        self.tree: dict[str, Any] = {}
        self.origin: dict[str, int] = {}
        self.names: dict[int, str] = {}
        self.problems: list[str] = []

    def add(self, name: str, tree: Mapping[str, Any]) -> None:
        """Merge one layer (a file, the params) over the layers before it."""
        index = len(self.names)
        self.names[index] = name
        self._merge(tree, index)

    def add_overrides(self, overrides: Sequence[Override]) -> None:
        """Apply command-line overrides in order, as one layer."""
        index = len(self.names)
        self.names[index] = "the command-line overrides"
        for override in overrides:
            if override.delete:
                self._delete(override)
            else:
                self._merge(params_tree({override.key: override.value}), index)

    def _merge(self, tree: Mapping[str, Any], index: int) -> None:
        self.tree = deep_merge(self.tree, tree)
        for key, _ in iter_leaves(tree):
            self.origin[key] = index

    def _delete(self, override: Override) -> None:
        *parents, leaf = override.key.split(".")
        node: Any = self.tree
        for part in parents:
            node = node.get(part) if isinstance(node, Mapping) else None
        if not isinstance(node, dict) or leaf not in node:
            self.problems.append(
                f"override {override.text!r}: {override.key} is not set in the config, so there "
                "is nothing to delete (its default applies already)"
            )
            return
        if override.delete_if_value and node[leaf] != override.value:
            self.problems.append(
                f"override {override.text!r}: {override.key} is {node[leaf]!r}, not "
                f"{override.value!r}; nothing deleted"
            )
            return
        del node[leaf]
        prefix = override.key + "."
        self.origin = {
            k: v for k, v in self.origin.items() if k != override.key and not k.startswith(prefix)
        }


def validate_config(data: Mapping[str, Any], source: str = "dict") -> PPORunConfig:
    """Validate a nested mapping in ppoflow's keys; any problem -> one ConfigError listing all."""
    cfg, problems = _validate_collecting(data)
    if problems:
        raise ConfigError(problems, source)
    return cfg


def build_config(composed: Composed, source: str, loud_from: int) -> PPORunConfig:
    """Resolve interpolations, translate verl keys and validate; every problem in one error.

    ``loud_from``: the first layer that is the user's own command line / params (their mapped
    verl keys get a notice line each).
    """
    problems = list(composed.problems)
    resolved, found, _ = resolve_interpolations(composed.tree, schema_defaults())
    problems += found
    translated = translate_verl_keys(resolved, composed.origin, loud_from, composed.names)
    problems += translated.problems + missing_values(translated.tree)
    for notice in translated.notices:
        warnings.warn(notice, ConfigNotice, stacklevel=3)
    if translated.quiet:
        more = " more" if translated.notices else ""
        keys = f"{translated.quiet}{more} verl key" + (
            " holds verl 0.9.1's default and was" if translated.quiet == 1 else
            "s hold verl 0.9.1's defaults and were"
        )  # fmt: skip
        warnings.warn(
            f"{keys} read or dropped without a line of its own (`ppoflow config verl-keys` lists "
            "every key's fate)",
            ConfigNotice,
            stacklevel=3,
        )
    cfg, invalid = _validate_collecting(translated.tree)
    problems += invalid
    if problems:
        raise ConfigError(problems, source)
    return cfg


def _validate_collecting(data: Mapping[str, Any]) -> tuple[PPORunConfig | None, list[str]]:
    """(config, []) or (None, every problem): field problems, then the cross-field rules of the
    config with the bad fields left at their defaults (rules naming a bad field are skipped)."""
    try:
        return PPORunConfig.model_validate(dict(data)), []
    except ValidationError as err:
        problems = format_validation_error(err, PPORunConfig)
        bad = [e["loc"] for e in err.errors(include_url=False) if e["type"] != CROSS_FIELD_ERROR]
    if not bad:
        return None, problems
    repaired = copy.deepcopy(dict(data))
    removed = {_remove_loc(repaired, loc) for loc in bad}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            PPORunConfig.model_validate(repaired)
    except ValidationError as err:
        for item in err.errors(include_url=False):
            if item["type"] == CROSS_FIELD_ERROR:
                lines = item["ctx"]["problems"].splitlines()
                problems += [p for p in lines if not any(r and r in p for r in removed)]
    return None, problems


def _remove_loc(tree: dict[str, Any], loc: Sequence[str | int]) -> str:
    """Delete the key at a pydantic error location (a list item removes the whole list);
    returns the dotted key removed ('' when nothing was there)."""
    path = []
    for part in loc:
        if isinstance(part, int):
            break
        path.append(part)
    node: Any = tree
    for part in path[:-1]:
        node = node.get(part) if isinstance(node, dict) else None
    if not path or not isinstance(node, dict) or path[-1] not in node:
        return ""
    del node[path[-1]]
    return dotted(path)


def explain_verl_keys(
    path: str | Path | None = None, overrides: Sequence[str] | None = None
) -> list[dict[str, Any]]:
    """What became of each key of a config (``stages.config.verl_keys.Translation.report``):
    key, value, fate, the ppoflow key it became, why. Raises ConfigError only for a config that
    cannot be read or merged (bad YAML, bad override syntax)."""
    composed = Composed()
    for name, tree in read_config_layers(path) if path is not None else ():
        composed.add(name, tree)
    loud_from = len(composed.names)
    parsed, bad = parse_overrides(list(overrides or ()))
    composed.add_overrides(parsed)
    if bad or composed.problems:
        raise ConfigError([*bad, *composed.problems], "overrides")
    resolved, _, _ = resolve_interpolations(composed.tree, schema_defaults())
    return translate_verl_keys(resolved, composed.origin, loud_from, composed.names).report


def load_config(
    path: str | Path | None = None,
    overrides: Sequence[str] | None = None,
    params: Mapping[str, Any] | None = None,
) -> PPORunConfig:
    """Load, merge, resolve, translate and validate a run config (see the module docstring)."""
    if isinstance(overrides, str):
        raise TypeError(
            f"overrides must be a list of 'key=value' strings, got the string {overrides!r}"
        )
    composed = Composed()
    for name, tree in read_config_layers(path) if path is not None else ():
        composed.add(name, tree)
    source = str(path) if path is not None else "defaults"
    return _add_user_layers(composed, source, overrides, params)


def apply_overrides(
    cfg: PPORunConfig,
    overrides: Sequence[str] | None = None,
    params: Mapping[str, Any] | None = None,
) -> PPORunConfig:
    """A re-validated copy of ``cfg`` with more overrides; inherited keys are re-resolved
    from ``cfg``'s explicit settings (``cfg.source``), e.g. the critic follows a new actor
    mini-batch size unless the critic's was set explicitly."""
    composed = Composed()
    composed.add("the config", cfg.source)
    return _add_user_layers(composed, "config", overrides, params)


def _add_user_layers(
    composed: Composed,
    source: str,
    overrides: Sequence[str] | None,
    params: Mapping[str, Any] | None,
) -> PPORunConfig:
    loud_from = len(composed.names)
    if params:
        composed.add("the params", params_tree(params))
        source += f" + {len(params)} param" + "s" * (len(params) > 1)
    parsed, bad = parse_overrides(list(overrides or ()))
    composed.problems += bad
    composed.add_overrides(parsed)
    if overrides:
        source += f" + {len(overrides)} override" + "s" * (len(overrides) > 1)
    return build_config(composed, source, loud_from)


class _Dumper(yaml.SafeDumper):
    """Block mappings, flow lists (``logger: [console, mlflow]``), keys in schema order."""


_Dumper.add_representer(
    list,
    lambda dumper, data: dumper.represent_sequence("tag:yaml.org,2002:seq", data, flow_style=True),
)


def to_yaml(tree: Any) -> str:
    """A mapping as YAML in the project's style (shared with ``render_default_yaml``)."""
    return yaml.dump(tree, Dumper=_Dumper, sort_keys=False, allow_unicode=True, width=100)


def dump_config(cfg: PPORunConfig) -> str:
    """The resolved config as YAML, every key explicit; ``load_config`` reads it back equal."""
    return to_yaml(cfg.model_dump(mode="json"))
