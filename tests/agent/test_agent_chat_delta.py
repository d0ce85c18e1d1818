"""The ids a tool turn appends (`stages.agent.chat_delta`), checked against the chat template.

The key property, for an append-only template: a trajectory built from ids alone —

    prompt ids + sampled ids (turn 1, ending with EOS) + delta 1 + sampled ids (turn 2) + delta 2

— equals the template's render of the whole conversation, tokenized, where the conversation is
the prompt, then each assistant message with the text of its sampled ids (without EOS) as content
and no ``tool_calls`` field, then its tool messages; rendered with ``add_generation_prompt=True``
and the same ``tools=``. So what the model sees on the next turn is exactly what the template
would have given it, while the sampled ids were never re-tokenized.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from stages.agent.chat_delta import ChatDelta, render_prompt_ids, template_boundary_ids
from stages.data.tokenizer import build_tiny_tokenizer


def _load_templates():
    name = "agent_templates_for_tests"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name(f"{name}.py"))
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        sys.modules[name] = module
    return sys.modules[name]


templates = _load_templates()

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "search",
            "description": "Search the web",
            "parameters": {
                "type": "object",
                "properties": {"q": {"type": "string"}},
                "required": ["q"],
            },
        },
    }
]
PROMPT = [
    {"role": "system", "content": "You answer with tools."},
    {"role": "user", "content": "What is pi times two?"},
]
TURN_1 = 'Searching.\n<tool_call>\n{"name": "search", "arguments": {"q": "pi"}}\n</tool_call>'
TOOLS_1 = [
    {"role": "tool", "name": "search", "tool_call_id": "call_0", "content": "pi = 3.14159"},
    {"role": "tool", "name": "search", "tool_call_id": "call_1", "content": "tau = 2 pi"},
]
TURN_2 = '<tool_call>\n{"name": "search", "arguments": {"q": "2 × 3.14159"}}\n</tool_call>'
TOOLS_2 = [{"role": "tool", "content": "6.28318 — done"}]  # neither name nor tool_call_id


@pytest.fixture(scope="module")
def tiny():
    return build_tiny_tokenizer()


@pytest.fixture(scope="module")
def qwen():
    return templates.build_qwen25_style_tokenizer()


def encode(tokenizer, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def sampled(tokenizer, text: str) -> list[int]:
    """What the model would have sampled for a turn: its text's ids, then EOS."""
    return [*encode(tokenizer, text), tokenizer.eos_token_id]


@pytest.mark.parametrize("tokenizer_name", ["tiny", "qwen"])
@pytest.mark.parametrize("tools", [TOOLS, None], ids=["tools", "no-tools"])
def test_trajectory_of_ids_equals_the_template_render_of_the_conversation(
    tokenizer_name, tools, request
):
    tokenizer = request.getfixturevalue(tokenizer_name)
    delta = ChatDelta(tokenizer, tools)
    trajectory = render_prompt_ids(tokenizer, PROMPT, tools)
    trajectory += sampled(tokenizer, TURN_1) + delta.tool_turn_ids(TOOLS_1, True)
    trajectory += sampled(tokenizer, TURN_2) + delta.tool_turn_ids(TOOLS_2, True)

    conversation = [
        *PROMPT,
        {"role": "assistant", "content": TURN_1},
        *TOOLS_1,
        {"role": "assistant", "content": TURN_2},
        *TOOLS_2,
    ]
    full = tokenizer.apply_chat_template(
        conversation, tools=tools, add_generation_prompt=True, tokenize=False
    )
    assert tokenizer.decode(trajectory) == full
    assert trajectory == encode(tokenizer, full)


def test_qwen_delta_is_the_tool_response_block_and_the_assistant_header(qwen):
    delta = ChatDelta(qwen, TOOLS)
    assert delta.boundary_ids == encode(qwen, "\n")
    ids = delta.tool_turn_ids(TOOLS_1, turn_ended_with_eos=True)
    assert qwen.decode(ids) == (
        "\n<|im_start|>user\n<tool_response>\npi = 3.14159\n</tool_response>\n"
        "<tool_response>\ntau = 2 pi\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )


def test_the_boundary_is_prepended_only_when_the_turn_ended_with_eos(qwen):
    delta = ChatDelta(qwen, TOOLS)
    with_eos = delta.tool_turn_ids(TOOLS_2, turn_ended_with_eos=True)
    cut = delta.tool_turn_ids(TOOLS_2, turn_ended_with_eos=False)
    assert with_eos == delta.boundary_ids + cut
    assert qwen.decode(cut).startswith("<|im_start|>user\n<tool_response>")


def test_tiny_template_has_no_boundary_and_renders_tool_messages_by_role(tiny):
    delta = ChatDelta(tiny, TOOLS)
    assert delta.boundary_ids == []
    assert template_boundary_ids(tiny, None) == []
    ids = delta.tool_turn_ids(TOOLS_1, turn_ended_with_eos=True)
    assert tiny.decode(ids) == "<|tool|>pi = 3.14159<|tool|>tau = 2 pi<|assistant|>"


def test_boundary_ids_is_a_copy(qwen):
    delta = ChatDelta(qwen, None)
    delta.boundary_ids.append(0)
    assert delta.boundary_ids == encode(qwen, "\n")


def test_a_template_that_is_not_append_only_is_an_error_naming_it(tiny):
    tokenizer = build_tiny_tokenizer()
    tokenizer.chat_template = templates.NOT_APPEND_ONLY_TEMPLATE
    delta = ChatDelta(tokenizer, None)  # its assistant turns have no EOS: no boundary
    assert delta.boundary_ids == []
    with pytest.raises(
        ValueError, match=r"chat template of tokenizer .* sha256 .* not append-only"
    ):
        delta.tool_turn_ids([{"role": "tool", "content": "x"}], turn_ended_with_eos=True)


def test_tokenizer_without_chat_template_is_an_error(tiny):
    tokenizer = build_tiny_tokenizer()
    tokenizer.chat_template = None
    with pytest.raises(ValueError, match="multi-turn rollouts need a chat template"):
        render_prompt_ids(tokenizer, PROMPT, None)
    with pytest.raises(ValueError, match="multi-turn rollouts need a chat template"):
        ChatDelta(tokenizer, None)


@pytest.mark.parametrize(
    "messages",
    [
        [],
        [{"role": "user", "content": "x"}],
        [{"role": "tool", "content": {"not": "a str"}}],
        [{"role": "tool", "content": "x", "name": 3}],
    ],
    ids=["empty", "not-tool", "content-not-str", "name-not-str"],
)
def test_malformed_tool_messages_are_errors(qwen, messages):
    with pytest.raises(ValueError, match="tool"):
        ChatDelta(qwen, None).tool_turn_ids(messages, turn_ended_with_eos=True)


def test_the_prefix_render_is_cached_per_group_of_names_and_ids(qwen):
    delta = ChatDelta(qwen, TOOLS)
    first = delta.tool_turn_ids(TOOLS_1, True)
    again = delta.tool_turn_ids(TOOLS_1, True)
    other = delta.tool_turn_ids(
        [{**m, "content": m["content"] + "!"} for m in TOOLS_1], turn_ended_with_eos=True
    )
    assert first == again and other != first
    info = delta._prefix_ids.cache_info()
    assert (info.hits, info.misses) == (2, 1)
