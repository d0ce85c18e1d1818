"""verl's keys that ppoflow's schema does not have: mapped, accepted with a notice, or refused.

A verl user's YAML files and scripts set keys from several verl releases. Each key that is not a
ppoflow key gets one fate, looked up in ``verl_keys.yaml`` (patterns, first match wins, in this
order) and ``verl_defaults.yaml`` (verl 0.9.1's defaults, generated from verl's own config):

==============  ===========================================================================
rename          read as a ppoflow key (``fsdp_config.param_offload`` → ``param_offload``)
per_rank        verl's global micro-batch size → ppoflow's per-rank key, ÷ DP size
no_effect       accepted; a notice says how ppoflow does the thing instead
unsupported     a verl feature ppoflow lacks: dropped at verl's default, else an error
(unknown)       not a verl key either: left for the schema to report, with a did-you-mean
==============  ===========================================================================

Precedence between two spellings of one key follows the config layers (each file of a ``base:``
chain, then dict params, then command-line overrides): the value from the later layer wins, so a
legacy spelling on the command line beats a default written in the base file; two values set in
one layer that disagree are an error. ``None`` never competes (verl's files list unset keys as
null).

Notices: a mapped or no-effect key gets one line when it was set on the command line / in params or
differs from verl's default; the others (e.g. every key of verl's own generated file) are counted in
one summary line.
"""

from __future__ import annotations

import copy
import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

import yaml

from stages.config.interpolation import Evaluator, iter_leaves
from stages.config.model_tree import nested_model, suggest

TABLE_PATH = Path(__file__).with_name("verl_keys.yaml")
DEFAULTS_PATH = Path(__file__).with_name("verl_defaults.yaml")
DP_KEYS = ("trainer.n_gpus_per_node", "trainer.nnodes")


class Fate(Enum):
    """What became of one key of the input."""

    PPOFLOW = "ppoflow key"
    RENAME = "mapped"
    PER_RANK = "mapped per rank"
    NO_EFFECT = "no effect"
    DROPPED = "verl default, dropped"
    UNSUPPORTED = "unsupported"
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class Rule:
    """The fate of a verl key, the ppoflow key it becomes (renames) and why."""

    fate: Fate
    target: str | None = None
    why: str = ""


@dataclass
class Translation:
    """A tree in ppoflow's keys, with what the translation said and found."""

    tree: dict[str, Any]
    notices: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    #: verl keys mapped or dropped at verl's defaults without a notice line of their own
    quiet: int = 0
    #: one row per key of the input: key, value, fate, target, why
    report: list[dict[str, Any]] = field(default_factory=list)


# --- the table -----------------------------------------------------------------------------------


def _pattern(text: str) -> re.Pattern[str]:
    """``a.*.b`` → a regex where each ``*`` captures any run of characters (dots included)."""
    return re.compile("^" + "(.*)".join(re.escape(part) for part in text.split("*")) + "$")


@functools.cache
def _table() -> dict[str, Any]:
    raw = yaml.load(TABLE_PATH.read_text(encoding="utf-8"), Loader=_yaml_loader())
    return {
        "rename": [(_pattern(k), v) for k, v in raw["rename"].items()],
        "per_rank": dict(raw["per_rank"]),
        "values": [(_pattern(k), v["map"], v["why"]) for k, v in raw["values"].items()],
        "no_effect": [(_pattern(k), v) for k, v in raw["no_effect"].items()],
        "unsupported": [(_pattern(k), v) for k, v in raw["unsupported"].items()],
        "older": dict(raw["older"]),
    }


@functools.cache
def verl_defaults() -> dict[str, Any]:
    """verl 0.9.1's default of every key ppoflow lacks, plus the ``older`` releases' keys."""
    defaults = yaml.load(DEFAULTS_PATH.read_text(encoding="utf-8"), Loader=_yaml_loader())
    return {**_table()["older"], **defaults}


