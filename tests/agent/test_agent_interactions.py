"""Interactions: user turns after call-free assistant turns (the loop), verl's interaction config,
the gsm8k interaction answering in the sandbox, and a failing interaction ending its trajectory."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from dataproto import DataProto
from dataproto import keys as K
from stages.agent.interactions import InteractionReply, load_interaction_config
from stages.agent.loop import GeneratedTurn, LoopLimits, Trajectory, run_agent_loop
from stages.agent.parsers import ParsedTurn
from stages.agent.rollout import AgentRuntime, _attach_interactions
from stages.config import load_config
from stages.data.tokenizer import build_tiny_tokenizer

REPO = Path(__file__).resolve().parents[2]
EOS, USER_ID = 1, 60
#: verl's interaction config (examples/sglang_multiturn/config/interaction_config/), as shipped
VERL_GSM8K_INTERACTION = """\
interaction:
  - name: "gsm8k"
    class_name: "verl.interactions.gsm8k_interaction.Gsm8kInteraction"
    config: {}
"""
HANGING = """\
interaction:
  - name: "slow"
    class_name: "agent_tools_for_tests.HangingInteraction"
    config: {}
"""


LIMITS = LoopLimits(response_length=40)


def scripted_loop(trajectory, replies, limits=LIMITS):
    asked = []

    def interact(requests):
        asked.append([messages for _, _, messages in requests])
        return [replies.pop(0) for _ in requests]

    run_agent_loop(
        [trajectory],
        limits,
        generate=lambda contexts, budget: [GeneratedTurn([5, EOS], [-0.5, -0.5], True)],
        parse=lambda ids: ParsedTurn("", (), 0),
        run_tools=lambda calls: [],
        tool_turn_ids=lambda messages, eos: [],
        make_call=lambda *a: a,
        interact=interact,
        user_turn_ids=lambda messages, eos: [USER_ID] * 3,
        decode=lambda ids: "five",
    )
    return asked


def test_the_interaction_answers_each_call_free_turn_until_it_ends_the_trajectory():
    t = Trajectory(prompt_ids=[100], uses_tools=True, interaction="gsm8k")
    t.messages = [{"role": "user", "content": "2+3?"}]
    asked = scripted_loop(
        t,
        [
            InteractionReply("try again", 0.0, False, "ok"),
            InteractionReply("correct!", 1.0, True, "ok"),
        ],
    )
    assert t.response_ids == [5, EOS, USER_ID, USER_ID, USER_ID, 5, EOS, USER_ID, USER_ID, USER_ID]
    assert t.response_mask == [1, 1, 0, 0, 0, 1, 1, 0, 0, 0]
    assert (t.assistant_turns, t.user_turns, t.num_turns) == (2, 2, 5)
    assert t.turn_scores == [0.0, 1.0] and t.stop_reason == "interaction_done"
    assert asked[0][0] == [
        {"role": "user", "content": "2+3?"},
        {"role": "assistant", "content": "five"},
    ]
    assert asked[1][0][-2:] == [
        {"role": "user", "content": "try again"},
        {"role": "assistant", "content": "five"},
    ]


def test_a_failed_interaction_ends_only_its_trajectory():
    t = Trajectory(prompt_ids=[100], uses_tools=True, interaction="slow")
    scripted_loop(
        t, [InteractionReply("Error when executing tool: timed out", None, False, "timeout")]
    )
    assert t.stop_reason == "interaction_error" and t.user_turns == 0
    assert t.turns[-1].results[0]["status"] == "timeout"


def test_a_row_without_an_interaction_stops_at_a_call_free_turn():
    t = Trajectory(prompt_ids=[100], uses_tools=True)
    assert scripted_loop(t, []) == []
    assert t.stop_reason == "no_tool_call"


def test_verls_interaction_config_loads_and_a_bad_one_is_one_line(tmp_path):
    path = tmp_path / "gsm8k_interaction_config.yaml"
    path.write_text(VERL_GSM8K_INTERACTION)
    (spec,) = load_interaction_config(path)
    assert spec.name == "interaction:gsm8k"
    assert spec.config["class_name"] == "verl.interactions.gsm8k_interaction.Gsm8kInteraction"
    path.write_text("interaction:\n  - class_name: x.Y\n")
    with pytest.raises(ValueError, match=r"interaction\[0\] needs a str 'name' and 'class_name'"):
        load_interaction_config(path)


@pytest.fixture
def runtime(tmp_path, monkeypatch):
    (tmp_path / "interactions.yaml").write_text(VERL_GSM8K_INTERACTION + HANGING.split("\n", 1)[1])
    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).parent))
    config = load_config(
        REPO / "configs" / "demo-cpu.yaml",
        [
            f"actor_rollout_ref.rollout.multi_turn.interaction_config_path={tmp_path / 'interactions.yaml'}",
            "actor_rollout_ref.rollout.multi_turn.sandbox.timeout_s=2",
        ],
    )
    runtime = AgentRuntime(config, build_tiny_tokenizer())
    yield runtime
    runtime.close()


def test_verls_gsm8k_interaction_answers_in_the_sandbox(runtime):
    kwargs = {"name": "gsm8k", "ground_truth": "72"}
    right = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "so #### 72"}]
    wrong = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "#### 7"}]
    hang = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "x"}]
    replies = runtime.interact(
        [("gsm8k", kwargs, right), ("gsm8k", kwargs, wrong), ("slow", {"name": "slow"}, hang)]
    )
    assert replies[0] == InteractionReply("Your response is correct!", 1.0, True, "ok")
    assert replies[1].score == 0.0 and not replies[1].terminate
    assert replies[1].text.startswith("Your response is incorrect!")
    assert replies[2].status == "timeout"


def test_rows_name_their_interaction_and_start_from_their_prompt(runtime):
    infos = np.array(
        [{"interaction_kwargs": {"name": "gsm8k", "ground_truth": "1"}}, {}], dtype=object
    )
    prompts = np.empty(2, dtype=object)
    prompts[:] = [[{"role": "user", "content": "a"}], [{"role": "user", "content": "b"}]]
    batch = DataProto.from_dict({}, {K.EXTRA_INFO: infos, K.RAW_PROMPT: prompts})
    rows = [Trajectory(prompt_ids=[1], uses_tools=True) for _ in range(2)]
    _attach_interactions(rows, batch, runtime)
    assert rows[0].interaction == "gsm8k" and rows[0].messages == [{"role": "user", "content": "a"}]
    assert rows[1].interaction is None
    batch.non_tensor_batch[K.EXTRA_INFO][1] = {"interaction_kwargs": {"name": "nope"}}
    with pytest.raises(ValueError, match=r"row 1: extra_info.interaction_kwargs.name = 'nope'"):
        _attach_interactions(rows, batch, runtime)
