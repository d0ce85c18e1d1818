"""kill -9 of a run whose rollouts are launched ahead, while a step trains and later steps'
rollouts run on the replica, resumes to the uninterrupted run.

Three schedules (flows/rollout_ahead.py) on configs/demo-cpu.yaml at the tiny size
(tests/conftest.py: 4 prompts × n 2 per step, 8 response tokens), each with a checkpoint every
2 steps, which waits for the rollouts launched ahead and records them:

- ``one_step_off``, 4 steps, ``bypass_mode=false`` (the trainer recomputes the old log-probs:
  tests/flows/test_one_step_off.py runs the default, bypass); the checkpoint after step 2 holds
  batch 3;
- ``fully_async`` with ``staleness_threshold=0``, ``trigger_parameter_sync_step=2`` and
  ``partial_rollout=false``: 2 batches ahead, a sync every 2 steps, 6 steps; the checkpoint
  after step 2 holds batches 3 and 4;
- ``partial``: the same with partial rollouts (verl's default, flows/partial_rollout.py): step
  3's sync cuts batch 4 halfway, so the checkpoint after step 2 holds batch 3 and batch 4's
  first half.

One uninterrupted ``ppoflow train`` per schedule (the baseline) first; then, for each kill
point, a second one whose process group is SIGKILLed there (tests/flows/killpoints/
sitecustomize.py), and ``ppoflow resume RUN_DIR`` in place from step 2's checkpoint.
``rollout.start:N`` is the N-th rollout's start (the launches on the lane's thread);
``replica.sync:N`` / ``replica.synced:N`` the N-th weight sync of the replica (the first is θ_0's
when the replica opens), before it and once it returned.

Each must end with the baseline's actor weights at the last step bit for bit; the same step
inputs (fingerprints) and responses in every step — the ledger: every prompt trained exactly
once, in the baseline's order; the same loader state in the last checkpoint; every journal
done; no process of either group running. CI (``make test-slow``) runs :data:`REPRESENTATIVE`;
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
from flows.runs.store import RunStore, resolve_in_root
from stages.engines.checkpoint import checkpoint_dir
from stages.engines.safe_load import weights_only_load

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
KILLPOINTS = Path(__file__).resolve().parent / "killpoints"
SAVE_FREQ = 2
FULLY_ASYNC = (
    "ppoflow.schedule=fully_async",
    "async_training.staleness_threshold=0",
    "async_training.trigger_parameter_sync_step=2",
    "actor_rollout_ref.actor.ppo_mini_batch_size=4",
)
#: schedule → (steps, overrides, the batches step 2's checkpoint holds whole, those it holds
#: part of: a partial rollout's segments done)
SCHEDULES = {
    "one_step_off": (
        4,
        ("ppoflow.schedule=one_step_off", "algorithm.rollout_correction.bypass_mode=false"),
        [3],
        [],
    ),
    "fully_async": (6, (*FULLY_ASYNC, "async_training.partial_rollout=false"), [3, 4], []),
    "partial": (6, FULLY_ASYNC, [3], [4]),
}
POINTS = (
    ("one_step_off", "checkpoint.saved:1"),  # step 2's checkpoint complete, step 3 not begun
    ("one_step_off", "reward.start:3"),  # step 3 scores the restored batch, batch 4 in flight
    ("one_step_off", "rollout.start:4"),  # batch 4 launched, step 3 training
    ("one_step_off", "rollout.computed:4"),  # batch 4 computed, its artifact being written
    ("one_step_off", "update_actor.start:3"),  # step 3's update, batch 4 in flight or done
    ("fully_async", "rollout.start:5"),  # batch 5 launched in step 3 after its sync
    ("fully_async", "update_actor.start:4"),  # step 4 (no sync), batch 6 in flight or done
    ("fully_async", "checkpoint.saved:1"),  # step 2's checkpoint (batches 3, 4) complete
    ("one_step_off", "replica.sync:3"),  # step 3 about to sync θ_2 into the replica
    ("one_step_off", "replica.synced:4"),  # step 4's sync of θ_3 done, batch 5 not launched
    ("one_step_off", "old_log_prob.start:3"),  # step 3's trainer log-probs, batch 4 in flight
    ("one_step_off", "advantage.computed:3"),  # step 3's advantages computed, not yet written
    ("fully_async", "replica.sync:2"),  # step 3's sync of θ_2, batches 3 and 4 launched
    ("fully_async", "replica.synced:2"),  # step 3's sync of θ_2 done, batch 5 not launched
    ("fully_async", "reward.start:4"),  # step 4 (no sync) scores batch 4, batch 6 in flight
    ("partial", "checkpoint.saved:1"),  # step 2's checkpoint: batch 3, half of batch 4
    ("partial", "replica.synced:2"),  # step 3's sync of θ_2 done, batch 4's rest not queued
    ("partial", "rollout.start:4"),  # batch 4's second half, on θ_2, in step 3
    ("partial", "update_actor.start:4"),  # step 4; batch 6's first half on θ_2 in flight or done
)
#: the part CI runs, one point per schedule: an update beside a launched rollout, and a launch on
#: the lane's thread
REPRESENTATIVE = (
    ("one_step_off", "update_actor.start:3"),
    ("fully_async", "rollout.start:5"),
    ("partial", "rollout.start:4"),
)
SELECTED = POINTS if os.environ.get("PPOFLOW_KILL_MATRIX") == "all" else REPRESENTATIVE


class Runs:
    """The baselines and the killed runs, each in ``root/<name>``."""

    def __init__(self, root: Path, demo: Path, overrides, api_url: str, groups) -> None:
        self.root, self.demo, self.overrides, self.api_url = root, demo, overrides, api_url
        self.groups = groups
        self.baselines: dict[str, Path] = {}

    def env(self, home: Path, **extra: str) -> dict[str, str]:
        return {
            **os.environ,
            "PREFECT_HOME": str(self.root / "prefect-home"),
            "PREFECT_API_URL": self.api_url,
            "HF_HUB_OFFLINE": "1",
            "OMP_NUM_THREADS": "1",
            **extra,
        }

    def train(self, schedule: str, name: str, **extra: str) -> tuple[Path, int, int]:
        steps, schedule_overrides, _, _ = SCHEDULES[schedule]
        home = self.root / name
        home.mkdir()
        overrides = self.overrides(
            self.demo,
            home,
            steps,
            *schedule_overrides,
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

    def baseline(self, schedule: str) -> Path:
        if schedule not in self.baselines:
            home, status, _ = self.train(schedule, f"baseline-{schedule}")
            assert status == 0, f"exited {status}:\n{self.groups.tail(home / 'train.log')}"
            self.baselines[schedule] = home
        return self.baselines[schedule]

    def resume(self, home: Path) -> int:
        log = home / "resume.log"
        command = [sys.executable, "-m", "flows.cli", "resume", str(home / "run")]
        status, group = self.groups.run_group(command, home, self.env(home), log)
        assert status == 0, f"ppoflow resume exited {status}:\n{self.groups.tail(log)}"
        return group


def checkpoint_state(home: Path, step: int) -> dict:
    path = checkpoint_dir(home / "checkpoints", step, "data") / "state.json"
    return json.loads(path.read_text(encoding="utf-8"))


def actor_weights(home: Path, step: int) -> dict[str, torch.Tensor]:
    states = checkpoint_dir(home / "checkpoints", step, "actor") / "state"
    return weights_only_load(states / "mp_rank_00_model_states.pt", map_location="cpu")["module"]


def prompt_indices(store: RunStore, step: int) -> list[int]:
    """The dataset index of each prompt of the step (one per group of n rows)."""
    inputs = load_artifact(store.read_journal(step).input_artifact)
    return [int(info["index"]) for info in inputs.non_tensor_batch["extra_info"][::2]]


@pytest.fixture(scope="module")
def runs(tmp_path_factory, make_demo_inputs, tiny_run_overrides, prefect_harness, process_groups):
    from prefect.settings import PREFECT_API_URL

    root = tmp_path_factory.mktemp("schedule-kill")
    return Runs(
        root,
        make_demo_inputs(root / "demo"),
        tiny_run_overrides,
        PREFECT_API_URL.value(),
        process_groups,
    )


@pytest.mark.parametrize("schedule", sorted(SCHEDULES))
def test_the_checkpoint_records_the_launched_rollouts(runs, schedule) -> None:
    steps, _, held, partial = SCHEDULES[schedule]
    baseline = runs.baseline(schedule)
    launches = checkpoint_state(baseline, SAVE_FREQ)["rollout_ahead"]["launches"]
    assert [launch["step"] for launch in launches] == sorted(held + partial)
    store = RunStore(str(baseline / "run"))
    for launch in launches:
        if launch["step"] in partial:  # its first half, on θ_0: the sync of step 3 cuts it
            assert [s["version"] for s in launch["partial"]["segments"]] == [0], launch
            columns = load_artifact(
                resolve_in_root(launch["partial"]["columns"]["path"], store.root)
            )
            assert columns.batch["responses"].shape[1] == 4  # of R = 8
        else:
            assert launch["record"]["stage"] == "rollout"
        assert (
            launch["input"]["fingerprint"] == store.read_journal(launch["step"]).input_fingerprint
        )
    pace = [1, 1] if schedule == "one_step_off" else [2, 2]  # (D, T) that launched them
    assert checkpoint_state(baseline, SAVE_FREQ)["rollout_ahead"]["pace"] == pace
    assert checkpoint_state(baseline, steps)["rollout_ahead"] == {"pace": pace, "launches": []}
    seen = [index for step in range(1, steps + 1) for index in prompt_indices(store, step)]
    assert len(seen) == len(set(seen)) == 4 * steps  # each prompt once


@pytest.mark.parametrize(("schedule", "kill_at"), SELECTED, ids=lambda value: str(value))
def test_a_kill_resumes_to_the_uninterrupted_run(
    runs, schedule, kill_at, tmp_path, process_groups
) -> None:
    steps, _, held, _ = SCHEDULES[schedule]
    baseline = runs.baseline(schedule)
    kill_log = tmp_path / "kill.jsonl"
    python_path = os.pathsep.join(filter(None, [str(KILLPOINTS), os.environ.get("PYTHONPATH")]))
    home, status, killed_group = runs.train(
        schedule,
        f"killed-{schedule}-{kill_at.replace(':', '-')}",
        PYTHONPATH=python_path,
        PPOFLOW_TEST_KILL_AT=kill_at,
        PPOFLOW_TEST_KILL_LOG=str(kill_log),
    )
    assert status == -signal.SIGKILL, (
        f"exited {status}, not killed at {kill_at}:\n{process_groups.tail(home / 'train.log')}"
    )
    (line,) = [json.loads(text) for text in kill_log.read_text().splitlines()]
    assert line["point"] == kill_at.rpartition(":")[0], line

    resumed_group = runs.resume(home)
    log = (home / "resume.log").read_text()
    assert f"global_step_{SAVE_FREQ}" in log, process_groups.tail(home / "resume.log")
    for group in (killed_group, resumed_group):
        assert process_groups.live_members(group) == [], f"process group {group} still runs"

    store, want = RunStore(str(home / "run")), RunStore(str(baseline / "run"))
    for step in range(1, steps + 1):
        journal, expected = store.read_journal(step), want.read_journal(step)
        assert journal.status == "done", step
        assert journal.input_fingerprint == expected.input_fingerprint, step
        got = load_artifact(store.artifact_path(step, "rollout")).batch
        expected_rollout = load_artifact(want.artifact_path(step, "rollout")).batch
        assert got.keys() == expected_rollout.keys(), step
        for key in ("responses", "rollout_policy_versions"):
            if key in got.keys():  # noqa: SIM118
                assert torch.equal(got[key], expected_rollout[key]), (step, key)
    for step in held:  # trained on the batches the checkpoint held
        assert store.read_journal(step).record("rollout").reason.startswith("reused from the")
    assert checkpoint_state(home, steps)["loader"] == checkpoint_state(baseline, steps)["loader"]
    expected_weights, got_weights = actor_weights(baseline, steps), actor_weights(home, steps)
    assert expected_weights.keys() == got_weights.keys()
    for name, tensor in expected_weights.items():
        assert torch.equal(got_weights[name], tensor), name
