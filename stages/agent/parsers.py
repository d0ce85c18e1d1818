"""Tool-call parsers, looked up by ``actor_rollout_ref.rollout.multi_turn.format`` (verl's name).

A parser reads the text of one assistant turn (the caller decodes the sampled ids with special
tokens kept, as verl does) and returns a `ParsedTurn`: the text left once the calls are cut out,
the calls in the order written, and how many call blocks were malformed. Every entry of
`TOOL_PARSERS` has the same signature, ``parse(text) -> ParsedTurn``, so the agent loop never
branches on the format's name.

=========  ====================================================================================
name       what a call looks like
=========  ====================================================================================
hermes     ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` (Qwen2.5/Qwen3,
           NousResearch Hermes; verl 0.9.1's ``HermesToolParser``)
=========  ====================================================================================

A malformed block is one between the tags that is not a JSON object with a str ``name`` and an
``arguments`` key. verl logs and skips it; ppoflow skips it too and counts it in
``ParsedTurn.malformed``, so the rollout can report how often the policy writes broken calls.

Example:
    >>> turn = TOOL_PARSERS.get("hermes").parse(
    ...     'Let me look.<tool_call>{"name": "search", "arguments": {"q": "pi"}}</tool_call>')
    >>> turn.content, turn.calls[0].name, turn.calls[0].arguments, turn.malformed
    ('Let me look.', 'search', '{"q": "pi"}', 0)
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass

from stages.registry import Registry

#: the format verl uses when ``multi_turn.format`` is not set
DEFAULT_FORMAT = "hermes"


@dataclass(frozen=True)
class FunctionCall:
    """One call the model wrote (verl's ``FunctionCall``).

    name: the function's name as written.
    arguments: JSON text of the call's arguments: ``json.loads(arguments)`` gives back the value
        the model wrote (a dict for a well-formed call). It is not checked against the tool's
        schema; the tool validates it.
    tool_call_id: the identifier the model wrote for the call, when the format has one; None
        otherwise (hermes has none).
    """

    name: str
    arguments: str
    tool_call_id: str | None = None


@dataclass(frozen=True)
class ParsedTurn:
    """What a parser read from one assistant turn.

    content: the turn's text with every call block removed (not stripped).
    calls: the well-formed calls, in the order they were written.
    malformed: call blocks that were skipped because they could not be read as a call.
    """

    content: str
    calls: tuple[FunctionCall, ...]
    malformed: int


@dataclass(frozen=True)
class ToolParserSpec:
    """One ``TOOL_PARSERS`` entry.

    parse: the turn's decoded text (special tokens kept) → `ParsedTurn`.
    description: one line for ``ppoflow explain`` and error messages.
    """

    parse: Callable[[str], ParsedTurn]
    description: str


TOOL_PARSERS: Registry[ToolParserSpec] = Registry("tool parser (multi_turn.format)")

HERMES_START, HERMES_END = "<tool_call>", "</tool_call>"
_HERMES_BLOCK = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)


def _hermes_call(block: str) -> FunctionCall | None:
    """The call one ``<tool_call>`` block holds, or None when it is not a well-formed call."""
    try:
        obj = json.loads(block)
    except json.JSONDecodeError:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or "arguments" not in obj:
        return None
    return FunctionCall(
        name=obj["name"], arguments=json.dumps(obj["arguments"], ensure_ascii=False)
    )


def parse_hermes(text: str) -> ParsedTurn:
    """Hermes tool calls: JSON objects between ``<tool_call>`` and ``</tool_call>``.

    verl 0.9.1 semantics (``HermesToolParser.extract_tool_calls``):

    - a text without ``<tool_call>`` or without ``</tool_call>`` has no calls and nothing is
      malformed (a block the model left unclosed is plain content);
    - otherwise each non-greedy match of ``<tool_call>(.*?)</tool_call>`` (across newlines) must
      be a JSON object with a str ``name`` and an ``arguments`` key; ``arguments`` is re-dumped
      with ``json.dumps(..., ensure_ascii=False)``, whatever its JSON type: an ``arguments``
      written as a string is re-dumped as a JSON string (``'"{\\"q\\": 1}"'``), as verl does,
      so ``json.loads(call.arguments)`` is always exactly what the model wrote;
    - a match that fails is skipped and counted in ``malformed``;
    - ``content`` is the text with every match (tags included) removed, not stripped.

    Example:
        >>> parse_hermes('<tool_call>{"name": "f", "arguments": {"city": "Zürich"}}</tool_call>'
        ...              '<tool_call>{"name": "g"}</tool_call> done')
        ParsedTurn(content=' done', calls=(FunctionCall(name='f', arguments='{"city": "Zürich"}', tool_call_id=None),), malformed=1)
        >>> parse_hermes("no calls <tool_call>{")
        ParsedTurn(content='no calls <tool_call>{', calls=(), malformed=0)
    """
    if HERMES_START not in text or HERMES_END not in text:
        return ParsedTurn(content=text, calls=(), malformed=0)
    parsed = [_hermes_call(block) for block in _HERMES_BLOCK.findall(text)]
    calls = tuple(call for call in parsed if call is not None)
    return ParsedTurn(
        content=_HERMES_BLOCK.sub("", text), calls=calls, malformed=len(parsed) - len(calls)
    )


TOOL_PARSERS.add(
    "hermes",
    ToolParserSpec(
        parse=parse_hermes,
        description='<tool_call>{"name": ..., "arguments": {...}}</tool_call> (Qwen2.5/Qwen3, Hermes)',
    ),
)

import stages.agent.parsers_compact  # noqa: E402,F401  registers lookup_query (the agent demo)
