"""``lookup_word``: the demo agent task's call format, a turn that is one word (`TOOL_PARSERS`).

This is not a format any pretrained model writes. It exists for the built-in multi-turn demo
(:mod:`stages.data.demo_agent_task`), where a *randomly initialised* tiny model must find the
call by RL alone: hermes' ``<tool_call>{"name": "lookup", "arguments": {"key": "c"}}</tool_call>``
is 57 characters, one token each with the tiny byte-level tokenizer, and no sampled turn of a
random policy comes near it. Here the call is the key and the end of the turn: ``c<|endoftext|>``.

=============  ================================================================================
name           what a call looks like
=============  ================================================================================
lookup_word    a whole turn that is one word (``\\w+``: letters, digits, ``_``), then only
               special tokens such as the end-of-turn token, calls the tool named ``lookup``
               with ``{"key": "<word>"}``
=============  ================================================================================

Rules: the turn's text (special tokens kept, as the agent loop decodes it) is stripped of
trailing ``<|...|>`` tokens and surrounding whitespace; one word is one call, anything else is
plain content with no call (nothing is ever malformed). The tool's name and its parameter's name
are fixed by the format (``lookup``, ``key``): use it with a tool called ``lookup`` that takes
``key``. A turn limit (``multi_turn.max_assistant_turns``) is what lets a one-word *answer* end
the conversation: the loop stops before it parses the last allowed turn.

Example:
    >>> turn = TOOL_PARSERS.get("lookup_word").parse("c<|endoftext|>")
    >>> turn.calls[0].name, turn.calls[0].arguments, turn.content, turn.malformed
    ('lookup', '{"key": "c"}', '', 0)
"""

from __future__ import annotations

import json
import re

from stages.agent.parsers import TOOL_PARSERS, FunctionCall, ParsedTurn, ToolParserSpec

TOOL_NAME, ARGUMENT = "lookup", "key"
_WORD = re.compile(r"\w+")
_TRAILING_SPECIALS = re.compile(r"(?:<\|[^|<>]*\|>)+\s*$")


def called_key(text: str) -> str | None:
    """The key a turn's text calls ``lookup`` with, or None when it is not one word.

    Example:
        >>> called_key("c<|endoftext|>"), called_key(" ab "), called_key("c?"), called_key("")
        ('c', 'ab', None, None)
    """
    word = _TRAILING_SPECIALS.sub("", text).strip()
    return word if _WORD.fullmatch(word) else None


def parse_lookup_word(text: str) -> ParsedTurn:
    """A one-word turn as a ``lookup`` call (module docstring for the rules).

    Example:
        >>> parse_lookup_word("hello world<|endoftext|>")
        ParsedTurn(content='hello world<|endoftext|>', calls=(), malformed=0)
    """
    key = called_key(text)
    if key is None:
        return ParsedTurn(content=text, calls=(), malformed=0)
    arguments = json.dumps({ARGUMENT: key}, ensure_ascii=False)
    return ParsedTurn(content="", calls=(FunctionCall(TOOL_NAME, arguments),), malformed=0)


TOOL_PARSERS.add(
    "lookup_word",
    ToolParserSpec(
        parse=parse_lookup_word,
        description="a one-word turn calls lookup(key=word) (the built-in agent demo's format)",
    ),
)
