"""Artifact retention (flows/runs/retention.py): which steps keep their artifacts, what a pruned step
leaves, and what reading one says; the end-to-end training is slow."""

from __future__ import annotations

import json
import logging
import re
import shutil
from pathlib import Path

import pytest
import torch

from dataproto import DataProto
from dataproto.artifact import save_artifact
from flows.cache.records import REFS_DIR
from flows.rerun import parent_step
from flows.runs.report import RunReportError, run_table, stage_text, step_text
from flows.runs.retention import Retention, RetentionPolicy, kept_steps, protected_steps, prune_step
from flows.runs.store import RunStore, StageRecord, StepJournal
from stages.config import load_config

REPO = Path(__file__).resolve().parents[2]


# --- which steps are kept ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("policy", "protected", "kept"),
    [
        (RetentionPolicy(), set(), list(range(1, 11))),  # both null: nothing pruned
        (RetentionPolicy(keep_last=3), set(), [8, 9, 10]),
        (RetentionPolicy(keep_every=5), set(), [5, 10]),  # keep_last null keeps none by itself
        (RetentionPolicy(keep_last=1, keep_every=3), {1, 5}, [1, 3, 5, 6, 9, 10]),
    ],
)
def test_a_step_is_kept_when_any_rule_keeps_it(policy, protected, kept):
    assert sorted(kept_steps(range(1, 11), 10, policy, protected)) == kept


def test_protected_steps_are_step_one_those_after_a_checkpoint_and_branched_ones(tmp_path):
    store = RunStore(tmp_path / "run")
    for step in (2, 6):
        (tmp_path / "ckpt" / f"global_step_{step}").mkdir(parents=True)
    branch = RunStore(tmp_path / "branch")
    branch.save_json("rerun.json", {"parent_run_dir": store.root, "step": 4})
    store.record_branch(branch.root, 4)
    store.record_branch(str(tmp_path / "deleted-branch"), 9)  # gone: protects nothing
    assert protected_steps(store, tmp_path / "ckpt") == {1, 3, 4, 7}


def test_policy_names_its_settings():
    assert RetentionPolicy(keep_last=2).describe() == (
        "ppoflow.artifacts.keep_last=2, ppoflow.artifacts.keep_every=null"
    )
    cfg = load_config(
        REPO / "configs" / "demo-cpu.yaml",
        ["ppoflow.artifacts.keep_last=3", "ppoflow.artifacts.keep_every=10"],
    )
    assert RetentionPolicy.from_config(cfg) == RetentionPolicy(3, 10)


@pytest.mark.parametrize("key", ["keep_last", "keep_every"])
def test_a_setting_below_one_is_refused(key):
    from stages.config import ConfigError

    with pytest.raises(ConfigError, match=re.escape(f"ppoflow.artifacts.{key}")):
        load_config(REPO / "configs" / "demo-cpu.yaml", [f"ppoflow.artifacts.{key}=0"])


# --- pruning a step --------------------------------------------------------------------------------


def write_step(store: RunStore, step: int) -> StepJournal:
    """Step ``step``: an input and a ``reward`` artifact, a done journal, the stage's cache
    record and reference (as flows/cache/records.py lays them out)."""
    batch = DataProto.from_dict({"x": torch.arange(8.0).reshape(4, 2) + step})
    source = save_artifact(batch, store.input_path(step), stage="input")
    delta = save_artifact(batch, store.artifact_path(step, "reward"), stage="reward")
    key = f"key-{step}"
    for name in (key, f"{REFS_DIR}/{key}"):
        path = Path(store.cache_dir, name)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("{}")
    record = StageRecord(
        "reward", "ran", "cache miss", delta.path, delta.fingerprint, cache_key=key, rows=4
    )
    journal = StepJournal(
        step, "done", source.path, source.fingerprint, [record], metrics={"critic/score/mean": 0.5}
    )
    store.write_journal(journal)
    return journal


@pytest.fixture
def run(tmp_path) -> RunStore:
    store = RunStore(tmp_path / "run")
    for step in range(1, 6):
        write_step(store, step)
    return store


