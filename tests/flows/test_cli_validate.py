"""``ppoflow validate``: a model directory on a run's validation set, overrides, and bad inputs
(one line, exit status 2). That the scores on a checkpoint equal the ones the training logged at
that step is tested on a trained run in tests/flows/test_export.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from flows.cli.app import app
from flows.runs.store import RunStore, StepJournal
from stages.config import load_config
from stages.engines.checkpoint import MANIFEST, checkpoint_dir

REPO = Path(__file__).resolve().parents[2]
SPREAD_SCORE = (
    "def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kw):\n"
    "    return float(sum(map(ord, solution_str)) % 5) / 4\n"
)


def validate(*args: str):
    return CliRunner().invoke(app, ["validate", *map(str, args)])


def report(result) -> list[str]:
    """The command's own lines: from ``validation of …`` on (DeepSpeed's logger may print its
    accelerator line to stdout first)."""
    lines = result.stdout.splitlines()
    return lines[next(i for i, line in enumerate(lines) if line.startswith("validation of ")) :]


def one_error_line(result) -> str:
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.exit_code == 2 and len(lines) == 1, (result.exit_code, result.output)
    assert lines[0].startswith("error: ")
    return lines[0]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, make_demo_inputs, tiny_run_overrides) -> Path:
    """A run directory (config of a tiny run on the demo data, one journal) with an actor
    checkpoint manifest of step 1 only; a second validation file of 3 prompts beside it."""
    from stages.data import make_demo_data

    root = make_demo_inputs(tmp_path_factory.mktemp("validate"))
    make_demo_data(root / "small", n_train=4, n_val=3)
    (root / "spread_score.py").write_text(SPREAD_SCORE)
    cfg = load_config(
        REPO / "configs" / "demo-cpu.yaml",
        tiny_run_overrides(
            root, root, 2, f"reward.custom_reward_function.path={root}/spread_score.py"
        ),
    )
    store = RunStore(root / "run")
    store.save_config(cfg)
    store.write_journal(StepJournal(1, status="done"))
    actor = checkpoint_dir(root / "checkpoints", 1, "actor")
    actor.mkdir(parents=True)
    (actor / MANIFEST).write_text(json.dumps({"format": 1, "world_size": 1, "zero_stage": 0}))
    return Path(store.root)


def test_a_model_directory_is_scored_on_the_runs_validation_set(run_dir):
    model = run_dir.parent / "model"
    result = validate(run_dir, "--model", model)
    assert result.exit_code == 0, result.output
    lines = report(result)
    assert lines[0] == f"validation of {run_dir} with {model}: 8 prompts × 1 (greedy)"
    assert lines[1].startswith("val score: ")
    metrics = dict(line.split() for line in lines[2:])
    assert set(metrics) == {
        "val-aux/ppoflow/demo-copy/reward/mean@1",
        "val-core/ppoflow/demo-copy/acc/mean@1",
    }
    # one data source, one sample per prompt: the score is that source's mean reward
    assert lines[1] == f"val score: {metrics['val-aux/ppoflow/demo-copy/reward/mean@1']}"
    assert float(lines[1].split()[-1]) > 0  # the spread scorer gives this model credit


def test_overrides_change_what_is_validated(run_dir):
    small = run_dir.parent / "small" / "val.parquet"
    result = validate(run_dir, "--model", run_dir.parent / "model", f"data.val_files=[{small}]")
    assert result.exit_code == 0, result.output
    assert report(result)[0].endswith(": 3 prompts × 1 (greedy)")


def test_a_step_without_checkpoint_lists_the_saved_steps(run_dir):
    line = one_error_line(validate(run_dir, "--step", "2"))
    assert "no checkpoint of step 2" in line and "[1]" in line


def test_step_or_model_but_not_both_nor_neither(run_dir):
    assert "--step K" in one_error_line(validate(run_dir))
    both = validate(run_dir, "--step", "1", "--model", run_dir.parent / "model")
    assert "not both" in one_error_line(both)


def test_not_a_run_directory(run_dir, tmp_path):
    line = one_error_line(validate(tmp_path, "--model", run_dir.parent / "model"))
    assert "is not a run directory" in line


def test_not_a_model_directory(run_dir, tmp_path):
    line = one_error_line(validate(run_dir, "--model", tmp_path))
    assert "is not a model directory" in line and "config.json" in line


def test_a_bad_override_is_one_config_line(run_dir):
    result = validate(run_dir, "--model", run_dir.parent / "model", "data.val_batch_size=-3")
    assert "invalid config" in one_error_line(result)
