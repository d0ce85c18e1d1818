"""verl's tool-config YAML (``multi_turn.tool_config_path``): which tool classes a rollout may call.

The file holds a top-level ``tools:`` list; each item names a class and its schema, as in verl::

    tools:
      - class_name: "verl.tools.gsm8k_tool.Gsm8kTool"
        config:
          type: native
        tool_schema:
          type: "function"
          function:
            name: "calc_gsm8k_reward"
            description: "A tool for calculating the reward of gsm8k."
            parameters:
              type: "object"
              properties:
                answer: {type: "string", description: "The model's answer"}
              required: ["answer"]

:func:`load_tool_config` reads it into :class:`ToolSpec` values, checking the shape (``type:
native`` is the only type; verl's ``mcp`` is not supported); every problem is a ``ValueError`` of
one line naming the file, the item and what would be right. A verl class that ppoflow provides
(:data:`VERL_TOOL_CLASSES`) maps to ppoflow's own, so verl's files load as written; any other
dotted path is a user class, duck-typed (``create`` / ``execute`` / ``release``, sync or async;
``calc_reward`` is never called). Loading imports no tool: user code is imported in the tool
sandbox's zygote at its start-up (:func:`check_tool_classes`, :mod:`stages.agent.sandbox`), so a
class that is missing, or whose import hangs, is one line at start-up, never in this process.

This module imports only the standard library (``yaml`` when a file is loaded): the sandbox's
zygote imports it.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: verl's dotted class names that ppoflow implements itself
VERL_TOOL_CLASSES: Mapping[str, str] = {
    "verl.tools.gsm8k_tool.Gsm8kTool": "stages.agent.tools.gsm8k.Gsm8kTool",
    "verl.tools.sandbox_fusion_tools.SandboxFusionTool": (
        "stages.agent.tools.python_exec.PythonExecTool"
    ),
}
TOOL_TYPES = ("native",)
ITEM_KEYS = ("class_name", "config", "tool_schema")
CALLED_METHODS = ("create", "execute", "release")  # what the agent loop calls, per call
_EXAMPLE_CLASS = "verl.tools.gsm8k_tool.Gsm8kTool"


@dataclass(frozen=True)
class ToolSpec:
    """One tool of the config.

    name: the schema's ``function.name``: what the model calls.
    class_name: the dotted class path as written (a verl name is mapped at resolution).
    config: the item's ``config:`` mapping, as written (``type`` included), plain data.
    schema: the OpenAI function schema as written (a plain dict): what the chat template lists.
    origin: where it was declared (``<file>: tools[i]``), for messages.
    """

    name: str
    class_name: str
    config: dict[str, Any]
    schema: dict[str, Any]
    origin: str = field(default="", compare=False)


def load_tool_config(path: str | Path) -> tuple[ToolSpec, ...]:
    """The tools of the YAML file at ``path``, in file order.

    Raises:
        ValueError: one line naming the file, the item and what is expected, for a missing file,
            invalid YAML, no top-level ``tools:`` list, an item without ``class_name``, a
            ``config.type`` other than ``native``, a schema without ``function.name``, config
            that is not plain data, or two tools with the same name.
    """
    import yaml

    source = Path(path)
    if not source.is_file():
        raise ValueError(
            f"tools config {source}: no such file; give a YAML file with a top-level 'tools:' list"
        )
    try:
        document = yaml.safe_load(source.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise ValueError(f"tools config {source}: not valid YAML ({_one_line(exc)})") from None
    items = document.get("tools") if isinstance(document, dict) else None
    if not isinstance(items, list) or not items:
        raise ValueError(
            f"tools config {source}: expected a top-level 'tools:' list of one or more tools, "
            f"got {_kind(items if isinstance(document, dict) else document)}"
        )
    specs: list[ToolSpec] = []
    for index, item in enumerate(items):
        spec = _spec(item, f"{source}: tools[{index}]")
        for earlier in specs:
            if earlier.name == spec.name:
                raise ValueError(
                    f"{spec.origin}: the tool name {spec.name!r} is already used by "
                    f"{earlier.origin.rsplit(': ', 1)[-1]}; tool names must be unique"
                )
        specs.append(spec)
    return tuple(specs)


def _spec(item: Any, origin: str) -> ToolSpec:
    """One item of ``tools:`` checked (``origin``: ``<file>: tools[i]``)."""
    if not isinstance(item, dict):
        raise ValueError(
            f"{origin} is {_kind(item)}; expected a mapping with {', '.join(ITEM_KEYS)}"
        )
    unknown = sorted(str(key) for key in item if key not in ITEM_KEYS)
    if unknown:
        raise ValueError(f"{origin} has unknown keys {unknown}; an item has {', '.join(ITEM_KEYS)}")
    class_name = item.get("class_name")
    if not isinstance(class_name, str) or "." not in class_name.strip(".") or " " in class_name:
        raise ValueError(
            f"{origin}: class_name is {_kind(class_name)}; expected a dotted class path such as "
            f"{_EXAMPLE_CLASS!r}"
        )
    config = item.get("config")
    if not isinstance(config, dict):
        raise ValueError(
            f"{origin} ({class_name}): config is {_kind(config)}; expected a mapping with "
            "type: native (and the tool's own settings)"
        )
    if config.get("type") not in TOOL_TYPES:
        raise ValueError(
            f"{origin} ({class_name}): config.type is {_kind(config.get('type'))}; expected "
            "'native' (the only tool type ppoflow runs; verl's 'mcp' tools are not supported)"
        )
    where = _not_plain(config, "config")
    if where:
        raise ValueError(f"{origin} ({class_name}): {where}; config holds plain YAML data only")
    schema = item.get("tool_schema")
    return ToolSpec(
        _schema_name(schema, f"{origin} ({class_name})"), class_name, config, schema, origin
    )


def _schema_name(schema: Any, where: str) -> str:
    """The function name of a checked ``tool_schema`` (``where``: the item, for messages)."""
    if not isinstance(schema, dict):
        raise ValueError(
            f"{where}: tool_schema is {_kind(schema)}; expected {{type: function, function: "
            "{name, description, parameters}} (its function.name is what the model calls)"
        )
    function = schema.get("function")
    name = function.get("name") if isinstance(function, dict) else None
    if not isinstance(name, str) or not name.strip():
        raise ValueError(
            f"{where}: tool_schema.function.name is {_kind(name)}; expected the tool's name, "
            "a non-empty string"
        )
    parameters = function.get("parameters", {"properties": {}})
    properties = parameters.get("properties") if isinstance(parameters, dict) else None
    if not isinstance(properties, dict):
        raise ValueError(
            f"{where}: tool_schema.function.parameters.properties is {_kind(properties)}; "
            "expected {type: object, properties: {<name>: {type, description}}, required: [...]}"
        )
    required = parameters.get("required", [])
    if not isinstance(required, list) or any(r not in properties for r in required):
        raise ValueError(
            f"{where}: tool_schema.function.parameters.required is {required!r}; expected a "
            f"list of names among the properties {sorted(properties)}"
        )
    return name


def tool_schemas(specs: Iterable[ToolSpec]) -> list[dict[str, Any]]:
    """The schemas the chat template lists (``tools=`` of ``apply_chat_template``), in order."""
    return [spec.schema for spec in specs]


def resolve_tool_class(
    class_name: str, provided: Mapping[str, str] = VERL_TOOL_CLASSES, kind: str = "tool"
) -> type:
    """The class ``class_name`` names, importing its module (a verl name in ``provided`` maps
    to ppoflow's; ``kind`` names what it is in messages: ``tool``, ``interaction``).

    Raises:
        ValueError: one line: a verl class ppoflow does not provide, a module that cannot be
            imported (with its error), or a module without that class.
    """
    target = provided.get(class_name, class_name)
    module_name, _, attribute = target.rpartition(".")
    if class_name.startswith("verl.") and class_name not in provided:
        raise ValueError(
            f"class_name {class_name!r} is a verl {kind} ppoflow does not provide (verl is not "
            f"installed); ppoflow provides {sorted(provided)}, or write your own class "
            "with the same methods"
        )
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        raise ValueError(
            f"class_name {class_name!r}: module {module_name!r} cannot be imported "
            f"({type(exc).__name__}: {_one_line(exc)})"
        ) from None
    cls = getattr(module, attribute, None)
    if not isinstance(cls, type):
        raise ValueError(
            f"class_name {class_name!r}: module {module_name!r} has no class {attribute!r} "
            f"(found {_kind(cls)})"
        )
    return cls


def check_tool_classes(specs: Iterable[ToolSpec]) -> dict[str, type]:
    """Import every spec's class (in the sandbox's zygote) and check the methods the loop calls.

    Returns ``{class_name: class}``. Raises ``ValueError``, one line naming the item, for a class
    that cannot be resolved (:func:`resolve_tool_class`) or lacks ``create`` / ``execute`` /
    ``release``.
    """
    classes: dict[str, type] = {}
    for spec in specs:
        try:
            cls = resolve_tool_class(spec.class_name)
        except ValueError as exc:
            raise ValueError(f"{spec.origin or spec.name}: {exc}") from None
        missing = [m for m in CALLED_METHODS if not callable(getattr(cls, m, None))]
        if missing:
            raise ValueError(
                f"{spec.origin or spec.name}: class {spec.class_name!r} lacks {missing}; a tool "
                f"class has {', '.join(CALLED_METHODS)} (sync or async), as verl's BaseTool"
            )
        classes[spec.class_name] = cls
    return classes


def _not_plain(value: Any, where: str) -> str:
    """Where ``value`` holds something other than YAML's plain data ('' when nothing)."""
    if value is None or type(value) in (str, int, float, bool):
        return ""
    if type(value) is list:
        return next((w for i, v in enumerate(value) if (w := _not_plain(v, f"{where}[{i}]"))), "")
    if type(value) is dict:
        for key, item in value.items():
            if type(key) is not str:
                return f"{where} has the key {key!r}, which is not a string"
            found = _not_plain(item, f"{where}.{key}")
            if found:
                return found
        return ""
    return f"{where} is a {type(value).__name__}"


def _kind(value: Any) -> str:
    """``missing`` for None, else the value's repr (cut) and its type."""
    if value is None:
        return "missing"
    text = repr(value)
    return f"{text[:60]}{'…' if len(text) > 60 else ''} ({type(value).__name__})"


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())


__all__ = [
    "CALLED_METHODS",
    "VERL_TOOL_CLASSES",
    "ToolSpec",
    "check_tool_classes",
    "load_tool_config",
    "resolve_tool_class",
    "tool_schemas",
]
