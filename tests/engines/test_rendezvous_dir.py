"""A single rank's rendezvous directory: held by its process, swept once that process is gone."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import time

import pytest

from stages.engines.rendezvous_dir import GRACE_S, OWNER, PREFIX, remove_abandoned, rendezvous_dir

OLD = time.time() + 10 * GRACE_S  # a "now" at which every directory made here is past its grace


def _abandoned(parent, name):
    """A directory as a killed process leaves it: an owner file nobody holds, a store file."""
    path = parent / f"{PREFIX}{name}"
    path.mkdir()
    (path / OWNER).write_text("")
    (path / "store").write_bytes(b"\0" * 8)
    return path


def test_a_directory_whose_owner_lock_nobody_holds_is_removed(tmp_path):
    gone = _abandoned(tmp_path, "killed")
    assert remove_abandoned(tmp_path, now=OLD) == [gone]
    assert not gone.exists()


def test_a_held_directory_stays_whoever_looks(tmp_path):
    """Locks are per open file, so another open of the owner file (here, in this very process)
    cannot take the lock while the holder lives."""
    held = rendezvous_dir(tmp_path)
    assert held.parent == tmp_path and held.name.startswith(PREFIX)
    assert remove_abandoned(tmp_path, now=OLD) == []
    assert (held / OWNER).exists()


def test_new_directories_and_ones_without_an_owner_file_are_left_alone(tmp_path):
    fresh = _abandoned(tmp_path, "fresh")  # just made: its creator may not have locked it yet
    older_ppoflow = tmp_path / f"{PREFIX}no-owner"
    older_ppoflow.mkdir()
    other = tmp_path / "someone-elses"
    other.mkdir()
    (other / OWNER).write_text("")
    assert remove_abandoned(tmp_path) == []
    assert remove_abandoned(tmp_path, now=OLD) == [fresh]
    assert older_ppoflow.exists() and other.exists()


def test_a_new_rendezvous_sweeps_what_a_killed_process_left(tmp_path):
    """A child takes a directory and is killed with SIGKILL (no exit handler runs): its
    directory stays, unlocked; the next rendezvous past the grace period removes it."""
    script = (
        "import time\n"
        "from stages.engines.rendezvous_dir import rendezvous_dir\n"
        f"print(rendezvous_dir(__import__('pathlib').Path({str(tmp_path)!r})), flush=True)\n"
        "time.sleep(60)\n"
    )
    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        left = tmp_path / os.path.basename(child.stdout.readline().strip())
        with open(left / OWNER) as owner, pytest.raises(BlockingIOError):  # held by the child
            fcntl.flock(owner, fcntl.LOCK_EX | fcntl.LOCK_NB)
    finally:
        child.kill()
        child.wait()
    assert left.exists()
    os.utime(left, (time.time() - 2 * GRACE_S,) * 2)
    mine = rendezvous_dir(tmp_path)
    assert not left.exists()
    assert sorted(tmp_path.iterdir()) == [mine]
