"""Re-runs and re-trainings you can trust, end to end on the tiny model and the demo task.

- full PPO (critic, GAE) trained twice into one run directory ends with the weights of one
  uninterrupted run: the cached rollouts and log-probs are reused, every update runs again;
- a run resumed into its own directory (the step after the last checkpoint was computed, then
  the process died) ends with the uninterrupted run's weights;
- a scorer file edited in place makes ``ppoflow rerun --from reward`` recompute and say why;
- a copied run directory re-runs from its own files (the original moved away);
- a step input swapped with another step's is refused, naming the file;
- a changed stage source (a copy of the packages with one file edited, run in a subprocess)
  turns that stage into a miss with the file named; an unchanged re-run is all cache hits.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from flows.cli.app import app
from flows.runs.checkpoints import DATA_ROLE, STATE_FILE
from flows.runs.store import RunStore
from flows.step_flow import WEIGHT_WRITER_REASON
from flows.train import train
from stages.engines.checkpoint import checkpoint_dir, write_latest_step
from stages.engines.checkpoint_manifest import STEP_MANIFEST, seal_legacy_checkpoint

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("prefect_harness")]

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "configs" / "demo-cpu.yaml"
STEPS = 3
PPO = (
    "algorithm.adv_estimator=gae",
    "trainer.val_before_train=false",
    "trainer.test_freq=0",
    "trainer.save_freq=1",
)


def weights(checkpoints: Path, step: int, role: str) -> dict[str, torch.Tensor]:
    """A role's parameters in the DeepSpeed checkpoint of ``step`` (ZeRO 0, one rank)."""
    states = checkpoint_dir(checkpoints, step, role) / "state" / "mp_rank_00_model_states.pt"
    return torch.load(states, map_location="cpu", weights_only=False)["module"]


def assert_same_weights(a: Path, b: Path, step: int) -> None:
    for role in ("actor", "critic"):
        left, right = weights(a, step, role), weights(b, step, role)
        assert left.keys() == right.keys()
        for name in left:
            assert torch.equal(left[name], right[name]), f"{role} {name}"


def ppo_train(demo: Path, out: Path, run_dir: Path, tiny_run_overrides, *extra: str):
    return train(
        CONFIG,
        tiny_run_overrides(demo, out, STEPS, *PPO, *extra),
        str(run_dir),
    )


@pytest.fixture(scope="module")
def demo(tmp_path_factory, make_demo_inputs) -> Path:
    return make_demo_inputs(tmp_path_factory.mktemp("trusted"))


@pytest.fixture(scope="module")
def uninterrupted(demo, tmp_path_factory, tiny_run_overrides) -> Path:
    """One full-PPO run of STEPS steps; its checkpoints' directory."""
    out = tmp_path_factory.mktemp("uninterrupted")
    ppo_train(demo, out, out / "run", tiny_run_overrides)
    return out / "checkpoints"


def test_training_twice_into_one_directory_gives_the_uninterrupted_weights(
    demo, uninterrupted, tmp_path, tiny_run_overrides
):
    run_dir = tmp_path / "run"
    ppo_train(demo, tmp_path / "first", run_dir, tiny_run_overrides)
    again = ppo_train(demo, tmp_path / "second", run_dir, tiny_run_overrides)
    store = RunStore(again.run_dir)
    for step in range(1, STEPS + 1):
        records = {r.stage: r for r in store.read_journal(step).stages}
        for stage in ("update_critic", "update_actor"):
            assert (records[stage].status, records[stage].reason) == ("ran", WEIGHT_WRITER_REASON)
    rollout = store.read_journal(1).record("rollout")
    assert rollout.status == "cached", rollout.reason  # seeded: reusable
    assert_same_weights(tmp_path / "second" / "checkpoints", uninterrupted, STEPS)


def test_resuming_into_the_killed_runs_own_directory_gives_the_uninterrupted_weights(
    demo, uninterrupted, tmp_path, tiny_run_overrides, capsys
):
    """The killed run computed step 3 but died before its checkpoint: tracker at 2. Its
    checkpoint's code manifest is made to differ in one file: the resume says so and goes on."""
    run_dir, checkpoints = tmp_path / "run", tmp_path / "out" / "checkpoints"
    ppo_train(demo, tmp_path / "out", run_dir, tiny_run_overrides)
    shutil.rmtree(checkpoints / f"global_step_{STEPS}")
    write_latest_step(checkpoints, STEPS - 1)
    state_file = checkpoint_dir(checkpoints, STEPS - 1, DATA_ROLE) / STATE_FILE
    state = json.loads(state_file.read_text())
    state["code_files"]["stages/advantage.py"] = "0" * 64
    state_file.write_text(json.dumps(state))
    (state_file.parents[1] / STEP_MANIFEST).unlink()  # the edit is the test's own: seal it again
    seal_legacy_checkpoint(state_file.parents[1])
    capsys.readouterr()
    resumed = ppo_train(
        demo, tmp_path / "out", run_dir, tiny_run_overrides, "trainer.resume_mode=auto"
    )
    assert "the code changed since this checkpoint (stages/advantage.py)" in capsys.readouterr().out
    assert [m["training/global_step"] for m in resumed.history] == [float(STEPS)]
    journal = RunStore(resumed.run_dir).read_journal(STEPS)
    assert journal.record("rollout").status == "cached"
    assert journal.record("update_actor").reason == WEIGHT_WRITER_REASON
    assert_same_weights(checkpoints, uninterrupted, STEPS)


