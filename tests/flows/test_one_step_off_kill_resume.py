"""kill -9 of a one-step-off run, while step k trains and step k + 1's rollout runs, resumes to
the uninterrupted run.

The run: configs/demo-cpu.yaml at the tiny size (tests/conftest.py: 4 prompts × n 2 per step, 8
response tokens) with ``ppoflow.schedule=one_step_off`` and ``bypass_mode=false`` (the old
log-probs recomputed by the trainer: tests/flows/test_one_step_off.py runs the default, bypass),
4 steps, a checkpoint after steps 2 and 4. The checkpoint after step 2 waits for step 3's rollout (launched during step 2) and
records it (flows/rollout_ahead.py).

One uninterrupted ``ppoflow train`` (the baseline) first; then, for each kill point, a second
one whose process group is SIGKILLed there (tests/flows/killpoints/sitecustomize.py), and
``ppoflow resume RUN_DIR`` in place from step 2's checkpoint. Points (``rollout.start:4`` is
the launch of step 4's rollout, on the launch thread during step 3):

==========================  ==============================================================
``checkpoint.saved:1``      step 2's checkpoint complete, step 3 not begun
``reward.start:3``          step 3 scores the restored batch, step 4's rollout in flight
``rollout.start:4``         step 4's rollout launched, step 3 training
``rollout.computed:4``      step 4's rollout computed, its artifact being written
``update_actor.start:3``    step 3's update, step 4's rollout in flight or done
==========================  ==============================================================

Each must end with the baseline's actor weights at step 4 bit for bit; the same step inputs
(fingerprints) and responses in every step — the ledger: every prompt trained exactly once, in
the baseline's order; the same loader state in step 4's checkpoint; every journal done; no
process of either group running. CI (``make test-slow``) runs :data:`REPRESENTATIVE`;
``make test-kill-matrix`` (``PPOFLOW_KILL_MATRIX=all``) every point.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import pytest
import torch

from dataproto.artifact import load_artifact
from flows.runs.store import RunStore
from stages.engines.checkpoint import checkpoint_dir
from stages.engines.safe_load import weights_only_load

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
KILLPOINTS = Path(__file__).resolve().parent / "killpoints"
STEPS, SAVE_FREQ = 4, 2
POINTS = (
    "checkpoint.saved:1",
    "reward.start:3",
    "rollout.start:4",
    "rollout.computed:4",
    "update_actor.start:3",
)
#: the part CI runs: the launch on its thread, and the update beside it
REPRESENTATIVE = ("rollout.start:4", "update_actor.start:3")
SELECTED = POINTS if os.environ.get("PPOFLOW_KILL_MATRIX") == "all" else REPRESENTATIVE


class Runs:
    """The baseline and the killed runs, each in ``root/<name>``."""

    def __init__(self, root: Path, demo: Path, overrides, api_url: str, groups) -> None:
        self.root, self.demo, self.overrides, self.api_url = root, demo, overrides, api_url
        self.groups = groups

    def env(self, home: Path, **extra: str) -> dict[str, str]:
        return {
            **os.environ,
            "PREFECT_HOME": str(self.root / "prefect-home"),
            "PREFECT_API_URL": self.api_url,
            "HF_HUB_OFFLINE": "1",
            "OMP_NUM_THREADS": "1",
            **extra,
        }

    def train(self, name: str, **extra: str) -> tuple[Path, int, int]:
        home = self.root / name
        home.mkdir()
        overrides = self.overrides(
            self.demo,
            home,
            STEPS,
            "ppoflow.schedule=one_step_off",
            "algorithm.rollout_correction.bypass_mode=false",  # the recompute path (decoupled)
            f"trainer.save_freq={SAVE_FREQ}",
            "trainer.test_freq=-1",
            "trainer.val_before_train=false",
            "trainer.logger=[console]",
        )
        config = REPO / "configs" / "demo-cpu.yaml"
        command = [sys.executable, "-m", "flows.cli", "train", str(config), *overrides]
        command += ["--run-dir", str(home / "run")]
        status, group = self.groups.run_group(
            command, home, self.env(home, **extra), home / "train.log"
        )
        return home, status, group

    def resume(self, home: Path) -> int:
        log = home / "resume.log"
        command = [sys.executable, "-m", "flows.cli", "resume", str(home / "run")]
        status, group = self.groups.run_group(command, home, self.env(home), log)
        assert status == 0, f"ppoflow resume exited {status}:\n{self.groups.tail(log)}"
        return group


def checkpoint_state(home: Path, step: int) -> dict:
    path = checkpoint_dir(home / "checkpoints", step, "data") / "state.json"
    return json.loads(path.read_text(encoding="utf-8"))


def actor_weights(home: Path) -> dict[str, torch.Tensor]:
    states = checkpoint_dir(home / "checkpoints", STEPS, "actor") / "state"
    return weights_only_load(states / "mp_rank_00_model_states.pt", map_location="cpu")["module"]


def prompt_indices(store: RunStore, step: int) -> list[int]:
    """The dataset index of each prompt of the step (one per group of n rows)."""
    inputs = load_artifact(store.read_journal(step).input_artifact)
    return [int(info["index"]) for info in inputs.non_tensor_batch["extra_info"][::2]]


@pytest.fixture(scope="module")
def runs(tmp_path_factory, make_demo_inputs, tiny_run_overrides, prefect_harness, process_groups):
    from prefect.settings import PREFECT_API_URL

    root = tmp_path_factory.mktemp("one-step-off-kill")
    runs = Runs(
        root,
        make_demo_inputs(root / "demo"),
        tiny_run_overrides,
        PREFECT_API_URL.value(),
        process_groups,
    )
    baseline, status, _ = runs.train("baseline")
    assert status == 0, (
        f"the baseline exited {status}:\n{process_groups.tail(baseline / 'train.log')}"
    )
    return runs, baseline


def test_the_checkpoint_records_the_launched_rollout(runs) -> None:
    _, baseline = runs
    launched = checkpoint_state(baseline, SAVE_FREQ)["rollout_ahead"]
    assert launched["step"] == SAVE_FREQ + 1
    assert launched["record"]["stage"] == "rollout"
    store = RunStore(str(baseline / "run"))
    assert launched["input"]["fingerprint"] == store.read_journal(3).input_fingerprint
    assert checkpoint_state(baseline, STEPS)["rollout_ahead"] is None  # the last step: none
    seen = [index for step in range(1, STEPS + 1) for index in prompt_indices(store, step)]
    assert len(seen) == len(set(seen)) == 4 * STEPS  # each prompt once


@pytest.mark.parametrize("kill_at", SELECTED)
def test_a_kill_resumes_to_the_uninterrupted_run(runs, kill_at, tmp_path, process_groups) -> None:
    runner, baseline = runs
    kill_log = tmp_path / "kill.jsonl"
    python_path = os.pathsep.join(filter(None, [str(KILLPOINTS), os.environ.get("PYTHONPATH")]))
    home, status, killed_group = runner.train(
        f"killed-{kill_at.replace(':', '-')}",
        PYTHONPATH=python_path,
        PPOFLOW_TEST_KILL_AT=kill_at,
        PPOFLOW_TEST_KILL_LOG=str(kill_log),
    )
    assert status == -signal.SIGKILL, (
        f"exited {status}, not killed at {kill_at}:\n{process_groups.tail(home / 'train.log')}"
    )
    (line,) = [json.loads(text) for text in kill_log.read_text().splitlines()]
    assert line["point"] == kill_at.rpartition(":")[0], line

    resumed_group = runner.resume(home)
    log = (home / "resume.log").read_text()
    assert f"global_step_{SAVE_FREQ}" in log, process_groups.tail(home / "resume.log")
    for group in (killed_group, resumed_group):
        assert process_groups.live_members(group) == [], f"process group {group} still runs"

    store, want = RunStore(str(home / "run")), RunStore(str(baseline / "run"))
    for step in range(1, STEPS + 1):
        journal, expected = store.read_journal(step), want.read_journal(step)
        assert journal.status == "done", step
        assert journal.input_fingerprint == expected.input_fingerprint, step
        got = load_artifact(store.artifact_path(step, "rollout")).batch["responses"]
        assert torch.equal(
            got, load_artifact(want.artifact_path(step, "rollout")).batch["responses"]
        )
    assert store.read_journal(3).record("rollout").reason.startswith("reused from the rollout")
    assert checkpoint_state(home, STEPS)["loader"] == checkpoint_state(baseline, STEPS)["loader"]
    expected_weights, got_weights = actor_weights(baseline), actor_weights(home)
    assert expected_weights.keys() == got_weights.keys()
    for name, tensor in expected_weights.items():
        assert torch.equal(got_weights[name], tensor), name
