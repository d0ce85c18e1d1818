"""The agent loop's state machine over token ids, with a scripted generator and fake tools."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
import torch
from tensordict import TensorDict

from dataproto import keys as K
from stages.agent.loop import (
    GeneratedTurn,
    LoopLimits,
    Trajectory,
    run_agent_loop,
    truncate_tool_text,
)
from stages.agent.metrics import agent_metrics
from stages.agent.parsers import FunctionCall, ParsedTurn
from stages.agent.trajectory import AGENT_STOP_REASON, TOOL_REWARDS, trajectories_to_batch

EOS = 1
CALL = 7  # a sampled id that the fake parser reads as "call the tool"
TWO_CALLS = 8  # … as two calls
TOOL_ID = 50  # the ids a tool turn appends


@dataclass
class FakeResult:
    text: str
    reward: float | None
    status: str = "ok"
    seconds: float = 0.01


class Script:
    """A generator that answers each context from a per-row script of turns (row = first id)."""

    def __init__(self, turns_by_row: dict[int, list[list[int]]]) -> None:
        self.turns_by_row = {row: list(turns) for row, turns in turns_by_row.items()}
        self.calls: list[tuple[int, int]] = []  # (rows in the call, max_new_tokens)

    def __call__(self, contexts: list[list[int]], max_new_tokens: int) -> list[GeneratedTurn]:
        self.calls.append((len(contexts), max_new_tokens))
        out = []
        for context in contexts:
            ids = self.turns_by_row[context[0]].pop(0)[:max_new_tokens]
            out.append(GeneratedTurn(ids, [-0.5] * len(ids), bool(ids) and ids[-1] == EOS))
        return out


def parse(ids: list[int]) -> ParsedTurn:
    calls = []
    if CALL in ids:
        calls.append(FunctionCall("lookup", '{"key": "a"}'))
    if TWO_CALLS in ids:
        calls += [FunctionCall("lookup", '{"key": "b"}'), FunctionCall("lookup", '{"key": "c"}')]
    return ParsedTurn("", tuple(calls), 0)


def run(trajectories, limits, script, results=None):
    ran: list[list] = []

    def run_tools(calls):
        ran.append(calls)
        return [results(c) if results else FakeResult(f"v{i}", 1.0) for i, c in enumerate(calls)]

    def tool_turn_ids(messages, ended_with_eos):
        return [TOOL_ID] * (2 * len(messages))

    run_agent_loop(
        trajectories,
        limits,
        generate=script,
        parse=parse,
        run_tools=run_tools,
        tool_turn_ids=tool_turn_ids,
        make_call=lambda name, arguments, kwargs: (name, arguments, kwargs),
    )
    return ran


def test_assistant_and_tool_turns_alternate_with_masks_and_log_probs():
    t = Trajectory(prompt_ids=[100, 101], uses_tools=True)
    script = Script({100: [[3, CALL, EOS], [4, EOS]]})
    run([t], LoopLimits(response_length=20), script)
    assert t.response_ids == [3, CALL, EOS, TOOL_ID, TOOL_ID, 4, EOS]
    assert t.response_mask == [1, 1, 1, 0, 0, 1, 1]
    assert t.log_probs == [-0.5, -0.5, -0.5, 0.0, 0.0, -0.5, -0.5]
    assert (t.assistant_turns, t.user_turns, t.num_turns) == (2, 1, 4)
    assert t.stop_reason == "no_tool_call"
    assert [turn.role for turn in t.turns] == ["assistant", "tool", "assistant"]
    assert (t.turns[1].start, t.turns[1].end) == (3, 5)
    assert t.tool_rewards == [1.0]


def test_the_next_turn_continues_from_every_id_so_far():
    seen = []

    def generate(contexts, max_new_tokens):
        seen.extend(contexts)
        return [GeneratedTurn([CALL, EOS] if len(seen) == 1 else [EOS], [0.0] * 2, True)]

    t = Trajectory(prompt_ids=[100], uses_tools=True)
    run_agent_loop(
        [t],
        LoopLimits(response_length=20),
        generate=generate,
        parse=parse,
        run_tools=lambda calls: [FakeResult("x", None) for _ in calls],
        tool_turn_ids=lambda messages, eos: [TOOL_ID],
        make_call=lambda *a: a,
    )
    assert seen == [[100], [100, CALL, EOS, TOOL_ID]]
    assert t.tool_rewards == []  # a None reward is not kept


def test_single_turn_rows_end_after_one_turn_in_the_same_rounds():
    tools = Trajectory(prompt_ids=[100], uses_tools=True)
    single = Trajectory(prompt_ids=[200], uses_tools=False)
    script = Script({100: [[CALL, EOS], [EOS]], 200: [[CALL, EOS]]})
    run([tools, single], LoopLimits(response_length=20), script)
    assert single.stop_reason == "single_turn" and single.num_turns == 2  # verl's single-turn count
    assert single.response_mask == [1, 1]
    assert script.calls == [(2, 20), (1, 16)]  # round 2 only for the live row, its rest budget


def test_each_turn_gets_the_rest_of_its_budget_and_a_full_response_stops():
    t = Trajectory(prompt_ids=[100], uses_tools=True)
    script = Script({100: [[CALL, EOS], [5, 5, 5, 5, 5, 5, 5, 5]]})
    run([t], LoopLimits(response_length=8), script)
    assert script.calls == [(1, 8), (1, 4)]
    assert len(t.response_ids) == 8 and t.stop_reason == "length"


def test_tool_output_that_does_not_fit_ends_the_trajectory_without_it():
    t = Trajectory(prompt_ids=[100], uses_tools=True)
    script = Script({100: [[CALL, EOS]]})
    run([t], LoopLimits(response_length=4), script)  # 2 + 2 tool ids would reach 4
    assert t.response_ids == [CALL, EOS] and t.stop_reason == "tool_response_too_long"
    assert t.user_turns == 0 and t.turns[-1].role == "tool" and t.turns[-1].start == t.turns[-1].end


@pytest.mark.parametrize(
    ("limits", "reason", "assistant", "user"),
    [
        (LoopLimits(response_length=50, max_assistant_turns=2), "max_assistant_turns", 2, 1),
        (LoopLimits(response_length=50, max_user_turns=1), "max_user_turns", 2, 1),
    ],
)
def test_turn_limits_stop_in_verls_order(limits, reason, assistant, user):
    t = Trajectory(prompt_ids=[100], uses_tools=True)
    script = Script({100: [[CALL, EOS]] * 5})
    run([t], limits, script)
    assert (t.stop_reason, t.assistant_turns, t.user_turns) == (reason, assistant, user)


def test_calls_past_max_parallel_calls_are_dropped_and_counted():
    t = Trajectory(prompt_ids=[100], uses_tools=True)
    script = Script({100: [[CALL, TWO_CALLS, EOS], [EOS]]})
    ran = run([t], LoopLimits(response_length=30, max_parallel_calls=2), script)
    assert [call[1] for call in ran[0]] == ['{"key": "a"}', '{"key": "b"}']
    assert t.dropped_calls == 1
    assert [c.get("dropped", False) for c in t.turns[0].calls] == [False, False, True]


def test_calls_of_every_trajectory_run_in_one_batch_and_failures_score_zero():
    rows = [Trajectory(prompt_ids=[100 + i], uses_tools=True) for i in range(3)]
    script = Script({100 + i: [[CALL, EOS], [EOS]] for i in range(3)})
    ran = run(
        rows, LoopLimits(response_length=30), script, lambda c: FakeResult("boom", None, "error")
    )
    assert len(ran) == 1 and len(ran[0]) == 3
    assert all(t.tool_rewards == [0.0] for t in rows)  # verl: a failed call's reward is 0.0
    assert agent_metrics(rows)["agent/tool/lookup/errors"] == 3.0


def test_tools_kwargs_reach_the_call():
    t = Trajectory(
        prompt_ids=[100], uses_tools=True, tools_kwargs={"lookup": {"create_kwargs": {"x": 1}}}
    )
    ran = run([t], LoopLimits(response_length=30), Script({100: [[CALL, EOS], [EOS]]}))
    assert ran[0][0][2] == {"lookup": {"create_kwargs": {"x": 1}}}


def test_truncation_sides_follow_verl():
    text = "0123456789"
    assert truncate_tool_text(text, 4, "left") == "(truncated)...6789"
    assert truncate_tool_text(text, 4, "right") == "0123...(truncated)"
    assert truncate_tool_text(text, 4, "middle") == "01...(truncated)...89"


def test_trajectories_become_the_rollout_layout():
    prompts = TensorDict(
        {
            K.INPUT_IDS: torch.tensor([[0, 100, 101], [0, 0, 200]]),
            K.ATTENTION_MASK: torch.tensor([[0, 1, 1], [0, 0, 1]]),
            K.POSITION_IDS: torch.tensor([[0, 0, 1], [0, 0, 0]]),
        },
        batch_size=[2],
    )
    a = Trajectory(prompt_ids=[100, 101], uses_tools=True)
    b = Trajectory(prompt_ids=[200], uses_tools=False)
    run(
        [a, b],
        LoopLimits(response_length=8),
        Script({100: [[CALL, EOS], [4, EOS]], 200: [[9, EOS]]}),
    )
    out = trajectories_to_batch(prompts, [a, b], 8, pad_id=0)
    t = out.batch
    assert t[K.RESPONSES].tolist() == [
        [CALL, EOS, TOOL_ID, TOOL_ID, 4, EOS, 0, 0],
        [9, EOS, 0, 0, 0, 0, 0, 0],
    ]
    assert t[K.RESPONSE_MASK].tolist() == [[1, 1, 0, 0, 1, 1, 0, 0], [1, 1, 0, 0, 0, 0, 0, 0]]
    assert t[K.ATTENTION_MASK][:, 3:].tolist() == [
        [1, 1, 1, 1, 1, 1, 0, 0],
        [1, 1, 0, 0, 0, 0, 0, 0],
    ]
    assert t[K.ROLLOUT_LOG_PROBS][0].tolist() == [-0.5, -0.5, 0, 0, -0.5, -0.5, 0, 0]
    assert t[K.POSITION_IDS][0].tolist() == [0, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9]
    assert t[K.INPUT_IDS][0, :5].tolist() == [0, 100, 101, CALL, EOS]
    nt = out.non_tensor_batch
    assert nt[K.NUM_TURNS].tolist() == [4, 2] and nt[K.NUM_TURNS].dtype == np.int32
    assert nt[K.TOOL_CALL_COUNTS].tolist() == [1, 0]
    assert list(nt[TOOL_REWARDS]) == [[1.0], []]
    assert list(nt[AGENT_STOP_REASON]) == ["no_tool_call", "single_turn"]
