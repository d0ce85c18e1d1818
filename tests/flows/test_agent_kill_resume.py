"""kill -9 mid-rollout of a multi-turn step resumes to the uninterrupted run's weights.

The run: the tiny model on the demo task (tests/conftest.py, 4 prompts × n 2) with the tool agent
loop on (``multi_turn.enable`` and the ``lookup`` tool config of test_agent_e2e.py, 24 response
tokens), so every rollout goes through ``stages.agent.rollout.agent_rollout`` and the reward is
computed inside it on the reward workers (``stages.agent.scoring``), beside the tool sandbox's
zygote. 4 steps, a checkpoint after steps 2 and 4, validation at step 4 only.

One uninterrupted ``ppoflow train`` (the baseline) and, beside it, one SIGKILLed (its whole process
group) at ``agent.round:3`` (tests/flows/killpoints/sitecustomize.py): the third generation round
of the agent loop. Counted: the random tiny model never writes a hermes call in 24 tokens (every
trajectory ends at ``length`` or ``no_tool_call`` after its first turn), so each step's rollout is
one round, and the third is step 3's first, before anything of step 3 is generated; the test
checks both (the kill log's detail, the baseline's rollouts). Then ``ppoflow resume RUN_DIR`` in
place. It must end with the baseline's actor weights at step 4, bit for bit, in a checkpoint
that passes its full check; every step's journal ``done``; the resumed rollouts of steps 3 and 4
(responses and the scores made inside them) equal to the baseline's; no process of either group
left running, the reward zygote and the tool sandbox's zygote (both in the group at the kill, the
test checks) included.

Limit: trajectories here are single-round, so no tool runs and the ``agent.tools`` point is not
reached. A kill during a tool round resumes the same way: the resume starts from step 2's
checkpoint and runs step 3's rollout again from its first round, tools included, with each
round's sampling seeded by (step, round) (``stages.agent.rollout``); it is then exact when the
tools answer the same calls the same way, as the built-in ones do. That re-run of tool rounds is
not exercised here.

Time: each process spends most of its time starting; the baseline and the killed run run at once
(one per core of a 2-core machine) against the session's Prefect server, then the resume.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from dataproto import keys as K
from dataproto.artifact import load_artifact
from flows.runs.store import RunStore
from stages.engines.checkpoint import checkpoint_dir, read_latest_step
from stages.engines.checkpoint_manifest import verify_checkpoint
from stages.engines.safe_load import weights_only_load

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
KILLPOINTS = Path(__file__).resolve().parent / "killpoints"
STEPS, SAVE_FREQ, KILLED_STEP = 4, 2, 3
KILL_AT = "agent.round:3"  # one round per step (module docstring): step 3's first
ZYGOTE_BOOT = "from stages.reward.zygote import serve"  # in the zygotes' ``-c`` line
# --- the runs ------------------------------------------------------------------------------------


class Runs:
    """The baseline, the killed run and its resume: each in ``root/<name>`` (checkpoints, MLflow
    store, run directory, logs), against the session's Prefect server."""

    def __init__(
        self,
        root: Path,
        demo: Path,
        tiny_run_overrides,
        prefect_api_url: str,
        tools: Path,
        process_groups,
    ) -> None:
        self.root, self.demo, self.overrides = root, demo, tiny_run_overrides
        self.api_url = prefect_api_url
        self.tools = tools
        self.groups = process_groups

    def env(self, home: Path, **extra: str) -> dict[str, str]:
        """The session's hermetic environment (tests/conftest.py) with this run's own MLflow
        store, the session's Prefect server, one Prefect home, one CPU thread, no network."""
        return {
            **os.environ,
            "PREFECT_HOME": str(self.root / "prefect-home"),
            "PREFECT_API_URL": self.api_url,
            "MLFLOW_TRACKING_URI": f"sqlite:///{home}/mlflow.db",
            "HF_HUB_OFFLINE": "1",
            "OMP_NUM_THREADS": "1",
            **extra,
        }

    def train_command(self, home: Path) -> list[str]:
        overrides = self.overrides(
            self.demo,
            home,
            STEPS,
            f"trainer.save_freq={SAVE_FREQ}",
            "trainer.val_before_train=false",
            "data.max_response_length=24",
            "actor_rollout_ref.rollout.multi_turn.enable=true",
            f"actor_rollout_ref.rollout.multi_turn.tool_config_path={self.tools}",
            "actor_rollout_ref.rollout.multi_turn.sandbox.num_workers=1",
        )
        config = REPO / "configs" / "demo-cpu.yaml"
        command = [sys.executable, "-m", "flows.cli", "train", str(config), *overrides]
        return [*command, "--run-dir", str(home / "run")]

    def baseline(self) -> Path:
        home = self.root / "baseline"
        home.mkdir()
        log = home / "train.log"
        status, _ = self.groups.run_group(self.train_command(home), home, self.env(home), log)
        assert status == 0, f"the baseline exited {status}:\n{self.groups.tail(log)}"
        return home

    def killed(self) -> tuple[Path, dict, int]:
        """Train until :data:`KILL_AT`: (home, the kill log's line, the process group)."""
        home = self.root / "killed"
        home.mkdir()
        log, kill_log = home / "train.log", home / "kill.jsonl"
        python_path = [str(KILLPOINTS), os.environ.get("PYTHONPATH")]
        env = self.env(
            home,
            PYTHONPATH=os.pathsep.join(filter(None, python_path)),
            PPOFLOW_TEST_KILL_AT=KILL_AT,
            PPOFLOW_TEST_KILL_LOG=str(kill_log),
        )
        status, group = self.groups.run_group(self.train_command(home), home, env, log)
        assert status == -signal.SIGKILL, (
            f"ppoflow train exited {status}, not by its kill at {KILL_AT}:\n{self.groups.tail(log)}"
        )
        (line,) = [json.loads(text) for text in kill_log.read_text().splitlines()]
        return home, line, group

    def resume(self, home: Path) -> int:
        log = home / "resume.log"
        command = [sys.executable, "-m", "flows.cli", "resume", str(home / "run")]
        status, group = self.groups.run_group(command, home, self.env(home), log)
        assert status == 0, f"ppoflow resume exited {status}:\n{self.groups.tail(log)}"
        return group


