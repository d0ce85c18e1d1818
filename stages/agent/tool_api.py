"""verl 0.9.1's tool interface (``verl.tools.base_tool.BaseTool``, ``verl.tools.schemas``), in
the standard library only, so the tool sandbox's processes hold nothing else.

A tool is built as ``Tool(config, tool_schema)`` and the agent loop drives one instance per
call, as verl's ``ToolAgentLoop._call_tool`` does::

    instance_id, _ = await tool.create(create_kwargs=tools_kwargs[name].get("create_kwargs", {}))
    try:
        response, reward, metrics = await tool.execute(instance_id, parameters)
    finally:
        await tool.release(instance_id)

``calc_reward`` is part of the interface but the loop never calls it (a tool uses it inside its
own ``execute``, as verl's gsm8k tool does). In ppoflow each call runs in a fresh process of the
tool sandbox (:mod:`stages.agent.sandbox`), so nothing a tool keeps between calls survives.

Differences from verl: :class:`ToolResponse` holds text only (verl's ``image`` / ``video`` lists
are not supported: a response that carries one is that call's error), and the schema is the
small stdlib :class:`OpenAIFunctionToolSchema` below, not verl's pydantic model (same attribute
names: ``tool_schema.function.name``, ``model_dump()``).

Example:
    >>> import asyncio
    >>> class Echo(BaseTool):
    ...     async def execute(self, instance_id, parameters, **kwargs):
    ...         return ToolResponse(text=parameters["text"]), None, {}
    >>> schema = {"type": "function", "function": {"name": "echo", "description": "Echo."}}
    >>> tool = Echo({"type": "native"}, schema)
    >>> tool.name
    'echo'
    >>> async def one_call():
    ...     instance_id, _ = await tool.create()
    ...     response, reward, metrics = await tool.execute(instance_id, {"text": "hi"})
    ...     await tool.release(instance_id)
    ...     return response.text, reward
    >>> asyncio.run(one_call())
    ('hi', None)
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

ExecuteResult = tuple["ToolResponse", "float | None", "dict[str, Any] | None"]


@dataclass
class ToolResponse:
    """What a tool call gives the model: the text of its tool turn."""

    text: str = ""


@dataclass(frozen=True)
class OpenAIFunctionSchema:
    """``function`` of an OpenAI tool schema: name, description, JSON-schema parameters."""

    name: str
    description: str = ""
    parameters: dict[str, Any] = field(
        default_factory=lambda: {"type": "object", "properties": {}, "required": []}
    )
    strict: bool = False


@dataclass(frozen=True, eq=False)
class OpenAIFunctionToolSchema:
    """An OpenAI tool schema ``{"type": "function", "function": {...}}``.

    ``raw`` is the dict as written in the tool config; :meth:`model_dump` returns it (verl renders
    ``model_dump(exclude_unset=True, exclude_none=True)`` into the chat template: what was set).
    """

    type: str
    function: OpenAIFunctionSchema
    raw: dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_dict(cls, schema: dict[str, Any]) -> OpenAIFunctionToolSchema:
        """The schema of a plain dict (``ValueError`` when ``function.name`` is missing)."""
        function = schema.get("function")
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise ValueError(f"a tool schema needs function.name (a str), got {schema!r:.200}")
        known = {k: function[k] for k in ("description", "parameters", "strict") if k in function}
        return cls(
            str(schema.get("type", "function")),
            OpenAIFunctionSchema(function["name"], **known),
            dict(schema),
        )

    def model_dump(self, **_: Any) -> dict[str, Any]:
        """The schema as a dict, as written (keyword arguments of pydantic's are accepted)."""
        if self.raw:
            return dict(self.raw)
        function = self.function
        return {
            "type": self.type,
            "function": {
                "name": function.name,
                "description": function.description,
                "parameters": function.parameters,
            },
        }


class BaseTool:
    """verl's base tool: ``name`` comes from the schema; subclasses override :meth:`execute`.

    Args:
        config: the item's ``config:`` mapping from the tool config (``type: native`` included,
            as verl passes it).
        tool_schema: the item's ``tool_schema:`` (a dict or :class:`OpenAIFunctionToolSchema`);
            None: :meth:`get_openai_tool_schema` must supply one (a subclass's default).
    """

    def __init__(
        self, config: dict[str, Any], tool_schema: OpenAIFunctionToolSchema | dict | None
    ) -> None:
        self.config = config
        if isinstance(tool_schema, dict):
            tool_schema = OpenAIFunctionToolSchema.from_dict(tool_schema)
        self.tool_schema = tool_schema or self.get_openai_tool_schema()
        if self.tool_schema is None:
            raise ValueError(f"{type(self).__name__} has no tool schema: pass tool_schema")
        self.name = self.tool_schema.function.name

    def get_openai_tool_schema(self) -> OpenAIFunctionToolSchema | None:
        """The tool's schema (a subclass may return a default one when none was configured)."""
        return getattr(self, "tool_schema", None)

    async def create(
        self, instance_id: str | None = None, **kwargs: Any
    ) -> tuple[str, ToolResponse]:
        """Start an instance (the loop passes ``create_kwargs=``); returns its id (a new uuid4
        when none is given) and a creation response, empty here."""
        return (instance_id if instance_id is not None else str(uuid.uuid4())), ToolResponse()

    async def execute(
        self, instance_id: str, parameters: dict[str, Any], **kwargs: Any
    ) -> ExecuteResult:
        """Run the call with the model's ``parameters``; returns ``(response, reward, metrics)``:
        ``reward`` the step reward (None: none), ``metrics`` a dict of plain data (or None).
        Subclasses implement it; this base answers as verl's does ("Updated the tool state.",
        0.0, {}), so a verl tool that relies on it behaves the same."""
        return ToolResponse(text="Updated the tool state."), 0.0, {}

    async def calc_reward(self, instance_id: str, **kwargs: Any) -> float:
        """The instance's reward; 0.0 here (the agent loop never calls it)."""
        return 0.0

    async def release(self, instance_id: str, **kwargs: Any) -> None:
        """Free the instance; nothing to free here."""
