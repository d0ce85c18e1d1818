"""The multi-turn agent demo (ppoflow/demo-lookup): its scorer by hand, its call format, the files
``ppoflow make-demo-data --task agent`` writes, configs/demo-agent-cpu.yaml, and (slow) two
training steps of the demo through the real command line."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import typer
from typer.testing import CliRunner

from flows.cli import data as cli_data
from stages.agent.parsers import TOOL_PARSERS
from stages.agent.tool_config import check_tool_classes, load_tool_config
from stages.config import load_config
from stages.data.demo_agent_task import (
    DATA_SOURCE,
    KEYS,
    RowTableLookup,
    compute_score,
    make_agent_demo_data,
    make_agent_demo_rows,
    split_turns,
)

REPO = Path(__file__).resolve().parents[2]
PPOFLOW = Path(sys.executable).with_name("ppoflow")
TABLE = {"a": "b", "b": "d", "c": "a", "d": "c"}
INFO = {"key": "c", "tools_kwargs": {"lookup": {"create_kwargs": {"table": TABLE}}}}


def score(solution: str) -> dict:
    return compute_score(DATA_SOURCE, solution, TABLE["c"], INFO)


# --- the scorer, by hand (key c, value a; module docstring for the formula) ---


def test_the_ideal_trajectory_scores_one_and_succeeds():
    assert score("c<|tool|>aa") == {"score": 1.0, "acc": 1.0, "pred": "a"}


def test_an_answer_that_does_not_stop_loses_the_stop_share_of_the_answer():
    # call 1, ran 1, faithful copy("aa", a) = 0.8, correct 0.8: 0.3 + 0.1 + 0.16 + 0.32
    out = score("c<|tool|>aaa")
    assert out["score"] == pytest.approx(0.88) and out["acc"] == 1.0


def test_a_wrong_key_copied_faithfully_earns_the_key_near_miss_and_faithfulness():
    # call: char_credit(b, c) = 0.25 (cyclic distance 1 of 2); the tool says d (table[b]),
    # copied: faithful 1; correct = char_credit(d, a) = 0.25 (d and a are neighbours, cyclic)
    out = score("b<|tool|>dd")
    assert out["score"] == pytest.approx(0.3 * 0.25 + 0.1 + 0.2 + 0.4 * 0.25)
    assert out["acc"] == 0.0 and out["pred"] == "d"
    # key a is opposite c (distance 2): no call credit; the tool says b, copied: correct 0.25
    assert score("a<|tool|>bb")["score"] == pytest.approx(0.1 + 0.2 + 0.4 * 0.25)


def test_every_visible_character_of_the_call_turn_dilutes_it():
    # "cccc": the copy score 0.8 (no stop), over 4 visible characters; no tool turn
    assert score("cccc")["score"] == pytest.approx(0.3 * 0.8 / 4)
    assert score("")["score"] == 0.0, "an empty turn earns nothing"


def test_the_right_value_without_a_tool_call_is_no_success():
    out = score("a")  # one letter, a against the key c (opposite: 0), no tool turn
    assert out["score"] == 0.0 and out["acc"] == 0.0
    assert score("d")["score"] == pytest.approx(0.3 * 0.25), "d is c's neighbour"


def test_an_unknown_key_gets_the_tool_text_stripped_and_no_faithful_credit():
    assert split_turns("zz<|tool|>unknown keya", TABLE) == ("zz", "unknown key", "a")
    out = score("zz<|tool|>unknown keya")
    # call: z is no key letter: 0; ran 1; faithful 0 (no letter came back); correct 1 (a)
    assert out["score"] == pytest.approx(0.1 + 0.4 * 1.0)
    assert out["acc"] == 0.0, "a was right by luck, but the key called was not c"


def test_the_scorer_refuses_another_data_source_and_a_mismatched_row():
    with pytest.raises(ValueError, match="demo-lookup"):
        compute_score("ppoflow/demo-copy", "c?", "a", INFO)
    with pytest.raises(ValueError, match="ground_truth"):
        compute_score(DATA_SOURCE, "c?", "b", INFO)


# --- the call format and the tool ---


def test_lookup_word_calls_lookup_with_a_one_word_turn():
    parse = TOOL_PARSERS.get("lookup_word").parse
    turn = parse("c<|endoftext|>")
    assert [(c.name, json.loads(c.arguments)) for c in turn.calls] == [("lookup", {"key": "c"})]
    assert [parse(t).calls for t in ("c d<|endoftext|>", "c?", "<|endoftext|>")] == [(), (), ()]


def test_the_tool_answers_from_the_row_table_only():
    tool = RowTableLookup({"type": "native"}, {"type": "function", "function": {"name": "lookup"}})

    async def call(create_kwargs, key):
        instance_id, _ = await tool.create(create_kwargs=create_kwargs)
        try:
            return (await tool.execute(instance_id, {"key": key}))[0].text
        finally:
            await tool.release(instance_id)

    assert asyncio.run(call({"table": TABLE}, "c")) == "a"
    assert asyncio.run(call({"table": TABLE}, "x")) == "unknown key"
    with pytest.raises(ValueError, match=r"create_kwargs\.table"):
        asyncio.run(call({}, "c"))


# --- the data files and the config ---


def test_rows_carry_the_key_the_secret_table_and_the_agent_loop():
    rows = make_agent_demo_rows(200, seed=3, split="train")
    assert make_agent_demo_rows(200, seed=3, split="train") == rows
    for row in rows:
        info = row["extra_info"]
        table = info["tools_kwargs"]["lookup"]["create_kwargs"]["table"]
        assert sorted(table) == list(KEYS) and row["agent_name"] == "tool_agent"
        assert row["prompt"] == [{"role": "user", "content": f"key: {info['key']}"}]
        assert row["reward_model"]["ground_truth"] == table[info["key"]]
    tables = {json.dumps(r["extra_info"]["tools_kwargs"], sort_keys=True) for r in rows}
    assert len(tables) > 100, "each row draws its own table (4^4 = 256 possible)"


def make_demo_data_cli(*args: str):
    """``ppoflow make-demo-data ARGS`` through typer's CliRunner (the command as registered)."""
    app = typer.Typer()
    cli_data.register(app)
    return CliRunner().invoke(app, ["make-demo-data", *args])