# --- what the runs left --------------------------------------------------------------------------


def actor_weights(checkpoints: Path) -> dict[str, torch.Tensor]:
    """The actor's parameters in the step-STEPS DeepSpeed checkpoint (ZeRO 0, one rank)."""
    states = checkpoint_dir(checkpoints, STEPS, "actor") / "state" / "mp_rank_00_model_states.pt"
    return weights_only_load(states, map_location="cpu")["module"]


def rollout(home: Path, step: int):
    return load_artifact(RunStore(str(home / "run")).artifact_path(step, "rollout"))


# --- the test ------------------------------------------------------------------------------------


def test_a_kill_mid_rollout_of_a_multi_turn_step_resumes_to_the_uninterrupted_run(
    tmp_path,
    make_demo_inputs,
    tiny_run_overrides,
    prefect_harness,
    write_lookup_tool_config,
    process_groups,
):
    from prefect.settings import PREFECT_API_URL

    tail, live_members, is_live = (
        process_groups.tail,
        process_groups.live_members,
        process_groups.is_live,
    )
    started = time.monotonic()
    runs = Runs(
        tmp_path,
        make_demo_inputs(tmp_path / "demo"),
        tiny_run_overrides,
        PREFECT_API_URL.value(),
        write_lookup_tool_config(tmp_path / "tools.yaml"),
        process_groups,
    )
    with ThreadPoolExecutor(max_workers=2, thread_name_prefix="agent-kill") as pool:
        baseline_run, killed_run = pool.submit(runs.baseline), pool.submit(runs.killed)
        baseline = baseline_run.result()
        home, killed_at, killed_group = killed_run.result()

    # the kill: step 3's first round; steps 1 and 2 were one round each
    assert killed_at["detail"] == f"rollout step {KILLED_STEP}: round 1, 8 live", killed_at
    for step in range(1, KILLED_STEP):
        turns = rollout(baseline, step).non_tensor_batch["agent_turns"]
        assert max(len(t) for t in turns) == 1, f"step {step} ran more than one round"
    # the reward zygote and the tool sandbox's zygote, each the trainer's child, were in the group
    zygotes = [
        member["pid"]
        for member in killed_at["group"]
        if member["ppid"] == killed_at["pid"] and ZYGOTE_BOOT in " ".join(member["argv"])
    ]
    assert len(zygotes) == 2, killed_at["group"]
    assert not any(is_live(member["pid"]) for member in killed_at["group"]), killed_at["group"]

    resumed_group = runs.resume(home)
    resumed_from = f"resumed from {home / 'checkpoints'}/global_step_{SAVE_FREQ}"
    assert resumed_from in (home / "resume.log").read_text(), tail(home / "resume.log")
    for group in (killed_group, resumed_group):
        assert live_members(group) == [], f"process group {group} still runs"
    for step in range(1, STEPS + 1):
        assert RunStore(str(home / "run")).read_journal(step).status == "done", step

    for step in range(KILLED_STEP, STEPS + 1):  # the rollouts trained again, scored inside
        want, got = rollout(baseline, step).batch, rollout(home, step).batch
        for key in (K.RESPONSES, K.RESPONSE_MASK, K.RM_SCORES):
            assert torch.equal(got[key], want[key]), (step, key)
    assert read_latest_step(home / "checkpoints") == STEPS
    verify_checkpoint(home / "checkpoints", STEPS, verify="full")
    expected, got = actor_weights(baseline / "checkpoints"), actor_weights(home / "checkpoints")
    assert expected.keys() == got.keys()
    for name, tensor in expected.items():
        assert torch.equal(got[name], tensor), name
    print(f"\nagent kill resume: {time.monotonic() - started:.0f} s")