@functools.cache
def _verl_sections() -> frozenset[str]:
    """Every dotted prefix of a verl key that is not itself a ppoflow key (verl-only sections)."""
    sections = set()
    for key in verl_defaults():
        parts = key.split(".")
        sections.update(".".join(parts[:i]) for i in range(1, len(parts)))
    return frozenset(s for s in sections if not is_schema_key(s))


def _yaml_loader() -> type:
    return getattr(yaml, "CSafeLoader", yaml.SafeLoader)


@functools.cache
def _schema_keys() -> frozenset[str]:
    """Every dotted key of ppoflow's schema, sections included."""
    from stages.config.schema_run import RunSchema

    keys: set[str] = set()

    def walk(model: Any, prefix: str) -> None:
        for name, info in model.model_fields.items():
            keys.add(prefix + name)
            child = nested_model(info.annotation)
            if child is not None:
                walk(child, f"{prefix}{name}.")

    walk(RunSchema, "")
    return frozenset(keys)


@functools.cache
def _schema_defaults() -> dict[str, Any]:
    """The default run config with its inherited keys filled (what ``PPORunConfig()`` holds)."""
    from stages.config.derived import fill_inherited
    from stages.config.schema_run import RunSchema

    return fill_inherited(RunSchema()).model_dump(mode="json")


def schema_defaults() -> dict[str, Any]:
    """ppoflow's defaults as a tree: what a verl interpolation naming an unset key sees (verl's
    config lists every key with its default)."""
    return copy.deepcopy(_schema_defaults())


def is_schema_key(key: str) -> bool:
    """True for a ppoflow key or section (``trainer``, ``trainer.logger``).

    >>> is_schema_key("actor_rollout_ref.actor.param_offload"), is_schema_key("data.tokenizer")
    (True, False)
    """
    return key in _schema_keys()


@functools.cache
def _schema_sections() -> frozenset[str]:
    """The ppoflow keys that are sections (a key below them exists)."""
    keys = _schema_keys()
    return frozenset(k.rsplit(".", 1)[0] for k in keys if "." in k)


def reads_as_schema(key: str) -> bool:
    """A ppoflow key taken as it is: not a ppoflow section that verl's older releases set as a
    value and a rename maps (``reward.reward_manager: naive`` → ``reward.reward_manager.name``).

    >>> reads_as_schema("reward.reward_manager.name"), reads_as_schema("reward.reward_manager")
    (True, False)
    """
    if not is_schema_key(key):
        return False
    if key not in _schema_sections():
        return True
    return not any(pattern.match(key) for pattern, _ in _table()["rename"])


def rule_for(key: str) -> Rule | None:
    """The fate of a key that is not a ppoflow key, or None when verl has no such key either.

    >>> rule_for("actor_rollout_ref.actor.fsdp_config.param_offload").target
    'actor_rollout_ref.actor.param_offload'
    >>> rule_for("actor_rollout_ref.model.lora.a2a_experimental").why
    "Megatron's all-to-all LoRA communication"
    >>> rule_for("trainer.totl_epochs") is None
    True
    """
    table = _table()
    for pattern, target in table["rename"]:
        match = pattern.match(key)
        if match:
            for part in match.groups():
                target = target.replace("*", part, 1)
            return Rule(Fate.RENAME, target, "verl's spelling")
    if key in table["per_rank"]:
        return Rule(Fate.PER_RANK, table["per_rank"][key], "verl's global micro-batch size")
    for section in ("no_effect", "unsupported"):
        for pattern, why in table[section]:
            if pattern.match(key):
                return Rule(
                    Fate.NO_EFFECT if section == "no_effect" else Fate.UNSUPPORTED, None, why
                )
    if _default_of(key)[0]:
        return Rule(Fate.UNSUPPORTED, None, "")
    return None


def _default_of(key: str) -> tuple[bool, Any]:
    """(is a verl key, its default); a key inside a verl mapping default (e.g. ``engine_kwargs``)
    is a verl key with no default of its own (returned as ``...``)."""
    defaults = verl_defaults()
    if key in defaults:
        return True, defaults[key]
    parts = key.split(".")
    for depth in range(len(parts) - 1, 0, -1):
        if isinstance(defaults.get(".".join(parts[:depth])), Mapping):
            return True, ...
    return False, None


