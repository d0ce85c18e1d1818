"""``ppoflow resume RUN_DIR``: what it resumes from and the one-line refusals (no training here;
tests/flows/test_mlflow_server.py resumes a killed run for real)."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

import pytest
import typer
from typer.testing import CliRunner

from flows.cli import resume as cli_resume
from flows.cli.resume import open_resumable, resume_config, started_in, working_directory
from flows.runs.checkpoints import save_run_checkpoint, tracking_state
from flows.runs.identity import run_info
from flows.runs.store import RUN_INFO_REQUIRED, RunStore
from stages.config import load_config

KEEP_ALL = SimpleNamespace(max_actor_ckpt_to_keep=None, max_critic_ckpt_to_keep=None)


def app() -> typer.Typer:
    application = typer.Typer()
    cli_resume.register(application)

    @application.command("other")
    def other() -> None:  # a second command keeps `resume` a subcommand
        """Unused."""

    return application


def make_run(root: Path, checkpoints: str, *overrides: str) -> RunStore:
    """A run directory as ppoflow train leaves it (config.json, run_info.json started in
    ``root``), without steps."""
    store = RunStore(root / "runs" / "r1")
    store.save_config(load_config(None, [f"trainer.default_local_dir={checkpoints}", *overrides]))
    with working_directory(str(root)):
        store.save_run_info(run_info({}, store.root, dict.fromkeys(RUN_INFO_REQUIRED)))
    return store


def checkpoint(root: Path, step: int, run_dir: str | None) -> None:
    """The checkpoint of ``step`` under ``root`` (no engines), written by ``run_dir``."""
    identity = {"run_dir": run_dir, **dict.fromkeys(RUN_INFO_REQUIRED)}
    save_run_checkpoint(root, step, {}, tracking_state(identity, {}), KEEP_ALL)


def one_error_line(result) -> str:
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1, result.output
    return lines[0]


def test_a_directory_that_is_not_a_run_is_refused(tmp_path):
    result = CliRunner().invoke(app(), ["resume", str(tmp_path)])
    assert result.exit_code == 2
    line = one_error_line(result)
    assert f"{tmp_path} is not a ppoflow run directory (no config.json)" in line


def test_a_run_without_a_checkpoint_is_refused(tmp_path):
    store = make_run(tmp_path, str(tmp_path / "ckpt"), "trainer.save_freq=5")
    result = CliRunner().invoke(app(), ["resume", store.root])
    assert result.exit_code == 2
    line = one_error_line(result)
    assert f"{store.root} has no checkpoint to resume from" in line
    assert f"{tmp_path / 'ckpt'} holds no latest_checkpointed_iteration.txt" in line
    assert "trainer.save_freq=5" in line


def test_an_override_of_the_resume_mode_is_refused(tmp_path):
    store = make_run(tmp_path, str(tmp_path / "ckpt"))
    result = CliRunner().invoke(app(), ["resume", store.root, "trainer.resume_mode=disable"])
    assert result.exit_code == 2
    assert "drop the override 'trainer.resume_mode=disable'" in one_error_line(result)


def test_the_newest_checkpoint_of_another_run_is_refused(tmp_path):
    store = make_run(tmp_path, str(tmp_path / "ckpt"))
    checkpoint(tmp_path / "ckpt", 2, store.root)
    checkpoint(tmp_path / "ckpt", 4, "/runs/another")  # a later run sharing the folder
    with pytest.raises(ValueError, match="written by the run /runs/another, not "):
        resume_config(store, [])
    result = CliRunner().invoke(app(), ["resume", store.root])
    assert result.exit_code == 2 and "(step 4) was written by the run" in one_error_line(result)


def test_a_run_reached_through_a_link_resumes_its_own_checkpoint(tmp_path):
    """The run directory named through a symbolic link is the run that wrote the checkpoint
    (paths compared resolved), both ways round."""
    store = make_run(tmp_path, str(tmp_path / "ckpt"))
    checkpoint(tmp_path / "ckpt", 2, store.root)
    link = tmp_path / "link"
    link.symlink_to(store.root, target_is_directory=True)
    assert resume_config(open_resumable(str(link)), [])[1] == 2
    checkpoint(tmp_path / "ckpt", 3, str(link))  # trained through the link, resumed by its path
    assert resume_config(store, [])[1] == 3
    checkpoint(tmp_path / "ckpt", 4, str(tmp_path / "elsewhere"))  # still: another run's
    with pytest.raises(ValueError, match=f"written by the run {tmp_path}/elsewhere, not "):
        resume_config(open_resumable(str(link)), [])


def test_resume_takes_the_newest_checkpoint_with_the_overrides(tmp_path):
    store = make_run(tmp_path, str(tmp_path / "ckpt"), "trainer.total_training_steps=4")
    checkpoint(tmp_path / "ckpt", 2, store.root)
    checkpoint(tmp_path / "ckpt", 4, None)  # written before checkpoints named their run
    cfg, step = resume_config(store, ["trainer.total_training_steps=6"])
    assert step == 4 and cfg.trainer.resume_mode == "auto"
    assert cfg.trainer.total_training_steps == 6


def test_relative_config_paths_are_read_where_the_run_started(tmp_path, monkeypatch):
    (tmp_path / "elsewhere").mkdir()
    store = make_run(tmp_path, "ckpt")  # relative to tmp_path, where the run started
    checkpoint(tmp_path / "ckpt", 3, store.root)
    monkeypatch.chdir(tmp_path / "elsewhere")
    assert started_in(open_resumable(store.root)) == str(tmp_path)
    with pytest.raises(ValueError, match="no checkpoint"):
        resume_config(store, [])  # from here "ckpt" is another folder
    with working_directory(started_in(store)):
        assert os.getcwd() == str(tmp_path)
        assert resume_config(store, [])[1] == 3
    assert os.getcwd() == str(tmp_path / "elsewhere")
