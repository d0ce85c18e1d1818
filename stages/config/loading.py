"""Load a run config: YAML file (with ``base:`` includes) < dict params < ``key=value`` overrides.

* ``load_config(None)`` is the pydantic defaults alone (what ``configs/ppo_trainer.yaml`` shows).
* A YAML file may start with ``base: other.yaml`` (relative to the file): the other file is loaded
  first and this one is deep-merged over it (mappings merge key by key; lists and values replace).
* ``params`` (e.g. Prefect deployment parameters) may be nested dicts, dotted keys, or both.
* ``overrides`` are ``a.b.c=value`` strings; the value is parsed as YAML (``true``, ``1e-6``,
  ``[a, b]``, ``null``); the key path must exist in the schema.

Every failure is a :class:`ConfigError` listing each problem with its dotted key.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from stages.config.aliases import LEGACY_KEYS, WORKER_BACKEND_ALIAS
from stages.config.errors import ConfigError, format_validation_error, nested_model, suggest
from stages.config.root import PPORunConfig

REPO_ROOT = Path(__file__).resolve().parents[2]
CONFIGS_DIR = REPO_ROOT / "configs"
BASE_KEY = "base"
KEY_PATTERN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")


class _Loader(yaml.SafeLoader):
    """Safe YAML that reads ``1e-6`` as a float (YAML 1.1 needs ``1.0e-6``) and rejects
    duplicate keys instead of silently keeping the last one."""

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


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)


def parse_yaml(text: str, where: str) -> Any:
    """YAML text -> Python value, with ``where`` named in any syntax error."""
    try:
        return yaml.load(text, Loader=_Loader)
    except yaml.YAMLError as err:
        detail = " ".join(str(err).split())
        raise ConfigError([f"{where}: not valid YAML: {detail}"], where) from None


def resolve_config_path(name: str | Path) -> Path:
    """A config file path, or a name in the repo's configs/ ('grpo' or 'grpo.yaml')."""
    path = Path(name).expanduser()
    if path.is_file():
        return path
    for candidate in (CONFIGS_DIR / str(name), CONFIGS_DIR / f"{name}.yaml"):
        if candidate.is_file():
            return candidate
    known = sorted(p.stem for p in CONFIGS_DIR.glob("*.yaml"))
    raise ConfigError(
        [
            f"config file not found: {str(name)!r} (not a file here, nor in {CONFIGS_DIR}; packaged configs: {known})"
        ],
        str(name),
    )


def read_config_tree(path: str | Path, _chain: tuple[Path, ...] = ()) -> dict[str, Any]:
    """The mapping in a YAML config file with its ``base:`` chain merged underneath it."""
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
        return tree
    if not isinstance(base, str):
        raise ConfigError([f"{path}: base: expected a file name, got {base!r}"], str(path))
    base_path = Path(base).expanduser()
    base_path = base_path if base_path.is_absolute() else path.parent / base_path
    if not base_path.is_file():
        raise ConfigError([f"{path}: base: file not found: {base_path}"], str(path))
    return deep_merge(read_config_tree(base_path, (*_chain, path)), tree)


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
    """``'a.b.c=value'`` -> ``('a.b.c', value)`` with the value parsed as YAML.

    >>> parse_override("actor_rollout_ref.actor.optim.lr=1e-6")
    ('actor_rollout_ref.actor.optim.lr', 1e-06)
    >>> parse_override("trainer.logger=[console]")
    ('trainer.logger', ['console'])
    """
    key, sep, raw = text.partition("=")
    key = key.strip()
    if key[:1] in ("+", "~"):
        raise ConfigError(
            [f"override {text!r}: the '{key[0]}' prefix is not supported; every key already "
             "exists in the schema, so write key=value"],
            "overrides",
        )  # fmt: skip
    if not sep or not KEY_PATTERN.fullmatch(key):
        raise ConfigError(
            [f"override {text!r}: expected key.path=value (e.g. trainer.total_epochs=2)"],
            "overrides",
        )
    if not raw.strip():
        raise ConfigError(
            [
                f"override {text!r}: empty value; write {key}=null for null or {key}='' for an empty string"
            ],
            "overrides",
        )
    try:
        return key, parse_yaml(raw, f"override {text!r}")
    except ConfigError as err:
        raise ConfigError(err.problems, "overrides") from None


def check_key_path(
    key: str, where: str, source: str = "overrides", root: type[BaseModel] = PPORunConfig
) -> None:
    """Raise ConfigError unless ``key`` names a field of the schema (or a legacy alias)."""
    if key in LEGACY_KEYS or key == WORKER_BACKEND_ALIAS[0]:
        return
    parts, model = key.split("."), root
    for depth, part in enumerate(parts):
        prefix = ".".join(parts[: depth + 1])
        if model is None:
            parent = ".".join(parts[:depth])
            raise ConfigError(
                [f"{where}: {parent} is a value, not a section; cannot set {prefix}"], source
            )
        if part not in model.model_fields:
            hint = suggest(part, list(model.model_fields))
            raise ConfigError([f"{where}: {prefix}: unknown key{hint}"], source)
        model = nested_model(model.model_fields[part].annotation)


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


def validate_config(data: Mapping[str, Any], source: str = "dict") -> PPORunConfig:
    """Validate a nested mapping; any problem -> one ConfigError listing all of them."""
    try:
        return PPORunConfig.model_validate(dict(data))
    except ValidationError as err:
        raise ConfigError(format_validation_error(err, PPORunConfig), source) from None


def merge_overrides(
    tree: Mapping[str, Any],
    overrides: Sequence[str] | None = None,
    params: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """``tree`` with ``params`` then ``overrides`` applied (both checked against the schema)."""
    merged, problems = deep_merge(tree, params_tree(params or {})), []
    for text in overrides or ():
        try:
            key, value = parse_override(text)
            check_key_path(key, f"override {text!r}", "overrides")
        except ConfigError as err:
            problems.extend(err.problems)
            continue
        merged = deep_merge(merged, params_tree({key: value}))  # a mapping value merges
    if problems:
        raise ConfigError(problems, "overrides")
    return merged


def load_config(
    path: str | Path | None = None,
    overrides: Sequence[str] | None = None,
    params: Mapping[str, Any] | None = None,
) -> PPORunConfig:
    """Load, merge and validate a run config (see the module docstring for the order)."""
    if isinstance(overrides, str):
        raise TypeError(
            f"overrides must be a list of 'key=value' strings, got the string {overrides!r}"
        )
    tree = read_config_tree(path) if path is not None else {}
    source = str(path) if path is not None else "defaults"
    if params:
        source += f" + {len(params)} param" + "s" * (len(params) > 1)
    if overrides:
        source += f" + {len(overrides)} override" + "s" * (len(overrides) > 1)
    return validate_config(merge_overrides(tree, overrides, params), source)


def apply_overrides(
    cfg: PPORunConfig,
    overrides: Sequence[str] | None = None,
    params: Mapping[str, Any] | None = None,
) -> PPORunConfig:
    """A re-validated copy of ``cfg`` with more overrides; inherited keys are re-resolved
    from ``cfg``'s explicit settings (``cfg.source``), e.g. the critic follows a new actor
    mini-batch size unless the critic's was set explicitly."""
    return validate_config(merge_overrides(cfg.source, overrides, params), "config + overrides")


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
