"""Agent loops, looked up by a row's ``agent_name`` (else ``rollout.agent.default_agent_loop``).

verl 0.9.1 names its loops ``single_turn_agent`` (one generation) and ``tool_agent`` (assistant
turns alternating with tool turns, ``ToolAgentLoop``); ppoflow keeps the names, so a dataset whose
rows carry ``agent_name: tool_agent`` (verl's multi-turn preprocessing writes it) runs as written.
Each entry declares what it needs instead of being compared by name:

===================  ==========  ==============================================================
name                 uses_tools  turns
===================  ==========  ==============================================================
single_turn_agent    False       one assistant turn
tool_agent           True        assistant turns; after each, the calls it made run as tools and
                                 their results are appended, until a turn makes no call or a
                                 limit is reached
===================  ==========  ==============================================================

Example:
    >>> AGENT_LOOPS.get("tool_agent").uses_tools, AGENT_LOOPS.get("single_turn_agent").uses_tools
    (True, False)
"""

from __future__ import annotations

from dataclasses import dataclass

from stages.registry import Registry

#: the agent loop verl uses for rows without ``agent_name`` (rollout.agent.default_agent_loop)
SINGLE_TURN = "single_turn_agent"
#: the non-tensor column naming each row's agent loop (verl's dataset field)
AGENT_NAME_KEY = "agent_name"


@dataclass(frozen=True)
class AgentLoopSpec:
    """One ``AGENT_LOOPS`` entry.

    uses_tools: after an assistant turn, tool calls are parsed from it (``multi_turn.format``),
        run in the tool sandbox and appended as a tool turn; False: the trajectory ends after
        its first assistant turn.
    description: one line for ``ppoflow explain`` and error messages.
    """

    uses_tools: bool
    description: str


AGENT_LOOPS: Registry[AgentLoopSpec] = Registry("agent loop")
AGENT_LOOPS.add(
    SINGLE_TURN, AgentLoopSpec(False, "one assistant turn (verl's SingleTurnAgentLoop)")
)
AGENT_LOOPS.add(
    "tool_agent",
    AgentLoopSpec(True, "assistant and tool turns until no call or a limit (verl's ToolAgentLoop)"),
)
