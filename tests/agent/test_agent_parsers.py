"""Tool-call parsers (`stages.agent.parsers`): verl 0.9.1's hermes semantics, plus ppoflow's
count of malformed call blocks."""

from __future__ import annotations

import json

import pytest

from stages.agent.parsers import (
    DEFAULT_FORMAT,
    TOOL_PARSERS,
    FunctionCall,
    ParsedTurn,
    parse_hermes,
)


def call_block(obj: object) -> str:
    return f"<tool_call>\n{json.dumps(obj, ensure_ascii=False)}\n</tool_call>"


def test_registry_has_hermes_as_the_default_and_lists_names_on_a_typo():
    assert DEFAULT_FORMAT == "hermes"
    assert TOOL_PARSERS.get("hermes").parse is parse_hermes
    assert TOOL_PARSERS.get("hermes").description
    with pytest.raises(KeyError, match=r"known: \['hermes', 'lookup_word'\]"):
        TOOL_PARSERS.get("hermess")


def test_one_valid_call_with_content_around_it_kept_unstripped():
    text = "I will search.\n" + call_block({"name": "search", "arguments": {"q": "pi", "n": 3}})
    text += "<|im_end|>"
    turn = parse_hermes(text)
    assert turn == ParsedTurn(
        content="I will search.\n<|im_end|>",
        calls=(FunctionCall(name="search", arguments='{"q": "pi", "n": 3}'),),
        malformed=0,
    )
    assert turn.calls[0].tool_call_id is None


def test_several_calls_keep_their_order_and_are_all_removed_from_content():
    text = (
        call_block({"name": "a", "arguments": {"x": 1}})
        + " between "
        + call_block({"name": "b", "arguments": {}})
        + call_block({"arguments": [1, 2], "name": "c"})
    )
    turn = parse_hermes(text)
    assert [c.name for c in turn.calls] == ["a", "b", "c"]
    assert [json.loads(c.arguments) for c in turn.calls] == [{"x": 1}, {}, [1, 2]]
    assert turn.content == " between "
    assert turn.malformed == 0


def test_malformed_blocks_are_skipped_counted_and_removed_from_content():
    good = call_block({"name": "ok", "arguments": {"v": True}})
    bad_json = "<tool_call>{'name': 'single quotes', 'arguments': {}}</tool_call>"
    no_arguments = call_block({"name": "f"})
    no_name = call_block({"arguments": {}})
    name_not_str = call_block({"name": 7, "arguments": {}})
    not_an_object = call_block(["name", "arguments"])
    text = "a" + bad_json + good + no_arguments + "b" + no_name + name_not_str + not_an_object
    turn = parse_hermes(text)
    assert turn.calls == (FunctionCall("ok", '{"v": true}'),)
    assert turn.malformed == 5
    assert turn.content == "ab"


@pytest.mark.parametrize(
    "text",
    [
        "plain answer",
        '<tool_call>{"name": "f", "arguments": {}}',  # never closed
        '{"name": "f", "arguments": {}}</tool_call>',  # never opened
        "",
    ],
)
def test_a_text_missing_either_tag_has_no_calls_and_is_returned_whole(text):
    assert parse_hermes(text) == ParsedTurn(content=text, calls=(), malformed=0)


def test_the_match_is_non_greedy_and_spans_newlines():
    text = (
        '<tool_call>\n{"name": "f",\n "arguments": {"s": "</tool"}}\n</tool_call>tail</tool_call>'
    )
    turn = parse_hermes(text)
    assert turn.calls == (FunctionCall("f", '{"s": "</tool"}'),)
    assert turn.content == "tail</tool_call>"


def test_non_ascii_arguments_are_dumped_without_escapes():
    text = call_block({"name": "météo", "arguments": {"ville": "Zürich", "emoji": "☀"}})
    turn = parse_hermes(text)
    assert turn.calls[0].name == "météo"
    assert turn.calls[0].arguments == '{"ville": "Zürich", "emoji": "☀"}'


def test_arguments_given_as_a_string_are_redumped_as_a_json_string_as_verl_does():
    written = '{"q": "pi"}'
    turn = parse_hermes(call_block({"name": "search", "arguments": written}))
    (call,) = turn.calls
    assert call.arguments == json.dumps(written)  # '"{\\"q\\": \\"pi\\"}"', not written itself
    assert json.loads(call.arguments) == written


def test_arguments_of_any_json_type_round_trip():
    for value in (None, 3, 2.5, "x", [1, "é"], {"nested": {"a": [None]}}):
        (call,) = parse_hermes(call_block({"name": "f", "arguments": value})).calls
        assert json.loads(call.arguments) == value