def translate_value(key: str, value: Any) -> tuple[Any, str | None]:
    """verl's value of a ppoflow key in ppoflow's terms, with why (None when unchanged).

    >>> translate_value("actor_rollout_ref.actor.strategy", "fsdp2")[0]
    'deepspeed'
    """
    for pattern, mapping, why in _table()["values"]:
        if pattern.match(key) and isinstance(value, str) and value in mapping:
            return mapping[value], why
    return value, None


# --- the translation -----------------------------------------------------------------------------


@dataclass
class _Placed:
    value: Any
    layer: int
    spelled: str


class _Translator:
    """One pass over a tree's leaves (see :func:`translate_verl_keys`)."""

    def __init__(self, tree: Mapping[str, Any], origin, loud_from, layer_names) -> None:
        self.tree = tree
        self.origin = origin or {}
        self.loud_from = loud_from
        self.layer_names = layer_names or {}
        self.placed: dict[str, _Placed] = {}
        self.out = Translation(tree={})

    @functools.cached_property
    def evaluator(self) -> Evaluator:
        return Evaluator(self.tree, schema_defaults())

    def run(self) -> Translation:
        leaves = list(iter_leaves(self.tree))
        if all(reads_as_schema(k) and translate_value(k, v)[1] is None for k, v in leaves):
            self.out.tree = dict(self.tree)  # nothing to translate (every config ppoflow wrote)
            self.out.report = [_row(k, v, Fate.PPOFLOW, k) for k, v in leaves]
            return self.out
        for key, value in leaves:
            self.leaf(key, value)
        tree: dict[str, Any] = {}
        for key, placed in self.placed.items():
            _set(tree, key, placed.value)
        self.out.tree = tree
        return self.out

    def layer(self, key: str) -> int:
        return self.origin.get(key, 0)

    def is_loud(self, key: str, value: Any) -> bool:
        """Whether a mapped / no-effect key gets its own notice line: set by the user's own
        layers, or holding something else than verl's default."""
        return self.layer(key) >= self.loud_from or not self.at_default(key, value)

    def at_default(self, key: str, value: Any) -> bool:
        """``value`` is what verl 0.9.1 would hold at ``key`` by default; a default written as an
        interpolation (also one on a section above the key) is evaluated in this tree."""
        known, default = _default_of(key)
        if known and default is not ... and _same(value, default):
            return True
        for anchor in (key, *_ancestors(key)):
            expression = verl_defaults().get(anchor)
            if isinstance(expression, str) and "${" in expression:
                try:
                    evaluated = self.evaluator.at(anchor, expression)
                except Exception:  # verl's expression names keys this tree lacks
                    return False
                return _same(value, _dig(evaluated, key[len(anchor) + 1 :]))
        return False

    def leaf(self, key: str, value: Any) -> None:
        if reads_as_schema(key):
            mapped, why = translate_value(key, value)
            if why is not None and self.layer(key) >= self.loud_from:
                self.out.notices.append(f"{key} = {value!r} is read as {mapped!r} ({why})")
            elif why is not None:
                self.out.quiet += 1
            self.out.report.append(_row(key, value, Fate.PPOFLOW, key))
            self.place(key, mapped, key)
            return
        rule = rule_for(key)
        if rule is None:
            self.unknown(key, value)
        elif rule.fate in (Fate.RENAME, Fate.PER_RANK):
            self.rename(key, value, rule)
        elif rule.fate is Fate.NO_EFFECT:
            self.note(key, value, f"{key} = {value!r} has no effect in ppoflow: {rule.why}")
            self.out.report.append(_row(key, value, Fate.NO_EFFECT, why=rule.why))
        else:
            self.unsupported(key, value, rule)

    def rename(self, key: str, value: Any, rule: Rule) -> None:
        target = rule.target
        if value is None:
            self.out.report.append(_row(key, value, Fate.DROPPED, target, "null: not set"))
            return
        if rule.fate is Fate.PER_RANK:
            value, text = self.per_rank(key, value, target)
            if value is None:
                return
        else:
            value, _ = translate_value(target, value)
            text = f"verl's {key} is read as {target} = {value!r}"
        if not is_schema_key(target):  # renamed into another verl key (a legacy block)
            self.leaf_as(target, value, key)
            return
        self.note(key, value, text)
        self.out.report.append(_row(key, value, rule.fate, target, rule.why))
        self.place(target, value, key)

    def leaf_as(self, target: str, value: Any, spelled: str) -> None:
        """A legacy key renamed into a verl key of the 0.9.1 layout: judge it as that key."""
        self.origin.setdefault(target, self.layer(spelled))
        self.leaf(target, value)

    def per_rank(self, key: str, value: Any, target: str) -> tuple[Any, str]:
        dp = self.dp_size()
        if not isinstance(value, int) or isinstance(value, bool) or value < 1 or value % dp:
            self.out.problems.append(
                f"{key} = {value!r}: verl's global micro-batch size must be a positive multiple "
                f"of the DP size {dp} (trainer.n_gpus_per_node × trainer.nnodes) to become "
                f"{target}; or set {target} directly"
            )
            return None, ""
        text = (
            f"verl's {key} = {value} (all ranks) is read as {target} = {value // dp} (DP size {dp})"
        )
        return value // dp, text

    def dp_size(self) -> int:
        from stages.config.schema_run import RunSchema

        sizes = []
        for key in DP_KEYS:
            section, name = key.split(".")
            value = (self.tree.get(section) or {}).get(name)
            default = RunSchema.model_fields[section].default_factory().__dict__[name]
            sizes.append(value if isinstance(value, int) and value > 0 else default)
        return sizes[0] * sizes[1]

    def unsupported(self, key: str, value: Any, rule: Rule) -> None:
        known, default = _default_of(key)
        default = default if known else ...
        if self.is_inert(key, value, default):
            self.out.quiet += 1
            self.out.report.append(_row(key, value, Fate.DROPPED, why=rule.why or "verl feature"))
            return
        what = f" ({rule.why})" if rule.why else ""
        fix = "" if default is ... else f" (verl's default: {default!r})"
        self.out.problems.append(
            f"{key} = {value!r}: verl feature not supported by ppoflow{what}; remove the line{fix}"
        )
        self.out.report.append(_row(key, value, Fate.UNSUPPORTED, why=rule.why))

    def is_inert(self, key: str, value: Any, default: Any) -> bool:
        """None, verl's default (also an interpolated one), or (no default known) an "off"
        value: the key asks for nothing ppoflow lacks."""
        if value is None or self.at_default(key, value):
            return True
        return default is ... and value in (False, 0, "", [], {})

    def unknown(self, key: str, value: Any) -> None:
        if key in _verl_sections():  # a verl section given a value
            names = sorted(
                {k[len(key) + 1 :].split(".")[0] for k in verl_children(key)} - {"_target_"}
            )
            self.out.problems.append(
                f"{key} = {value!r}: in verl 0.9.1 this is a section (keys: {', '.join(names)}); "
                f"set one of its keys, e.g. {key}.{names[0]}=…"
            )
            self.out.report.append(_row(key, value, Fate.UNKNOWN))
            return
        section = next(
            (p for p in _ancestors(key) if p in _verl_sections()), None
        )  # deepest verl-only section above the key
        if section is None:
            self.out.report.append(_row(key, value, Fate.UNKNOWN))
            self.place(key, value, key)  # the schema reports it, with its did-you-mean
            return
        name = key[len(section) + 1 :].split(".")[0]
        siblings = sorted({k[len(section) + 1 :].split(".")[0] for k in verl_children(section)})
        self.out.problems.append(
            f"{key}: unknown key in verl's {section} section{suggest(name, siblings)}"
        )
        self.out.report.append(_row(key, value, Fate.UNKNOWN))

    def note(self, key: str, value: Any, text: str) -> None:
        if self.is_loud(key, value):
            self.out.notices.append(text)
        else:
            self.out.quiet += 1

    def place(self, key: str, value: Any, spelled: str) -> None:
        """Put ``value`` at ppoflow key ``key``; between two spellings the later layer wins,
        ``None`` never competes, and two different values from one layer are a problem."""
        layer, held = self.layer(spelled), self.placed.get(key)
        if held is None or (held.value is None and value is not None):
            self.placed[key] = _Placed(value, layer, spelled)
            return
        if value is None or layer < held.layer:
            return
        if layer > held.layer or _same(held.value, value):
            self.placed[key] = _Placed(value, layer, spelled)
            return
        first, second = sorted([(held.spelled, held.value), (spelled, value)])
        where = self.layer_names.get(layer, "one config layer")
        self.out.problems.append(
            f"{first[0]} = {first[1]!r} and {second[0]} = {second[1]!r} set the same ppoflow key "
            f"{key} in {where}; set only {key}"
        )


