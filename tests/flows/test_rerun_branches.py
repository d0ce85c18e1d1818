"""Where a run's re-run branches are found (flows/runs/branches.py), what a failed re-run leaves
(flows/rerun.py's ``removed_on_failure``), and which artifact paths a journal may name
(``RunStore.check_journal_paths``); hand-made run directories, no training.

A branch is a directory whose ``rerun.json`` names its parent; nothing is written into the
parent, so the parent finds its branches beside it, in this machine's branch index, or in the
``branches/`` notes older versions wrote into it.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
import torch

from dataproto import DataProto
from dataproto.artifact import save_artifact
from flows.rerun import open_branch, removed_on_failure
from flows.runs.branches import find_branches, index_dir, note_branch, parent_chain, run_key
from flows.runs.store import RunStore, StageRecord, StepJournal


def branch_of(path: Path, parent: Path | str, step: int) -> str:
    """A branch directory: its rerun.json names ``parent`` and ``step``."""
    store = RunStore(path)
    store.save_json("rerun.json", {"parent_run_dir": str(parent), "step": step, "from": "reward"})
    return store.root


def test_a_branch_beside_its_parent_is_found_without_any_note(tmp_path):
    parent = tmp_path / "run"
    parent.mkdir()
    beside = branch_of(tmp_path / "run-rerun-step3-reward-x", parent, 3)
    branch_of(tmp_path / "other-branch", tmp_path / "another-run", 5)  # another run's branch
    (tmp_path / "damaged-branch").mkdir()
    (tmp_path / "damaged-branch" / "rerun.json").write_text("{not json")  # nobody's: skipped
    assert find_branches(str(parent)) == {beside: 3}
    assert not (parent / "branches").exists() and list(parent.iterdir()) == []


def test_a_branch_elsewhere_is_found_through_the_index(tmp_path):
    parent = tmp_path / "runs" / "run"
    elsewhere = branch_of(tmp_path / "far" / "away" / "branch", parent, 2)
    assert find_branches(str(parent)) == {}  # not beside the parent, not noted
    notes = note_branch(elsewhere, 2, [str(parent)])
    assert notes == [index_dir() / run_key(str(parent)) / f"{run_key(elsewhere)}.json"]
    assert find_branches(str(parent)) == {elsewhere: 2}
    for note in notes:  # written atomically: no temp file left beside it
        assert [p.name for p in note.parent.iterdir()] == [note.name]


def test_a_deleted_or_reused_branch_protects_nothing(tmp_path):
    parent = tmp_path / "runs" / "run"
    gone = str(tmp_path / "far" / "gone")
    reused = branch_of(tmp_path / "far" / "reused", tmp_path / "runs" / "another", 4)
    note_branch(gone, 7, [str(parent)])  # its directory was deleted later
    note_branch(reused, 4, [str(parent)])  # its directory now holds a branch of another run
    assert find_branches(str(parent)) == {}


def test_a_branch_of_a_branch_protects_the_step_up_the_chain(tmp_path):
    """A branch of a branch reuses the first parent's artifacts of the step too; it is noted
    for every run of the chain, so deleting the middle branch leaves the step protected."""
    first = tmp_path / "runs" / "run"
    middle = branch_of(tmp_path / "b" / "middle", first, 3)
    last = branch_of(tmp_path / "c" / "last", middle, 3)
    assert parent_chain(last) == [middle, str(first)]
    note_branch(middle, 3, [str(first)])
    note_branch(last, 3, [middle, str(first)])
    assert find_branches(str(first)) == {middle: 3, last: 3}
    assert find_branches(middle) == {last: 3}
    (Path(middle) / "rerun.json").unlink()  # the middle branch deleted (its rerun.json gone)
    assert find_branches(str(first)) == {last: 3}


def test_a_parent_reached_through_a_link_is_the_same_run(tmp_path):
    parent = tmp_path / "real" / "run"
    parent.mkdir(parents=True)
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "real")
    far = branch_of(tmp_path / "far" / "b", link / "run", 1)  # branched through the link
    note_branch(far, 1, [str(link / "run")])
    beside = branch_of(tmp_path / "real" / "b2", link / "run", 2)
    assert find_branches(str(parent)) == {beside: 2, far: 1}
    assert find_branches(str(link / "run")) == {str(link / "b2"): 2, far: 1}


def test_older_notes_in_the_run_still_protect_and_an_unreadable_one_is_named(tmp_path):
    parent = RunStore(tmp_path / "runs" / "run")
    old = branch_of(tmp_path / "far" / "old", parent.root, 6)
    notes = Path(parent.root) / "branches"
    notes.mkdir(parents=True)
    (notes / "a.json").write_text(json.dumps({"run_dir": old, "step": 6}))
    assert parent.branches() == {old: 6}
    (notes / "b.json").write_text('{"run_dir": 1}')
    with pytest.raises(ValueError, match=re.escape(f"{notes}/b.json: unreadable branch note")):
        parent.branches()


def test_an_unreadable_index_note_is_named(tmp_path):
    parent = str(tmp_path / "runs" / "run")
    folder = index_dir() / run_key(parent)
    folder.mkdir(parents=True)
    (folder / "x.json").write_text("{not json")
    with pytest.raises(ValueError, match=re.escape(f"{folder}/x.json: unreadable branch note")):
        find_branches(parent)


def test_record_branch_notes_in_the_index_not_in_the_run(tmp_path):
    parent = RunStore(tmp_path / "runs" / "run")
    Path(parent.root).mkdir(parents=True)
    branch = branch_of(tmp_path / "far" / "b", parent.root, 2)
    parent.record_branch(branch, 2)
    assert list(Path(parent.root).iterdir()) == []
    assert parent.branches() == {branch: 2}


# --- a failed re-run leaves nothing ---------------------------------------------------------------


def test_a_failure_removes_a_directory_the_block_made(tmp_path):
    target = tmp_path / "branch"
    with pytest.raises(RuntimeError, match="stage failed"), removed_on_failure(str(target)):
        (target / "step_2").mkdir(parents=True)
        (target / "config.json").write_text("{}")
        raise RuntimeError("stage failed")
    assert not target.exists()


def test_a_failure_keeps_what_an_existing_directory_held(tmp_path):
    target = tmp_path / "branch"
    target.mkdir()
    (target / "notes.txt").write_text("mine")
    with pytest.raises(KeyboardInterrupt), removed_on_failure(str(target)):
        (target / "cache").mkdir()
        (target / "rerun.json").write_text("{}")
        raise KeyboardInterrupt
    assert [p.name for p in target.iterdir()] == ["notes.txt"]
    assert (target / "notes.txt").read_text() == "mine"


def test_a_failure_leaves_a_file_of_that_name_alone(tmp_path):
    target = tmp_path / "branch"
    target.write_text("mine")
    with pytest.raises(NotADirectoryError), removed_on_failure(str(target)):
        (target / "config.json").write_text("{}")
    assert target.read_text() == "mine"


def test_a_branch_onto_a_file_or_inside_its_parent_is_refused_before_writing(tmp_path):
    parent = RunStore(tmp_path / "run")
    parent.save_config({"trainer": {}})
    a_file = tmp_path / "notes.txt"
    a_file.write_text("mine")
    with pytest.raises(ValueError, match=re.escape(f"{a_file} is a file; choose a new directory")):
        open_branch(parent, None, str(a_file), {})
    inside = tmp_path / "run" / "branch"
    with pytest.raises(ValueError, match=re.escape(f"{inside} lies inside the run {parent.root}")):
        open_branch(parent, None, str(inside), {})
    assert a_file.read_text() == "mine" and sorted(
        p.name for p in (tmp_path / "run").iterdir()
    ) == ["config.json"]


def test_a_block_that_succeeds_keeps_what_it_wrote(tmp_path):
    target = tmp_path / "branch"
    with removed_on_failure(str(target)):
        target.mkdir()
        (target / "config.json").write_text("{}")
    assert (target / "config.json").is_file()


# --- the artifacts a journal may name ----------------------------------------------------------


def journal_naming(store: RunStore, parent: str | None = None) -> StepJournal:
    """A done step 1 of ``store``: its input in the run, its reward artifact in ``parent``
    (the run itself when None)."""
    batch = DataProto.from_dict({"x": torch.zeros(2, 2)})
    step_input = store.save_input(1, batch)
    owner = RunStore(parent) if parent else store
    reward = save_artifact(batch, owner.artifact_path(1, "reward"), stage="reward", overwrite=True)
    record = StageRecord("reward", "cached", "reused", reward.path, reward.fingerprint)
    journal = StepJournal(1, "done", step_input.path, step_input.fingerprint, [record])
    store.write_journal(journal)
    return store.read_journal(1)


def test_a_journal_names_artifacts_in_its_run_or_the_runs_it_branched_from(tmp_path):
    trained = RunStore(tmp_path / "run")
    assert trained.check_journal_paths(journal_naming(trained)).step == 1
    branch = RunStore(tmp_path / "branch")
    branch_of(tmp_path / "branch", tmp_path / "parent", 1)
    assert branch.check_journal_paths(journal_naming(branch, str(tmp_path / "parent"))).step == 1
    grand = RunStore(tmp_path / "grand")  # a branch of the branch: the chain's runs are allowed
    branch_of(tmp_path / "grand", tmp_path / "branch", 1)
    assert grand.check_journal_paths(journal_naming(grand, str(tmp_path / "parent"))).step == 1


@pytest.mark.parametrize("form", ["absolute", "dot-dot"])
def test_a_journal_naming_an_artifact_outside_is_refused_naming_both(tmp_path, form):
    store = RunStore(tmp_path / "run")
    journal = journal_naming(store, str(tmp_path / "elsewhere"))  # not a run it branched from
    outside = journal.record("reward").artifact
    if form == "dot-dot":
        data = json.loads((tmp_path / "run" / "step_1" / "journal.json").read_text())
        data["stages"][0]["artifact"] = f"../{os.path.relpath(outside, tmp_path)}"
        (tmp_path / "run" / "step_1" / "journal.json").write_text(json.dumps(data))
        journal = store.read_journal(1)
        assert "/../" in journal.record("reward").artifact  # shown with the ".." applied
    expected = (
        f"{store.root}/step_1/journal.json: stage 'reward' names the artifact {outside}, "
        f"outside the run directory; a journal names artifacts in {store.root}"
    )
    with pytest.raises(ValueError, match=re.escape(expected)):
        store.check_journal_paths(journal)
    assert store.check_journal_paths(journal, ["other"]) is journal  # only the stages asked
