"""``actor_rollout_ref.rollout.multi_turn.*`` and ``…rollout.agent.*``: agentic rollouts.

Key names, defaults and meanings are verl 0.9.1's, with two deliberate differences:

- ``multi_turn.enable: true`` makes ``tool_agent`` the loop of rows without an ``agent_name``
  (verl reads ``enable`` nowhere in its agent loop, so such rows silently run single-turn);
- ``multi_turn.sandbox.*`` (ppoflow-only) bounds each tool call: verl runs tools in its agent
  loop's own process, ppoflow in a supervised process of their own (``stages.agent.sandbox``).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, Field

from stages.agent.agents import AGENT_LOOPS, SINGLE_TURN
from stages.config._base import ConfigModel


def _agent_loop(name: str) -> str:
    from stages.config.choices import check_registered

    return check_registered(name, AGENT_LOOPS.names(), "agent loop")


AgentLoopName = Annotated[str, AfterValidator(_agent_loop)]


#: verl 0.9.1's other tool-call formats (``tool_parser.py``), refused by name
VERL_ONLY_PARSERS = (
    "gpt-oss",
    "qwen3_coder",
    "glm",
    "seed",
    "minimax",
    "kimi",
    "deepseek_v4",
    "gemma4",
)


def _tool_parser(name: str) -> str:
    from stages.agent.parsers import TOOL_PARSERS
    from stages.config.choices import check_registered

    unavailable = {
        other: f"verl's {other} parser is not in ppoflow (a ppoflow.plugins module can register it)"
        for other in VERL_ONLY_PARSERS
    }
    return check_registered(name, TOOL_PARSERS.names(), "tool-call parser", unavailable)


ToolParserName = Annotated[str, AfterValidator(_tool_parser)]


class ToolSandboxConfig(ConfigModel):
    """Limits of the processes that run tool calls [ppoflow-only]."""

    num_workers: int = Field(
        4, ge=1, description="Tool calls run at once, each in a process of its own (processes)"
    )
    timeout_s: float = Field(
        30.0, gt=0, description="Wall time of one tool call before its process is killed (s)"
    )
    memory_mb: int | None = Field(
        1024,
        ge=1,
        description="Address space a tool call's process may add; null = no bound (MiB)",
    )
    output_bytes: int = Field(
        1 << 20, ge=0, description="Printed output of the tool processes kept per turn (bytes)"
    )
    allow_network: bool = Field(False, description="Let tool calls open network connections (bool)")
    startup_timeout_s: float = Field(
        60.0, gt=0, description="Bound on importing the tool classes at start-up (s)"
    )


class MultiTurnConfig(ConfigModel):
    """verl's multi-turn tool loop (``ToolAgentLoop``) settings."""

    enable: bool = Field(
        False,
        description="Rows without agent_name run tool_agent [ppoflow: verl ignores it] (bool)",
    )
    max_assistant_turns: int | None = Field(
        None, ge=1, description="Stop after this many assistant turns; null = no limit (turns)"
    )
    max_user_turns: int | None = Field(
        None, ge=1, description="Stop after this many tool turns; null = no limit (turns)"
    )
    tool_config_path: str | None = Field(
        None, description="verl tool-config YAML (a top-level tools: list) (path)"
    )
    interaction_config_path: str | None = Field(
        None,
        description="verl's interaction config (a top-level interaction: list); rows name one in extra_info.interaction_kwargs (path)",
    )
    max_parallel_calls: int = Field(
        1,
        ge=1,
        description="Calls of one turn that run; later ones are dropped and counted (calls)",
    )
    max_tool_response_length: int = Field(
        256, ge=1, description="A tool result longer than this is truncated (characters)"
    )
    tool_response_truncate_side: Literal["left", "right", "middle"] = Field(
        "middle",
        description="left keeps the last characters, right the first, middle both ends (choice)",
    )
    format: ToolParserName = Field(
        "hermes",
        description="Tool-call format, a name in stages.agent.parsers.TOOL_PARSERS (choice)",
    )
    sandbox: ToolSandboxConfig = Field(
        default_factory=ToolSandboxConfig,
        description="Limits of the tool-call processes [ppoflow-only] (section)",
    )


class AgentConfig(ConfigModel):
    """verl's agent-loop selection."""

    default_agent_loop: AgentLoopName = Field(
        SINGLE_TURN,
        description="Agent loop of rows without agent_name, a name in stages.agent.agents.AGENT_LOOPS (choice)",
    )