def translate_verl_keys(
    tree: Mapping[str, Any],
    origin: Mapping[str, int] | None = None,
    loud_from: int = 0,
    layer_names: Mapping[int, str] | None = None,
) -> Translation:
    """``tree`` with every verl key replaced by its ppoflow key or dropped (see the module doc).

    Args:
        tree: a merged config tree (interpolations resolved).
        origin: dotted key → index of the config layer that set it (default: all layer 0).
        loud_from: layers from this index on are the user's command line / params: their mapped
            keys always get a notice line.
        layer_names: index → a name for messages ("overrides", a file path).

    >>> t = translate_verl_keys({"custom_reward_function": {"path": "r.py", "name": None},
    ...                          "actor_rollout_ref": {"actor": {"fsdp_config": {"param_offload": True}}}})
    >>> t.tree
    {'reward': {'custom_reward_function': {'path': 'r.py'}}, 'actor_rollout_ref': {'actor': {'param_offload': True}}}
    >>> t.notices[0]
    "verl's custom_reward_function.path is read as reward.custom_reward_function.path = 'r.py'"
    """
    return _Translator(tree, dict(origin or {}), loud_from, layer_names).run()


def verl_children(section: str) -> list[str]:
    """verl's keys under a dotted section."""
    return [k for k in verl_defaults() if k.startswith(section + ".")]


