"""``ppoflow resume LINK``, LINK a symbolic link to the run directory: the run resumes its own
checkpoint (the directories are compared resolved, flows/cli/resume.py) and trains on in place.
A one-step training of the tiny model, then its resume to two steps."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from flows.cli.app import app
from flows.runs.store import RunStore
from flows.train import train

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("prefect_harness")]

REPO = Path(__file__).resolve().parents[2]


def test_resume_through_a_link_to_the_run_directory(tmp_path, make_demo_inputs, tiny_run_overrides):
    demo = make_demo_inputs(tmp_path / "demo")
    run_dir = tmp_path / "runs" / "run"
    overrides = tiny_run_overrides(demo, tmp_path, 1, "trainer.val_before_train=false")
    train(REPO / "configs" / "demo-cpu.yaml", overrides, str(run_dir))
    link = tmp_path / "link"
    link.symlink_to(run_dir, target_is_directory=True)

    result = CliRunner().invoke(app, ["resume", str(link), "trainer.total_training_steps=2"])
    assert result.exit_code == 0, result.output
    assert "written by the run" not in result.output
    assert result.output.strip().splitlines()[-1] == str(link)
    store = RunStore(run_dir)
    assert store.steps() == [1, 2] and store.read_journal(2).status == "done"