def test_a_pruned_step_keeps_its_journal_and_loses_its_artifacts_and_cache_records(run):
    removed = prune_step(run, 2, RetentionPolicy(keep_last=1))
    step = Path(run.root) / "step_2"
    assert removed == [f"{run.root}/step_2/input", f"{run.root}/step_2/reward"]
    assert sorted(p.name for p in step.iterdir()) == ["journal.json"]
    journal = run.read_journal(2)
    assert journal.pruned == {"keep_last": 1, "keep_every": None}
    assert journal.metrics == {"critic/score/mean": 0.5} and journal.stages[0].fingerprint
    assert (
        not (run.cache_dir / "key-2").exists() and not (run.cache_dir / REFS_DIR / "key-2").exists()
    )
    assert (run.cache_dir / "key-3").exists()  # another step's record stays
    assert (Path(run.root) / "step_3" / "reward" / "manifest.json").is_file()


def test_a_kill_while_deleting_leaves_a_temp_folder_that_the_next_start_removes(run, monkeypatch):
    def killed(path, *args, **kwargs):
        raise KeyboardInterrupt  # the process dies inside the delete

    monkeypatch.setattr(shutil, "rmtree", killed)
    with pytest.raises(KeyboardInterrupt):
        prune_step(run, 2, RetentionPolicy(keep_last=1))
    monkeypatch.undo()
    step = Path(run.root) / "step_2"
    assert run.read_journal(2).pruned is not None  # marked before anything was deleted
    assert (step / ".input.tmp-pruned").is_dir() and (step / "reward").is_dir()
    assert run.remove_temp_files() == [str(step / ".input.tmp-pruned")]
    prune_step(run, 2, RetentionPolicy(keep_last=1))  # the next pass finishes the step
    assert sorted(p.name for p in step.iterdir()) == ["journal.json"]


def test_the_training_pass_prunes_what_no_rule_keeps(run, tmp_path):
    (tmp_path / "ckpt" / "global_step_2").mkdir(parents=True)  # step 3 starts at a checkpoint
    cfg = load_config(
        REPO / "configs" / "demo-cpu.yaml",
        ["ppoflow.artifacts.keep_last=1", f"trainer.default_local_dir={tmp_path}/ckpt"],
    )
    retention = Retention.open(run, cfg)
    assert retention.candidates == {1, 2, 3, 4, 5}
    assert retention.after_step(5) == [2, 4]
    write_step(run, 6)
    assert retention.after_step(6) == [5]
    shutil.rmtree(tmp_path / "ckpt" / "global_step_2")  # checkpoint retention deleted it
    assert retention.after_step(6) == [3]
    assert Retention.open(run, cfg).candidates == {1, 6}  # a restart lists what is left


def test_an_unreadable_branch_note_pauses_retention_with_one_warning(run, tmp_path, caplog):
    notes = Path(run.root) / "branches"
    notes.mkdir()
    (notes / "x.json").write_text("{not json")
    cfg = load_config(
        REPO / "configs" / "demo-cpu.yaml",
        ["ppoflow.artifacts.keep_last=1", f"trainer.default_local_dir={tmp_path}/ckpt"],
    )
    retention = Retention.open(run, cfg)
    with caplog.at_level(logging.WARNING, logger="flows.runs.retention"):
        assert retention.after_step(5) == [] and retention.after_step(5) == []
    warnings = [r.getMessage() for r in caplog.records if r.name == "flows.runs.retention"]
    assert len(warnings) == 1 and f"{notes}/x.json: unreadable branch note" in warnings[0]
    assert all((Path(run.root) / f"step_{k}" / "input").is_dir() for k in range(1, 6))


def test_retention_off_prunes_nothing(run, tmp_path):
    retention = Retention.open(run, load_config(REPO / "configs" / "demo-cpu.yaml"))
    assert retention.after_step(5) == [] and retention.candidates == set()
    assert all((Path(run.root) / f"step_{k}" / "input").is_dir() for k in range(1, 6))


# --- reading a pruned step -------------------------------------------------------------------------


