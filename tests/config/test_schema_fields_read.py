"""Every leaf field of the run config is read by some code: no config value silently does nothing.

The walk visits every leaf of ``PPORunConfig`` (a field that is not itself a section) and looks for
a read of it in the project's code outside the schema definitions: ``dataproto/``, ``stages/`` and
``flows/``, without ``stages/config/schema_*.py`` (where the fields are declared),
``stages/config/checks.py`` and ``checks_dapo.py`` (a cross-field check validates a value, it does not use it),
``aliases.py`` (legacy key names), ``errors.py`` and ``render.py`` (generic messages and YAML).
Comments and docstrings are never read: the search is over the syntax tree.

A read is keyed on the field's *parent*, so a common field name cannot pass by accident
(``name``, ``path``, ``device`` and ``temperature`` are attributes of many other objects):

1. ``<parent>.<field>``: an attribute access whose object ends in a name under which the field's
   section is held (``cfg.data.train_max_samples``, ``optim.num_cycles``,
   ``rollout.val_kwargs.temperature``), or ``getattr(<parent>, "<field>")`` /
   ``read_field(<parent>, "<field>")`` with the name as a literal (the KL controller's reads), or
   the whole dotted path given to ``config_value(config, "<path>")`` (the run store's digest);
2. ``<alias>.<field>``, where the alias is bound in the same function to the section: by an
   assignment from such an expression (``source = rollout.val_kwargs if validate else rollout``),
   or as a parameter annotated with the section's class (``data: DataConfig``);
3. a method or property of the section's own class (in the schema file) that reads
   ``self.<field>``, when the code calls it through the parent
   (``optim.warmup_steps(total)`` reads ``lr_warmup_steps`` and ``lr_warmup_steps_ratio``).

A dotted path in a stage's ``config_keys`` is deliberately *not* a read: it only makes the
value part of a cache key, so a key listed there but never used would still do nothing.

Three explicit cases, each named here rather than found by the search:

- **the algorithm area's reader**: the advantage estimators take verl's ``config`` argument (any
  object or mapping) and read it with ``stages.algos.config_view.read_field(config, "<name>")``;
  that function serves the ``algorithm`` and ``algorithm.kl_ctrl`` sections only (its defaults
  table is theirs), so a literal name read through it counts for those two sections, whatever
  the variable is called (``read_field(config, "gamma")``);

- **read by field name**: ``PolicyLossSettings.from_actor`` and ``ActorLossTerms.from_actor``
  (``stages/algos``) copy every field of their dataclass from the actor slice with
  ``getattr(actor, field.name)`` (``policy_loss.*`` for the nested ones). Those fields count as
  read once the test has shown, with a sentinel value in each, that the settings object carries
  exactly the config's values.
- **single-valued fields**: a field whose type admits one value (``strategy: Literal["deepspeed"]``)
  cannot be set to something the code ignores; it is kept for verl's key set.

Each leaf is its own test case. A field that fails here is wired into the code, or removed from
the schema (then setting it is an error that names it) and documented in docs/differences.md.
There is no allow-list: every field passes, or the suite fails.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import textwrap
import typing
from collections import defaultdict
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import pytest
from pydantic import BaseModel

from stages.config import PPORunConfig, load_config
from stages.config.errors import nested_model

REPO = Path(__file__).resolve().parents[2]
SOURCE_DIRS = ("dataproto", "stages", "flows")
NOT_READERS = {
    "stages/config/checks.py",
    "stages/config/checks_dapo.py",
    "stages/config/aliases.py",
    "stages/config/errors.py",
    "stages/config/render.py",
}
BY_NAME_READERS = {"getattr", "read_field"}
#: readers by literal name that serve one area whatever the parent is called: the algorithm
#: estimators and KL controllers take ``config`` (verl's API) and read it with
#: ``stages.algos.config_view.read_field``, whose defaults table is the algorithm area's
AREA_READERS = {"read_field": ("AlgorithmConfig", "KlCtrlConfig")}
#: readers of a whole dotted path: ``config_value(config, "ppoflow.artifact_digest")``
PATH_READERS = {"config_value"}

Leaf = tuple[str, type[BaseModel], str]  # (dotted path, owning class, field name)
Owner = tuple[str, str]  # ("name", parent attribute name) or ("class", section class name)


def leaves(model: type[BaseModel] = PPORunConfig, prefix: str = "") -> Iterator[Leaf]:
    """Every leaf field: (dotted path, the class that declares it, its name)."""
    for name, field in model.model_fields.items():
        section = nested_model(field.annotation)
        if section is None:
            yield prefix + name, model, name
        else:
            yield from leaves(section, f"{prefix}{name}.")


@cache
def parent_names() -> dict[type[BaseModel], set[str]]:
    """Section class → the attribute names it is held under (``OptimConfig`` → {"optim"})."""
    names: dict[type[BaseModel], set[str]] = defaultdict(set)

    def visit(model: type[BaseModel]) -> None:
        for name, field in model.model_fields.items():
            section = nested_model(field.annotation)
            if section is not None:
                names[section].add(name)
                visit(section)

    visit(PPORunConfig)
    return names


def section_classes() -> dict[str, type[BaseModel]]:
    return {cls.__name__: cls for cls in parent_names()}


# --- the syntax-tree search --------------------------------------------------------------------


def _terminal(node: ast.AST) -> str | None:
    """The last name of ``a.b.c`` (``c``) or of a bare name ``a``."""
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Name):
        return node.id
    return None


def _annotation_names(node: ast.AST | None) -> set[str]:
    """Class names in an annotation: ``DataConfig``, ``"DataConfig"``, ``A | B``, ``A | None``."""
    if node is None:
        return set()
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        try:
            return _annotation_names(ast.parse(node.value, mode="eval").body)
        except SyntaxError:
            return set()
    if isinstance(node, ast.BinOp):
        return _annotation_names(node.left) | _annotation_names(node.right)
    name = _terminal(node)
    return {name} if name else set()


class _Reads(ast.NodeVisitor):
    """Collects (owner, attribute) pairs, resolving names bound to sections in each function."""

    def __init__(self, classes: set[str]) -> None:
        self.classes = classes
        self.reads: set[tuple[Owner, str]] = set()
        self.paths: set[str] = set()
        self.scopes: list[dict[str, set[Owner]]] = [{}]

    def _owners(self, node: ast.AST) -> set[Owner]:
        if isinstance(node, ast.IfExp):
            return self._owners(node.body) | self._owners(node.orelse)
        name = _terminal(node)
        if name is None:
            return set()
        owners: set[Owner] = {("name", name)}
        if isinstance(node, ast.Name):
            for scope in self.scopes:
                owners |= scope.get(name, set())
        return owners

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        scope: dict[str, set[Owner]] = {}
        arguments = node.args
        for arg in [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs]:
            found = _annotation_names(arg.annotation) & self.classes
            if found:
                scope[arg.arg] = {("class", name) for name in found}
        self.scopes.append(scope)
        self.generic_visit(node)
        self.scopes.pop()

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Assign(self, node: ast.Assign) -> None:
        owners = self._owners(node.value) if not isinstance(node.value, ast.Call) else set()
        for target in node.targets:
            if isinstance(target, ast.Name) and owners:
                self.scopes[-1].setdefault(target.id, set()).update(owners)
        self.generic_visit(node)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        found = _annotation_names(node.annotation) & self.classes
        if isinstance(node.target, ast.Name) and found:
            self.scopes[-1].setdefault(node.target.id, set()).update(("class", c) for c in found)
        self.generic_visit(node)

    def visit_Attribute(self, node: ast.Attribute) -> None:
        for owner in self._owners(node.value):
            self.reads.add((owner, node.attr))
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        args, function = node.args, _terminal(node.func)
        literal = (
            args[1].value
            if len(args) >= 2
            and isinstance(args[1], ast.Constant)
            and isinstance(args[1].value, str)
            else None
        )
        if literal is not None and function in BY_NAME_READERS:
            for owner in self._owners(args[0]):
                self.reads.add((owner, literal))
        if literal is not None and function in AREA_READERS:
            self.reads |= {(("class", area), literal) for area in AREA_READERS[function]}
        if literal is not None and function in PATH_READERS:
            self.paths.add(literal)
        self.generic_visit(node)


def source_files() -> list[Path]:
    files = []
    for directory in SOURCE_DIRS:
        for path in sorted((REPO / directory).rglob("*.py")):
            relative = path.relative_to(REPO).as_posix()
            is_schema = relative.startswith("stages/config/schema_")
            if not is_schema and relative not in NOT_READERS:
                files.append(path)
    return files


@cache
def _visited() -> _Reads:
    visitor = _Reads(set(section_classes()))
    for path in source_files():
        visitor.scopes = [{}]
        visitor.visit(ast.parse(path.read_text(encoding="utf-8"), filename=str(path)))
    return visitor


def code_reads() -> frozenset[tuple[Owner, str]]:
    """Every (owner, attribute) the non-schema code reads."""
    return frozenset(_visited().reads)


def path_reads() -> frozenset[str]:
    """Dotted paths read whole by a path reader (``config_value``)."""
    return frozenset(_visited().paths)


def owners_of(cls: type[BaseModel]) -> set[Owner]:
    return {("name", name) for name in parent_names()[cls]} | {("class", cls.__name__)}


def is_read(cls: type[BaseModel], field: str) -> bool:
    return any((owner, field) in code_reads() for owner in owners_of(cls))


def method_reads(cls: type[BaseModel]) -> dict[str, set[str]]:
    """Method / property name → the ``self.<field>`` it reads, over the class and its bases
    (validators excluded: they check, they do not use)."""
    found: dict[str, set[str]] = {}
    for base in cls.__mro__:
        if not (isinstance(base, type) and issubclass(base, BaseModel)) or base is BaseModel:
            continue
        tree = ast.parse(textwrap.dedent(inspect.getsource(base)))
        for node in tree.body[0].body:
            if not isinstance(node, ast.FunctionDef):
                continue
            decorators = {
                _terminal(d.func if isinstance(d, ast.Call) else d) for d in node.decorator_list
            }
            if decorators & {"field_validator", "model_validator"}:
                continue
            reads = {
                n.attr
                for n in ast.walk(node)
                if isinstance(n, ast.Attribute)
                and isinstance(n.value, ast.Name)
                and n.value.id == "self"
            }
            found.setdefault(node.name, set()).update(reads)
    return found


def read_through_methods(cls: type[BaseModel], field: str) -> bool:
    return any(field in reads and is_read(cls, name) for name, reads in method_reads(cls).items())


# --- read by field name (checked by behaviour) ---------------------------------------------------


def _sentinel_copy(section: BaseModel, names: list[str], tag: str) -> tuple[BaseModel, dict]:
    """A copy of ``section`` whose ``names`` hold unique sentinel strings (no validation)."""
    sentinels = {name: f"<{tag}.{name}>" for name in names}
    return section.model_copy(update=sentinels), sentinels


@cache
def by_name_reads() -> frozenset[str]:
    """Dotted paths that the by-name readers are shown to copy, sentinel by sentinel."""
    from stages.algos.actor_loss import ActorLossTerms
    from stages.algos.policy_loss_config import NESTED_POLICY_LOSS_FIELDS, PolicyLossSettings

    actor = load_config(None).actor_rollout_ref.actor
    prefix = "actor_rollout_ref.actor."
    shown: set[str] = set()
    for settings_type in (PolicyLossSettings, ActorLossTerms):
        names = [
            f.name
            for f in dataclasses.fields(settings_type)
            if f.name in type(actor).model_fields or f.name in NESTED_POLICY_LOSS_FIELDS
        ]
        nested = [
            n for n in names if n in NESTED_POLICY_LOSS_FIELDS and n not in type(actor).model_fields
        ]
        top = [n for n in names if n not in nested]
        policy_loss, nested_values = _sentinel_copy(actor.policy_loss, nested, "policy_loss")
        copied, top_values = _sentinel_copy(actor, top, "actor")
        copied = copied.model_copy(update={"policy_loss": policy_loss})
        settings = settings_type.from_actor(copied)
        for name, value in {**top_values, **nested_values}.items():
            assert getattr(settings, name) == value, f"{settings_type.__name__}.{name}"
        shown |= {prefix + n for n in top} | {f"{prefix}policy_loss.{n}" for n in nested}
    return frozenset(shown)


def is_single_valued(cls: type[BaseModel], field: str) -> bool:
    annotation = cls.model_fields[field].annotation
    return typing.get_origin(annotation) is typing.Literal and len(typing.get_args(annotation)) == 1


# --- the tests -----------------------------------------------------------------------------------


def is_read_anywhere(path: str, cls: type[BaseModel], field: str) -> bool:
    return (
        is_read(cls, field)
        or path in path_reads()
        or read_through_methods(cls, field)
        or path in by_name_reads()
        or is_single_valued(cls, field)
    )


def _leaf_cases() -> list:
    return [
        pytest.param(
            path,
            cls,
            field,
            id=path,
        )
        for path, cls, field in leaves()
    ]


@pytest.mark.parametrize(("path", "cls", "field"), _leaf_cases())
def test_config_field_is_read_by_the_code(path, cls, field):
    assert is_read_anywhere(path, cls, field), (
        f"{path} is accepted by the schema but read by no code outside it, so setting it "
        f"silently does nothing: wire it into the code that should use it (read through "
        f"{sorted(parent_names()[cls])}.{field}), or remove it from the schema and say so in "
        "docs/differences.md"
    )


def test_the_walk_sees_every_leaf_and_the_search_is_keyed_on_the_parent():
    """The walk covers the whole schema; a field name alone, or a dotted path in config_keys or a
    docstring, is not a read."""
    paths = [path for path, _, _ in leaves()]
    assert len(paths) == len(set(paths)) > 150
    assert (
        "actor_rollout_ref.actor.optim.num_cycles" in paths and "critic.optim.num_cycles" in paths
    )
    assert (("name", "optim"), "num_cycles") in code_reads()
    visitor = _Reads(set(section_classes()))
    visitor.visit(
        ast.parse(
            'KEYS = ("data.validation_shuffle",)\n'
            '"""data.validation_shuffle in a docstring"""\n'
            "x = tensor.device, tokenizer.name, batch.validation_shuffle\n"
        )
    )
    from stages.config.schema_data import DataConfig
    from stages.config.schema_trainer import TrainerConfig

    found = {attr for owner, attr in visitor.reads if owner in owners_of(DataConfig)}
    found |= {attr for owner, attr in visitor.reads if owner in owners_of(TrainerConfig)}
    assert not found and not visitor.paths  # none of these is a read of data.* or trainer.*


def test_aliases_annotations_and_methods_count_only_for_their_section():
    visitor = _Reads(set(section_classes()))
    visitor.visit(
        ast.parse(
            "def f(data: DataConfig, other):\n"
            "    source = rollout.val_kwargs if flag else rollout\n"
            "    return data.seed, source.top_p, other.shuffle, getattr(kl_ctrl, 'horizon')\n"
        )
    )
    assert (("class", "DataConfig"), "seed") in visitor.reads
    assert (("name", "val_kwargs"), "top_p") in visitor.reads
    assert (("name", "rollout"), "top_p") in visitor.reads
    assert (("name", "kl_ctrl"), "horizon") in visitor.reads
    assert not any(
        owner[1] in {"data", "DataConfig"} and attr == "shuffle" for owner, attr in visitor.reads
    )
    from stages.config.schema_actor import OptimConfig

    assert {"lr_warmup_steps", "lr_warmup_steps_ratio"} <= method_reads(OptimConfig)["warmup_steps"]
