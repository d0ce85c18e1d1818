"""A resume under another schedule than the one that launched rollouts ahead
(flows/rollout_ahead.py ``restored_for``).

A checkpoint of a ``fully_async`` run holds the rollouts it launched ahead. Resumed with the same
pace they are trained on as the uninterrupted run trains on them; resumed on policy or at another
pace they are dropped as stale, counted (``fully_async/count/dropped_stale_samples``, rows) and
their prompts generated again at their steps: no prompt is lost or repeated, and each regenerated
batch has the resumed schedule's staleness.

The fast tests call ``restored_for`` on a recorded state; the slow ones train the tiny demo run
(tests/conftest.py) 4 steps ``fully_async`` (2 batches ahead, a sync every 2 steps, checkpoints
at steps 2 and 4), remove the step-4 checkpoint, and resume from step 2 into a new run directory.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from types import SimpleNamespace as NS

import numpy as np
import pytest

from dataproto import DataProto
from dataproto.artifact import load_artifact, save_artifact
from flows.rollout_ahead import DROPPED_METRIC, restored_for

REPO = Path(__file__).resolve().parents[2]
FULLY_ASYNC = (
    "ppoflow.schedule=fully_async",
    "async_training.staleness_threshold=0",
    "async_training.trigger_parameter_sync_step=2",
    "async_training.partial_rollout=false",
    "actor_rollout_ref.actor.ppo_mini_batch_size=4",
)
COMMON = ("trainer.logger=[console]", "trainer.save_freq=2", "trainer.test_freq=-1")


def _config(schedule: str, depth_scale: float = 0.0, every: int = 2) -> NS:
    return NS(
        ppoflow=NS(schedule=schedule),
        async_training=NS(staleness_threshold=depth_scale, trigger_parameter_sync_step=every),
    )


def _recorded(root: Path) -> dict:
    """A checkpoint's record of two launched rollouts (steps 3 and 4) of a run in ``root``."""
    launches = []
    for step in (3, 4):
        batch = DataProto.from_dict(non_tensors={"uid": np.array([f"p{step}a", f"p{step}b"])})
        ref = save_artifact(batch, str(root / f"step_{step}" / "input"), stage="input")
        launches.append(
            {
                "step": step,
                "input": {"path": f"step_{step}/input", "fingerprint": ref.fingerprint},
                "record": {},
            }
        )
    return {"pace": [2, 2], "launches": launches}


def test_the_same_pace_restores_the_launches_from_the_checkpoints_run(tmp_path) -> None:
    recorded = _recorded(tmp_path)
    restored, requeued, dropped = restored_for(_config("fully_async"), recorded, str(tmp_path))
    assert restored == {**recorded, "root": str(tmp_path)}
    assert (requeued, dropped) == ({}, 0)


@pytest.mark.parametrize(
    "config",
    [_config("on_policy"), _config("one_step_off"), _config("fully_async", 0.0, 4)],
    ids=["on_policy", "one_step_off", "fully_async_other_pace"],
)
def test_another_pace_drops_the_launches_and_gives_their_inputs_back(tmp_path, config) -> None:
    restored, requeued, dropped = restored_for(config, _recorded(tmp_path), str(tmp_path))
    assert restored is None
    assert sorted(requeued) == [3, 4] and dropped == 4
    assert list(requeued[4].non_tensor_batch["uid"]) == ["p4a", "p4b"]


def test_a_checkpoint_without_launches_or_a_recorded_pace_is_kept(tmp_path) -> None:
    assert restored_for(_config("on_policy"), None, str(tmp_path)) == (None, {}, 0)
    empty = {"pace": [2, 2], "launches": []}
    assert restored_for(_config("on_policy"), empty, str(tmp_path)) == (empty, {}, 0)
    older = {k: v for k, v in _recorded(tmp_path).items() if k != "pace"}
    assert restored_for(_config("fully_async", 0.0, 4), older, str(tmp_path))[0]["launches"]


@pytest.fixture(scope="module")
def interrupted(tmp_path_factory, make_demo_inputs, tiny_run_overrides, prefect_harness):
    """``resume(name, *schedule) -> out``: the fully-async run's step-2 checkpoint resumed into
    ``out/<name>`` with ``schedule``; ``out/run`` is the fully-async run itself."""
    from flows.train import train

    root = tmp_path_factory.mktemp("schedule-change")
    demo, out = make_demo_inputs(root / "demo"), root / "out"
    config = str(REPO / "configs" / "demo-cpu.yaml")
    train(config, tiny_run_overrides(demo, out, 4, *FULLY_ASYNC, *COMMON), str(out / "run"))

    def resume(name: str, *schedule: str) -> Path:
        shutil.rmtree(out / "checkpoints" / "global_step_4")  # the last run's: resume from 2
        extra = (*schedule, *COMMON, "trainer.resume_mode=auto")
        train(config, tiny_run_overrides(demo, out, 4, *extra), str(out / name))
        return out

    return resume


def _journal(run: Path, step: int) -> dict:
    return json.loads((run / f"step_{step}" / "journal.json").read_text())


def _metrics(run: Path, step: int) -> dict[str, float]:
    return _journal(run, step)["metrics"]


def _uids(run: Path, step: int) -> list[str]:
    return list(load_artifact(str(run / f"step_{step}" / "input")).non_tensor_batch["uid"])


@pytest.mark.slow
def test_resumed_on_policy_the_launched_batches_are_dropped_counted_and_generated_again(
    interrupted,
) -> None:
    out = interrupted("on_policy", "ppoflow.schedule=on_policy")
    before, after = out / "run", out / "on_policy"
    for step in (3, 4):
        assert _uids(after, step) == _uids(before, step), "the same prompts, generated again"
        assert _metrics(before, step)["lineage/staleness/max"] == step - 1  # by θ_0
        assert _metrics(after, step)["lineage/staleness/max"] == 0.0
    assert _metrics(after, 3)[DROPPED_METRIC] == 16.0  # 2 batches × 4 prompts × n 2
    assert DROPPED_METRIC not in _metrics(after, 4)
    assert not any(name.startswith("fully_async/partial/") for name in _metrics(after, 3))


@pytest.mark.slow
def test_resumed_at_the_same_pace_the_launched_batches_are_trained_on(interrupted) -> None:
    out = interrupted("same", *FULLY_ASYNC)
    before, after = out / "run", out / "same"
    for step in (3, 4):  # the very input batches, their rollouts reused from the first run
        assert (
            _journal(after, step)["input_fingerprint"]
            == _journal(before, step)["input_fingerprint"]
        )
        assert _metrics(after, step)["lineage/staleness/max"] == step - 1
        assert _metrics(after, step)[DROPPED_METRIC] == 0.0
