"""A fixed key → value table as a tool: deterministic, instant, no state (a demo task's tool).

Config: ``table: {key: value}`` (keys compared as strings). Parameter: ``key``. The text is the
value (``str()``-ed), or ``unknown key``; no step reward.

Example:
    >>> import asyncio
    >>> schema = {"type": "function", "function": {"name": "lookup"}}
    >>> tool = LookupTool({"type": "native", "table": {"paris": "France", 7: 49}}, schema)
    >>> [asyncio.run(tool.execute("id", {"key": k}))[0].text for k in ("paris", 7, "rome")]
    ['France', '49', 'unknown key']
"""

from __future__ import annotations

from typing import Any

from stages.agent.tool_api import BaseTool, ToolResponse

UNKNOWN_KEY = "unknown key"


class LookupTool(BaseTool):
    """Answers ``key`` from ``config["table"]`` (module docstring).

    Raises:
        ValueError: the config has no ``table`` mapping.
    """

    def __init__(self, config: dict[str, Any], tool_schema: Any) -> None:
        super().__init__(config, tool_schema)
        table = config.get("table")
        if not isinstance(table, dict):
            raise ValueError(
                f"tool {self.name!r}: config.table is {type(table).__name__}; expected a mapping "
                "{key: value}"
            )
        self.table = {str(key): str(value) for key, value in table.items()}

    async def execute(
        self, instance_id: str, parameters: dict[str, Any], **kwargs: Any
    ) -> tuple[ToolResponse, None, dict]:
        value = self.table.get(str(parameters.get("key", "")), UNKNOWN_KEY)
        return ToolResponse(text=value), None, {}
