"""End to end: a tiny training whose rollout runs the tool agent loop (multi_turn.enable with a
tool config): the steps train, the rollout artifact keeps the agent columns, the agent metrics
and the validation's turn counts are logged (the demo task and the tiny model, 2 steps)."""

from __future__ import annotations

from pathlib import Path

import pytest

from dataproto import keys as K
from dataproto.artifact import load_artifact
from flows.runs.store import RunStore
from flows.train import train

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("prefect_harness")]

REPO = Path(__file__).resolve().parents[2]


def test_two_steps_with_the_tool_agent_loop(
    tmp_path, make_demo_inputs, tiny_run_overrides, write_lookup_tool_config
):
    demo = make_demo_inputs(tmp_path / "demo")
    write_lookup_tool_config(tmp_path / "tools.yaml")
    result = train(
        REPO / "configs" / "demo-cpu.yaml",
        tiny_run_overrides(
            demo,
            tmp_path,
            2,
            "data.max_response_length=24",
            "actor_rollout_ref.rollout.multi_turn.enable=true",
            f"actor_rollout_ref.rollout.multi_turn.tool_config_path={tmp_path / 'tools.yaml'}",
            "actor_rollout_ref.rollout.multi_turn.sandbox.num_workers=1",
        ),
        str(tmp_path / "run"),
    )
    assert result.steps == 2
    store = RunStore(result.run_dir)
    rollout = load_artifact(store.artifact_path(1, "rollout"))
    nt = rollout.non_tensor_batch
    assert set(nt) >= {K.NUM_TURNS, K.TOOL_CALL_COUNTS, "agent_turns", "agent_stop_reason"}
    assert all(turns[0]["role"] == "assistant" for turns in nt["agent_turns"])
    assert K.RM_SCORES in rollout.batch  # scored inside the rollout (the agent default)
    reward = store.read_journal(1).record("reward")
    assert reward.status == "ran"
    for row in result.history:
        assert row["reward/skipped"] == 1.0 and "reward/in_rollout_wait_s" in row
        assert row["num_turns/mean"] >= 2
        assert sum(v for k, v in row.items() if k.startswith("agent/stop/")) == pytest.approx(1.0)
    assert any("val-aux/num_turns/mean" in row for row in result.history)
