"""kill -9 between two generation rounds of a DAPO step resumes to the uninterrupted run.

The run: configs/dapo-cpu.yaml at the tiny size (tests/conftest.py: 4 prompt groups per step,
n 2, 8 response tokens) with rounds of 4 prompts (``data.gen_batch_size`` = the training batch,
so any filtered group takes another round) scored by a scorer whose score depends on the
response's length only (about half the groups have zero spread). 4 steps, a checkpoint after
steps 2 and 4.

One uninterrupted ``ppoflow train`` (the baseline) first; from its round folders the test finds
how many generation rounds steps 1 and 2 ran, and kills a second ``ppoflow train`` (its whole
process group, tests/flows/killpoints/sitecustomize.py) at the ``dapo.round`` point of step 3's
second round: after round 1 of step 3 drew its prompts from the loader and its artifacts were
written, before round 2 draws. Then ``ppoflow resume RUN_DIR`` in place, from step 2's
checkpoint, whose loader state counts every prompt steps 1 and 2 drew.

It must end with the baseline's actor weights at step 4 bit for bit; the same rounds in steps 3
and 4 (their count, prompts and responses); the same loader state in step 4's checkpoint; every
journal done; no temp file of an interrupted write left; no process of either group running.
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
from flows.gen_rounds import RoundStore
from flows.runs.store import RunStore
from stages.engines.checkpoint import checkpoint_dir
from stages.engines.safe_load import weights_only_load

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
KILLPOINTS = Path(__file__).resolve().parent / "killpoints"
STEPS, SAVE_FREQ, KILLED_STEP = 4, 2, 3
SCORER = """
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return float(len(solution_str) % 2 == 0)
"""


class Runs:
    """The baseline, the killed run and its resume, each in ``root/<name>``."""

    def __init__(
        self, root: Path, demo: Path, tiny_run_overrides, api_url: str, process_groups
    ) -> None:
        self.root, self.demo, self.overrides, self.api_url = root, demo, tiny_run_overrides, api_url
        self.groups = process_groups
        self.scorer = root / "scorer.py"
        self.scorer.write_text(SCORER, encoding="utf-8")

    def env(self, home: Path, **extra: str) -> dict[str, str]:
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
            "trainer.test_freq=-1",
            "trainer.val_before_train=false",
            "data.gen_batch_size=4",
            f"reward.custom_reward_function.path={self.scorer}",
        )
        config = REPO / "configs" / "dapo-cpu.yaml"
        command = [sys.executable, "-m", "flows.cli", "train", str(config), *overrides]
        return [*command, "--run-dir", str(home / "run")]

    def train(self, name: str, **extra: str) -> tuple[Path, int, int]:
        home = self.root / name
        home.mkdir()
        status, group = self.groups.run_group(
            self.train_command(home), home, self.env(home, **extra), home / "train.log"
        )
        return home, status, group

    def resume(self, home: Path) -> int:
        log = home / "resume.log"
        command = [sys.executable, "-m", "flows.cli", "resume", str(home / "run")]
        status, group = self.groups.run_group(command, home, self.env(home), log)
        assert status == 0, f"ppoflow resume exited {status}:\n{self.groups.tail(log)}"
        return group


def rounds(home: Path, step: int) -> int:
    return len(list((home / "run" / f"step_{step}").glob("round_*")))


def round_artifact(home: Path, step: int, gen_round: int, stage: str):
    view = RoundStore(RunStore(str(home / "run")), gen_round)
    return load_artifact(view.artifact_path(step, stage))


def checkpoint_state(home: Path) -> dict:
    path = checkpoint_dir(home / "checkpoints", STEPS, "data") / "state.json"
    return json.loads(path.read_text(encoding="utf-8"))


def actor_weights(home: Path) -> dict[str, torch.Tensor]:
    states = (
        checkpoint_dir(home / "checkpoints", STEPS, "actor")
        / "state"
        / "mp_rank_00_model_states.pt"
    )
    return weights_only_load(states, map_location="cpu")["module"]


def test_a_kill_between_generation_rounds_resumes_to_the_uninterrupted_run(
    tmp_path, make_demo_inputs, tiny_run_overrides, prefect_harness, process_groups
):
    from prefect.settings import PREFECT_API_URL

    tail, live_members = process_groups.tail, process_groups.live_members
    runs = Runs(
        tmp_path,
        make_demo_inputs(tmp_path / "demo"),
        tiny_run_overrides,
        PREFECT_API_URL.value(),
        process_groups,
    )
    baseline, status, _ = runs.train("baseline")
    assert status == 0, f"the baseline exited {status}:\n{tail(baseline / 'train.log')}"
    assert rounds(baseline, KILLED_STEP) >= 2, "step 3 kept its groups in one round: no kill point"
    kill_at = f"dapo.round:{rounds(baseline, 1) + rounds(baseline, 2) + 2}"  # step 3, round 2

    kill_log = tmp_path / "kill.jsonl"
    python_path = os.pathsep.join(filter(None, [str(KILLPOINTS), os.environ.get("PYTHONPATH")]))
    home, status, killed_group = runs.train(
        "killed",
        PYTHONPATH=python_path,
        PPOFLOW_TEST_KILL_AT=kill_at,
        PPOFLOW_TEST_KILL_LOG=str(kill_log),
    )
    assert status == -signal.SIGKILL, (
        f"exited {status}, not killed at {kill_at}:\n{tail(home / 'train.log')}"
    )
    (line,) = [json.loads(text) for text in kill_log.read_text().splitlines()]
    assert line["detail"] == f"step {KILLED_STEP}: round 2", line
    assert rounds(home, KILLED_STEP) == 1  # round 1 of step 3 was written, round 2 not begun

    resumed_group = runs.resume(home)
    assert f"global_step_{SAVE_FREQ}" in (home / "resume.log").read_text(), tail(
        home / "resume.log"
    )
    for group in (killed_group, resumed_group):
        assert live_members(group) == [], f"process group {group} still runs"
    store = RunStore(str(home / "run"))
    for step in range(1, STEPS + 1):
        assert store.read_journal(step).status == "done", step
    assert not [p for p in (home / "run").rglob("*") if ".tmp-" in p.name]

    for step in range(KILLED_STEP, STEPS + 1):  # the same rounds, prompts and responses
        assert rounds(home, step) == rounds(baseline, step), step
        for r in range(1, rounds(baseline, step) + 1):
            want, got = (
                round_artifact(baseline, step, r, "rollout"),
                round_artifact(home, step, r, "rollout"),
            )
            assert torch.equal(got.batch["responses"], want.batch["responses"]), (step, r)
    assert checkpoint_state(home)["loader"] == checkpoint_state(baseline)["loader"]
    expected, got = actor_weights(baseline), actor_weights(home)
    assert expected.keys() == got.keys()
    for name, tensor in expected.items():
        assert torch.equal(got[name], tensor), name
