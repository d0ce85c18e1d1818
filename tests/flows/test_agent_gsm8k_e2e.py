"""verl's multi-turn GSM8K data and tool config, unedited, train 2 steps.

The rows are those verl's ``examples/data_preprocess/gsm8k_tool_agent_loop.py`` writes (system
prompt, ``agent_name: tool_agent``, ``extra_info.tools_kwargs`` carrying each row's ground truth
to ``calc_gsm8k_reward``), a few made-up problems instead of the dataset; the tool config is
verl's ``gsm8k_tool_config.yaml`` byte for byte. The model is the tiny one (a longer context for
the system prompt), on the CPU."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dataproto import keys as K
from dataproto.artifact import load_artifact
from flows.runs.store import RunStore
from flows.train import train
from stages.data.tiny_model import make_tiny_model

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("prefect_harness")]

REPO = Path(__file__).resolve().parents[2]
SYSTEM = (
    "You are a math expert. You are given a question and you need to solve it step by step. "
    "Reasoning step by step before any tool call. "
    "You should use the `calc_gsm8k_reward` tool after step by step solving the question, "
    "before generate final answer at least once and refine your answer if necessary. "
    "Put your final answer in the format of `#### <answer>`."
)
PROBLEMS = [("Tom has 3 apples and buys 4 more. How many apples?", "7"),
            ("A box holds 6 pens. How many pens in 2 boxes?", "12"),
            ("Sam had 10 coins and spent 3. How many are left?", "7"),
            ("There are 5 cats with 4 legs each. How many legs?", "20")]  # fmt: skip


def gsm8k_tool_agent_rows(split: str) -> list[dict]:
    rows = []
    for index, (question, solution) in enumerate(PROBLEMS):
        rows.append(
            {
                "data_source": "openai/gsm8k",
                "agent_name": "tool_agent",
                "prompt": [
                    {"role": "system", "content": SYSTEM},
                    {
                        "role": "user",
                        "content": question
                        + " Let's think step by step and output the final answer after `####`.",
                    },
                ],
                "ability": "math",
                "reward_model": {"style": "rule", "ground_truth": solution},
                "extra_info": {
                    "split": split,
                    "index": index,
                    "answer": f"... #### {solution}",
                    "question": question,
                    "need_tools_kwargs": True,
                    "tools_kwargs": {
                        "calc_gsm8k_reward": {"create_kwargs": {"ground_truth": solution}}
                    },
                },
            }
        )
    return rows


def test_verls_gsm8k_tool_agent_data_and_tool_config_train_two_steps(
    tmp_path, write_verl_gsm8k_tool_config
):
    for split in ("train", "test"):
        pq.write_table(
            pa.Table.from_pylist(gsm8k_tool_agent_rows(split)), tmp_path / f"{split}.parquet"
        )
    tools = write_verl_gsm8k_tool_config(tmp_path / "tool_config" / "gsm8k_tool_config.yaml")
    model = make_tiny_model(tmp_path / "model", max_position_embeddings=1024)
    result = train(
        REPO / "configs" / "demo-cpu.yaml",
        [
            f"data.train_files=[{tmp_path}/train.parquet]",
            f"data.val_files=[{tmp_path}/test.parquet]",
            f"actor_rollout_ref.model.path={model}",
            "data.max_prompt_length=512",
            "data.max_response_length=48",
            "data.train_batch_size=2",
            "actor_rollout_ref.rollout.n=2",
            "actor_rollout_ref.actor.ppo_mini_batch_size=2",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
            "actor_rollout_ref.rollout.multi_turn.enable=true",
            "actor_rollout_ref.rollout.multi_turn.max_assistant_turns=5",
            f"actor_rollout_ref.rollout.multi_turn.tool_config_path={tools}",
            "actor_rollout_ref.rollout.multi_turn.sandbox.num_workers=1",
            "trainer.total_training_steps=2",
            "trainer.test_freq=2",
            "trainer.save_freq=-1",
            f"trainer.default_local_dir={tmp_path}/checkpoints",
            f"ppoflow.mlflow_tracking_uri=sqlite:///{tmp_path}/mlflow.db",
            "reward.num_workers=1",
        ],
        str(tmp_path / "run"),
    )
    assert result.steps == 2
    rollout = load_artifact(RunStore(result.run_dir).artifact_path(1, "rollout"))
    assert K.RM_SCORES in rollout.batch  # verl's default path: scored inside the agent loop
    assert set(rollout.non_tensor_batch["agent_stop_reason"]) <= {"length", "no_tool_call"}
    for row in result.history:
        assert row["agent/malformed_calls"] >= 0 and "critic/score/mean" in row
