"""The token ids a tool turn appends to a multi-turn trajectory: a delta of the chat template.

In a multi-turn trajectory the ids the model sampled are kept verbatim; they are never decoded
and re-encoded, since re-tokenizing text need not give back the ids the policy's log-probs
belong to. What is appended after an assistant turn (mask 0) is

    boundary ids  (only when the turn ended with EOS)  +  tool messages  +  next assistant header

and it is computed from the chat template alone, by verl 0.9.1's "continuous token" method
(``verl/utils/tokenizer/continuous_token.py``):

- tool messages + header: render a synthetic prefix — system ``continuous token synthetic
  system``, user ``continuous token synthetic user``, an assistant with empty content and one
  tool call per tool message (the message's ``name`` and ``tool_call_id``, else dummies) —
  without the generation prompt, then the prefix followed by the tool messages with
  ``add_generation_prompt=True``; the delta is the second render's ids past the first's (the
  first must be a prefix of the second, else the template is not append-only there and
  ``ValueError`` is raised). Both renders get the tool schemas as ``tools=``.
- boundary: the model stops at its EOS token, but the template writes text after an assistant
  message's end (Qwen: ``"\\n"`` after ``<|im_end|>``). verl hard-codes that newline for the Qwen
  family; here it is found for any template (`template_boundary_ids`).

So, wherever the template is append-only, prompt ids + sampled ids + `ChatDelta.tool_turn_ids`
+ sampled ids + … equals the template's render of the whole conversation, tokenized. Text is
encoded with ``add_special_tokens=False``: the template holds every special token.

Example (the tiny tokenizer: ``<|role|>content``, assistant turns closed by EOS, no boundary):
    >>> from stages.data.tokenizer import build_tiny_tokenizer
    >>> tok = build_tiny_tokenizer()
    >>> delta = ChatDelta(tok, tools=None)
    >>> ids = delta.tool_turn_ids([{"role": "tool", "content": "42"}], turn_ended_with_eos=True)
    >>> tok.decode(ids), delta.boundary_ids
    ('<|tool|>42<|assistant|>', [])
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Sequence
from typing import Any

SYNTHETIC_SYSTEM = {"role": "system", "content": "continuous token synthetic system"}
SYNTHETIC_USER = {"role": "user", "content": "continuous token synthetic user"}
#: reasoning text of the synthetic assistant (as verl: thinking templates render it in the prefix)
SYNTHETIC_REASONING = "reasoning"
#: the tool name of a synthetic tool call whose tool message carries no ``name`` (verl's)
DUMMY_TOOL_NAME = "continuous_token_tool"
#: assistant content of the boundary probe, and the message rendered after it
PROBE_CONTENT = "continuous token probe"
PROBE_NEXT = {"role": "user", "content": "continuous token probe user"}
#: distinct (name, tool_call_id) groups whose prefix render is kept
PREFIX_CACHE_SIZE = 256

Messages = Sequence[dict[str, Any]]
Tools = list[dict[str, Any]] | None


def _template_label(tokenizer: Any) -> str:
    """The tokenizer's name and its chat template's short hash, for error messages."""
    name = getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__
    digest = hashlib.sha256(str(tokenizer.chat_template).encode()).hexdigest()[:12]
    return f"tokenizer {name!r} (chat_template sha256 {digest})"


def _require_chat_template(tokenizer: Any) -> None:
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError(
            f"multi-turn rollouts need a chat template, but tokenizer "
            f"{getattr(tokenizer, 'name_or_path', '') or type(tokenizer).__name__!r} has none; "
            "use a chat model's tokenizer or set its chat_template"
        )


def _render_text(tokenizer: Any, messages: Messages, tools: Tools, generation: bool) -> str:
    return tokenizer.apply_chat_template(
        list(messages), tools=tools, add_generation_prompt=generation, tokenize=False
    )


def _encode(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def _render_ids(tokenizer: Any, messages: Messages, tools: Tools, generation: bool) -> list[int]:
    return _encode(tokenizer, _render_text(tokenizer, messages, tools, generation))


def render_prompt_ids(tokenizer: Any, messages: Messages, tools: Tools) -> list[int]:
    """Ids of the first prompt of a trajectory: the chat template with the generation prompt.

    Args:
        messages: the prompt's chat messages.
        tools: the tool schemas (OpenAI function format) the template lists; None = no tools.

    Returns:
        The ids of ``apply_chat_template(messages, tools=tools, add_generation_prompt=True)``,
        encoded with ``add_special_tokens=False``. A tokenizer without a chat template raises
        ``ValueError``: multi-turn needs one.

    Example:
        >>> from stages.data.tokenizer import build_tiny_tokenizer
        >>> tok = build_tiny_tokenizer()
        >>> tok.decode(render_prompt_ids(tok, [{"role": "user", "content": "hi"}], tools=None))
        '<|user|>hi<|assistant|>'
    """
    _require_chat_template(tokenizer)
    return _render_ids(tokenizer, messages, tools, generation=True)


def _common_prefix(a: str, b: str) -> str:
    """The longest string both ``a`` and ``b`` start with.

    Example:
        >>> _common_prefix("\\n", "\\n<|im_start|>user"), _common_prefix("ab", "ac")
        ('\\n', 'a')
    """
    size = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    return a[:size]


def template_boundary_ids(tokenizer: Any, tools: Tools) -> list[int]:
    """What the template renders between an assistant turn's EOS and the next message.

    Renders system, user, assistant(``PROBE_CONTENT``) — once alone, once followed by a user
    message — finds the tokenizer's EOS text after the probe content, and takes the text both
    renders share after it: the part of the assistant's rendering that follows EOS (Qwen:
    ``"\\n"``). Empty when the template writes nothing there, or writes no EOS text after an
    assistant's content (its turns end with another token; then no boundary is inserted, as in
    verl's default builder).

    Raises:
        ValueError: the template does not render the assistant content, changes the rendering of
            a turn when a message follows, or the boundary's ids are not those the full render
            has there (the tokenizer merges tokens across the end of a turn).

    Example:
        >>> from stages.data.tokenizer import build_tiny_tokenizer
        >>> template_boundary_ids(build_tiny_tokenizer(), tools=None)
        []
    """
    eos = tokenizer.eos_token
    turn = [SYNTHETIC_SYSTEM, SYNTHETIC_USER, {"role": "assistant", "content": PROBE_CONTENT}]
    ended = _render_text(tokenizer, turn, tools, generation=False)
    followed = _render_text(tokenizer, [*turn, PROBE_NEXT], tools, generation=False)
    content_at = ended.rfind(PROBE_CONTENT)
    if content_at < 0:
        raise ValueError(
            f"the chat template of {_template_label(tokenizer)} does not render an assistant "
            f"message's content {PROBE_CONTENT!r}; got {ended!r}"
        )
    eos_at = ended.find(eos, content_at + len(PROBE_CONTENT)) if eos else -1
    if eos_at < 0:
        return []
    turn_end = eos_at + len(eos)
    if not followed.startswith(ended[:turn_end]):
        raise ValueError(
            f"the chat template of {_template_label(tokenizer)} renders an assistant turn "
            f"differently when a message follows it: {ended[:turn_end]!r} is not a prefix of "
            f"{followed!r}"
        )
    boundary = _common_prefix(ended[turn_end:], followed[turn_end:])
    boundary_ids = _encode(tokenizer, boundary)
    expected = _encode(tokenizer, ended[:turn_end]) + boundary_ids
    if _encode(tokenizer, followed)[: len(expected)] != expected:
        raise ValueError(
            f"the ids of the turn boundary {boundary!r} of {_template_label(tokenizer)} differ "
            "from those of the full render: the tokenizer merges tokens across the end of a turn"
        )
    return boundary_ids


def _synthetic_prefix(calls: tuple[tuple[str | None, str | None], ...]) -> list[dict[str, Any]]:
    """System, user, and an assistant making one call per (name, tool_call_id) (verl's)."""
    tool_calls = [
        {
            "id": call_id if call_id is not None else f"continuous_token_call_{i}",
            "type": "function",
            "function": {"name": name or DUMMY_TOOL_NAME, "arguments": {}},
        }
        for i, (name, call_id) in enumerate(calls)
    ]
    assistant = {
        "role": "assistant",
        "content": "",
        "reasoning_content": SYNTHETIC_REASONING,
        "tool_calls": tool_calls,
    }
    return [SYNTHETIC_SYSTEM, SYNTHETIC_USER, assistant]


def _check_tool_messages(tool_messages: Messages) -> None:
    if not tool_messages:
        raise ValueError("a tool turn needs at least one tool message, got none")
    for i, message in enumerate(tool_messages):
        if message.get("role") != "tool" or not isinstance(message.get("content"), str):
            raise ValueError(
                f"tool message {i} must have role 'tool' and str content, got {message!r}"
            )
        for key in ("name", "tool_call_id"):
            if message.get(key) is not None and not isinstance(message[key], str):
                raise ValueError(
                    f"tool message {i}: {key} must be a str or absent, got {message!r}"
                )


class ChatDelta:
    """The ids appended after each assistant turn of one run's trajectories (mask 0).

    Built once per run from the tokenizer and the run's tool schemas; the boundary is found once
    and the synthetic prefix's render is cached per (names, tool_call_ids) of a tool group.

    Args:
        tokenizer: a Hugging Face tokenizer with a chat template (else ``ValueError``).
        tools: the tool schemas (OpenAI function format) passed as ``tools=`` to every render;
            None = no tools.
    """

    def __init__(self, tokenizer: Any, tools: Tools) -> None:
        _require_chat_template(tokenizer)
        self.tokenizer = tokenizer
        self.tools = tools
        self._boundary_ids = template_boundary_ids(tokenizer, tools)
        self._prefix_ids = functools.lru_cache(maxsize=PREFIX_CACHE_SIZE)(self._render_prefix)

    @property
    def boundary_ids(self) -> list[int]:
        """Ids the template writes after an assistant turn's EOS (Qwen: ``"\\n"``; often [])."""
        return list(self._boundary_ids)

    def _render_prefix(self, calls: tuple[tuple[str | None, str | None], ...]) -> list[int]:
        return _render_ids(self.tokenizer, _synthetic_prefix(calls), self.tools, generation=False)

    def tool_turn_ids(self, tool_messages: Messages, turn_ended_with_eos: bool) -> list[int]:
        """The ids to append after an assistant turn: boundary + tool messages + next header.

        Args:
            tool_messages: the tool group, in call order: each ``{"role": "tool", "content":
                str}`` with optional str ``name`` and ``tool_call_id``.
            turn_ended_with_eos: the assistant turn's last sampled id is the EOS token; only
                then is `boundary_ids` prepended (a turn cut by the length limit has no end).

        Returns:
            The ids, all with response mask 0: `boundary_ids` (when ``turn_ended_with_eos``),
            then the template's rendering of the tool messages and of the next assistant header.

        Raises:
            ValueError: a malformed tool message, or a template for which the synthetic prefix's
                ids are not a prefix of the ids of the prefix followed by the tool messages.
        """
        _check_tool_messages(tool_messages)
        calls = tuple((m.get("name"), m.get("tool_call_id")) for m in tool_messages)
        prefix_ids = self._prefix_ids(calls)
        messages = [*_synthetic_prefix(calls), *tool_messages]
        full_ids = _render_ids(self.tokenizer, messages, self.tools, generation=True)
        if full_ids[: len(prefix_ids)] != prefix_ids:
            raise ValueError(
                f"the chat template of {_template_label(self.tokenizer)} is not append-only for "
                f"tool messages: the render of {_synthetic_prefix(calls)!r} is not a prefix of the "
                "render with the tool messages after it, so the tool turn cannot be appended as a "
                "delta of the template"
            )
        delta = full_ids[len(prefix_ids) :]
        return (self.boundary_ids if turn_ended_with_eos else []) + delta

    def user_turn_ids(self, user_messages: Messages, turn_ended_with_eos: bool) -> list[int]:
        """The ids to append after an assistant turn for an interaction's user messages:
        boundary + the user messages + the next assistant header (mask 0), rendered after a
        synthetic system, user and (empty) assistant message, as verl renders non-tool groups.

        Raises:
            ValueError: a message that is not ``{"role": "user", "content": str}``, or a template
                that is not append-only for user messages.
        """
        for i, message in enumerate(user_messages):
            if message.get("role") != "user" or not isinstance(message.get("content"), str):
                raise ValueError(f"user message {i} must have role 'user' and str content")
        prefix = [SYNTHETIC_SYSTEM, SYNTHETIC_USER, {"role": "assistant", "content": ""}]
        prefix_ids = _render_ids(self.tokenizer, prefix, self.tools, generation=False)
        full_ids = _render_ids(
            self.tokenizer, [*prefix, *user_messages], self.tools, generation=True
        )
        if full_ids[: len(prefix_ids)] != prefix_ids:
            raise ValueError(
                f"the chat template of {_template_label(self.tokenizer)} is not append-only for "
                "user messages after an assistant turn, so an interaction's turn cannot be "
                "appended as a delta of the template"
            )
        delta = full_ids[len(prefix_ids) :]
        return (self.boundary_ids if turn_ended_with_eos else []) + delta