def test_make_demo_data_task_agent_writes_parquet_and_a_tool_config(tmp_path):
    result = make_demo_data_cli(str(tmp_path), "--task", "agent", "--n-train", "16", "--n-val", "4")
    assert result.exit_code == 0, result.output
    assert "tools.yaml" in result.output
    train = pq.read_table(tmp_path / "train.parquet").to_pylist()
    assert len(train) == 16 and len(pq.read_table(tmp_path / "val.parquet")) == 4
    assert train[0]["data_source"] == DATA_SOURCE and train[0]["agent_name"] == "tool_agent"
    (spec,) = load_tool_config(tmp_path / "tools.yaml")
    assert spec.name == "lookup" and check_tool_classes([spec])[spec.class_name] is RowTableLookup


def test_make_demo_data_task_agent_refuses_answer_lengths(tmp_path):
    result = make_demo_data_cli(str(tmp_path), "--task", "agent", "--answer-length", "2")
    assert result.exit_code != 0 and "one letter" in result.output
    assert not (tmp_path / "train.parquet").exists()


def test_the_demo_agent_config_loads_and_validates(tmp_path):
    paths = make_agent_demo_data(tmp_path / "data", n_train=8, n_val=4)
    config = load_config(
        REPO / "configs" / "demo-agent-cpu.yaml",
        [f"actor_rollout_ref.rollout.multi_turn.tool_config_path={paths[2]}"],
    )
    rollout = config.actor_rollout_ref.rollout
    assert rollout.name == "hf" and rollout.multi_turn.enable
    assert rollout.multi_turn.format == "lookup_word"
    assert rollout.multi_turn.max_assistant_turns == 2, "the call, then the answer"
    assert rollout.response_length >= 14, "the ideal trajectory is 14 response tokens"
    assert Path(config.reward.custom_reward_function.path) == Path("stages/data/demo_agent_task.py")
    assert (REPO / config.reward.custom_reward_function.path).is_file()
    assert config.algorithm.adv_estimator == "grpo"


# --- two steps of the demo, end to end (make-demo-data, make-tiny-model, train) ---


@pytest.mark.slow
def test_two_training_steps_of_the_agent_demo_through_the_command_line(tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}

    def ppoflow(*args: str) -> str:
        result = subprocess.run(
            [str(PPOFLOW), *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=600
        )
        assert result.returncode == 0, (
            f"ppoflow {args[0]} failed:\n{result.stdout}\n{result.stderr}"
        )
        return result.stdout

    ppoflow(
        "make-demo-data",
        str(tmp_path / "data"),
        "--task",
        "agent",
        "--n-train",
        "32",
        "--n-val",
        "8",
    )
    ppoflow("make-tiny-model", str(tmp_path / "model"))
    out = ppoflow(
        "train", "configs/demo-agent-cpu.yaml",
        f"data.train_files=[{tmp_path}/data/train.parquet]",
        f"data.val_files=[{tmp_path}/data/val.parquet]",
        f"actor_rollout_ref.model.path={tmp_path}/model",
        f"actor_rollout_ref.rollout.multi_turn.tool_config_path={tmp_path}/data/tools.yaml",
        "data.train_batch_size=8", "actor_rollout_ref.actor.ppo_mini_batch_size=8",
        "trainer.total_training_steps=2", "trainer.test_freq=2", "trainer.save_freq=-1",
        "trainer.logger=[console]", "reward.num_workers=1",
        f"trainer.default_local_dir={tmp_path}/checkpoints",
        f"ppoflow.artifact_dir={tmp_path}/runs",
    )  # fmt: skip
    assert "step 2/2" in out and "validation @ step 2" in out
    run_dir = Path(out.strip().splitlines()[-1])
    inspected = json.loads(ppoflow("inspect", str(run_dir), "--json"))
    assert len(inspected["steps"]) == 2