def verl_key_report(tree: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One row per key of ``tree``: key, value, fate (a :class:`Fate` value), ppoflow key, why."""
    from stages.config.interpolation import resolve_interpolations

    resolved, _, _ = resolve_interpolations(tree, schema_defaults())
    return translate_verl_keys(resolved).report


def _row(key: str, value: Any, fate: Fate, target: str | None = None, why: str = "") -> dict:
    return {"key": key, "value": value, "fate": fate.value, "target": target, "why": why}


def _dig(value: Any, path: str) -> Any:
    """``value['a']['b']`` for ``path = 'a.b'`` (``...`` when absent); ``value`` for ``''``."""
    for part in path.split(".") if path else ():
        value = value.get(part, ...) if isinstance(value, Mapping) else ...
    return value


def _ancestors(key: str) -> list[str]:
    """Dotted prefixes of ``key``, deepest first."""
    parts = key.split(".")
    return [".".join(parts[:i]) for i in range(len(parts) - 1, 0, -1)]


def _same(a: Any, b: Any) -> bool:
    """Equal as config values (1 == 1.0, but True is not 1)."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    return a == b


def _set(tree: dict[str, Any], key: str, value: Any) -> None:
    *parents, leaf = key.split(".")
    node = tree
    for part in parents:
        child = node.get(part)
        if not isinstance(child, dict):
            child = node[part] = {}
        node = child
    node[leaf] = value


__all__ = [
    "DEFAULTS_PATH",
    "TABLE_PATH",
    "Fate",
    "Rule",
    "Translation",
    "is_schema_key",
    "rule_for",
    "schema_defaults",
    "translate_value",
    "translate_verl_keys",
    "verl_children",
    "verl_defaults",
    "verl_key_report",
]