def test_rerun_and_inspect_of_a_pruned_step_name_the_settings(run):
    prune_step(run, 2, RetentionPolicy(keep_last=1, keep_every=4))
    settings = "ppoflow.artifacts.keep_last=1, ppoflow.artifacts.keep_every=4"
    expected = f"step 2 of {run.root} has no artifacts: retention pruned them ({settings})"
    with pytest.raises(ValueError, match=re.escape(expected)):
        parent_step(run, 2)
    assert parent_step(run, 3).step == 3
    with pytest.raises(RunReportError, match="retention pruned them"):
        stage_text(run, 2, "reward")
    assert "step         2 (done, artifacts pruned by retention)" in step_text(run, 2)
    table = run_table(run)
    assert f"artifacts    kept for steps 1, 3-5; 1 steps pruned by {settings}" in table
    assert json.loads((Path(run.root) / "step_2" / "journal.json").read_text())["pruned"] == {
        "keep_last": 1,
        "keep_every": 4,
    }
    assert "pruned" not in json.loads((Path(run.root) / "step_3" / "journal.json").read_text())


# --- a training ------------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_training_keeps_what_retention_says_and_reruns_a_kept_step(
    tmp_path, make_demo_inputs, tiny_run_overrides, prefect_harness
):
    """4 steps, a checkpoint after step 2 (and 4), keep_last=1: steps 1 (the base models), 3
    (after the checkpoint) and 4 (the newest) keep their artifacts, step 2 is pruned; a re-run
    of step 2 is refused naming the setting, one of step 3 runs and protects nothing more."""
    from flows.rerun import rerun
    from flows.train import train

    root = make_demo_inputs(tmp_path)
    overrides = tiny_run_overrides(
        root, root, 4, "trainer.save_freq=2", "ppoflow.artifacts.keep_last=1"
    )
    result = train(REPO / "configs" / "demo-cpu.yaml", overrides, str(tmp_path / "run"))
    store = RunStore(result.run_dir)
    pruned = [step for step in store.steps() if store.read_journal(step).pruned is not None]
    assert pruned == [2]
    assert sorted(p.name for p in (Path(store.root) / "step_2").iterdir()) == ["journal.json"]
    for step in (1, 3, 4):
        assert (Path(store.root) / f"step_{step}" / "rollout" / "manifest.json").is_file()
    keys = [r.cache_key for r in store.read_journal(2).stages if r.cache_key]
    assert keys and not any((store.cache_dir / key).exists() for key in keys)
    assert all((store.cache_dir / r.cache_key).exists() for r in store.read_journal(3).stages if r.cache_key)  # fmt: skip
    with pytest.raises(ValueError, match=re.escape("ppoflow.artifacts.keep_last=1")):
        rerun(store.root, 2, "advantage", new_run_dir=str(tmp_path / "branch2"))
    branch = rerun(store.root, 3, "advantage", new_run_dir=str(tmp_path / "branch3"))
    assert store.branches() == {branch.run_dir: 3}


def test_a_step_that_cannot_be_deleted_is_one_warning_and_tried_again(run, tmp_path, monkeypatch, caplog):  # fmt: skip
    cfg = load_config(
        REPO / "configs" / "demo-cpu.yaml",
        ["ppoflow.artifacts.keep_last=1", f"trainer.default_local_dir={tmp_path}/ckpt"],
    )
    retention = Retention.open(run, cfg)
    real = RunStore.remove_step_artifacts

    def refused(store, step):
        if step == 3:
            raise PermissionError(13, "Permission denied", f"{store.root}/step_3/input")
        return real(store, step)

    monkeypatch.setattr(RunStore, "remove_step_artifacts", refused)
    with caplog.at_level(logging.WARNING, logger="flows.runs.retention"):
        assert retention.after_step(5) == [2, 4]  # 1 is step one; 3 refused
        assert retention.after_step(5) == []
    warnings = [r.getMessage() for r in caplog.records if r.name == "flows.runs.retention"]
    assert (
        len(warnings) == 1 and "could not prune step 3 ([Errno 13] Permission denied" in warnings[0]
    )
    monkeypatch.undo()
    assert retention.after_step(5) == [3]  # tried again once it can be deleted