# --- re-runs of a GRPO run ----------------------------------------------------------------------


@pytest.fixture
def grpo_run(demo, tmp_path, tiny_run_overrides) -> tuple[Path, Path]:
    """2 GRPO steps scored by a custom reward file that returns 1.0; (run dir, score file)."""
    score = tmp_path / "score.py"
    score.write_text(
        "def compute_score(data_source, solution_str, ground_truth, **kw):\n    return 1.0\n"
    )
    result = train(
        CONFIG,
        tiny_run_overrides(
            demo,
            tmp_path,
            2,
            "trainer.val_before_train=false",
            "trainer.test_freq=0",
            "trainer.save_freq=1",
            f"reward.custom_reward_function.path={score}",
        ),
        str(tmp_path / "run"),
    )
    return Path(result.run_dir), score


def cli(*args: str):
    result = CliRunner().invoke(app, list(args))
    return result


def stage_lines(output: str) -> dict[str, str]:
    lines = {}
    for line in output.splitlines():
        parts = line.split(maxsplit=1)
        if len(parts) == 2 and parts[0] in ("rollout", "reward", "advantage", "old_log_prob"):
            lines[parts[0]] = parts[1]
    return lines


def test_an_edited_scorer_file_is_recomputed_and_the_reason_printed(grpo_run, tmp_path):
    run_dir, score = grpo_run
    unchanged = cli("rerun", str(run_dir), "--step", "1", "--from", "reward", "--to", "reward",
                    "--run-dir", str(tmp_path / "same"))  # fmt: skip
    assert unchanged.exit_code == 0, unchanged.output
    assert "cache hit" in stage_lines(unchanged.output)["reward"]
    assert "engines built: none" in unchanged.output
    score.write_text(score.read_text().replace("1.0", "0.0"))  # edited in place
    edited = cli("rerun", str(run_dir), "--step", "1", "--from", "reward", "--to", "reward",
                 "--run-dir", str(tmp_path / "edited"))  # fmt: skip
    assert edited.exit_code == 0, edited.output
    line = stage_lines(edited.output)["reward"]
    assert line.startswith("ran") and "custom reward file changed" in line, edited.output
    assert "no metric changed" not in edited.output
    assert "reward/score_mean" in edited.output  # 1.0 → 0.0


def test_a_copied_run_directory_reruns_from_its_own_files(grpo_run, tmp_path):
    run_dir, _ = grpo_run
    copy = tmp_path / "copy"
    shutil.copytree(run_dir, copy)
    run_dir.rename(tmp_path / "moved-away")  # nothing may be read from the original
    result = cli("rerun", str(copy), "--step", "2", "--from", "advantage", "--to", "advantage",
                 "--run-dir", str(tmp_path / "branch"))  # fmt: skip
    assert result.exit_code == 0, result.output
    assert f"reused from {copy} step 2" in stage_lines(result.output)["reward"]
    assert "cache hit" in stage_lines(result.output)["advantage"]
    branch = RunStore(tmp_path / "branch").read_journal(2)
    assert branch.record("reward").artifact == f"{copy}/step_2/reward"


def test_a_swapped_step_input_is_refused_naming_the_file(grpo_run, tmp_path):
    run_dir, _ = grpo_run
    one, two = run_dir / "step_1" / "input", run_dir / "step_2" / "input"
    one.rename(tmp_path / "input-1")
    two.rename(one)
    (tmp_path / "input-1").rename(two)
    result = cli("rerun", str(run_dir), "--step", "2", "--from", "reward",
                 "--run-dir", str(tmp_path / "branch"))  # fmt: skip
    assert result.exit_code != 0
    assert f"{two}: holds fingerprint" in result.output and "swapped" in result.output


def test_an_edited_stage_source_is_a_miss_naming_the_file(grpo_run, tmp_path):
    """A copy of the packages with the advantage stage's module edited, first on the import path
    of a ``ppoflow rerun`` subprocess: that stage misses and names the file, the stages whose
    code does not include it hit."""
    run_dir, _ = grpo_run
    code = tmp_path / "code"
    for package in ("dataproto", "stages", "flows"):
        shutil.copytree(
            REPO / package, code / package, ignore=shutil.ignore_patterns("__pycache__")
        )
    edited = code / "stages" / "advantage.py"
    edited.write_text(edited.read_text() + "\n# an edit that a cache must see\n")
    env = {**os.environ, "PYTHONPATH": str(code), "PREFECT_HOME": str(tmp_path / "prefect")}
    completed = subprocess.run(
        [sys.executable, "-m", "flows.cli", "rerun", str(run_dir), "--step", "2",
         "--from", "reward", "--to", "advantage", "--run-dir", str(tmp_path / "branch")],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600,
    )  # fmt: skip
    assert completed.returncode == 0, completed.stdout + completed.stderr
    lines = stage_lines(completed.stdout)
    assert "cache hit" in lines["reward"], completed.stdout  # its code did not change
    assert lines["advantage"].startswith("ran"), completed.stdout
    assert "cache hit" in lines["old_log_prob"], completed.stdout
    assert "stage code changed (stages/advantage.py)" in lines["advantage"]
