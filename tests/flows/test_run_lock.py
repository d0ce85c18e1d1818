"""The run directory's lock (flows/runs/lock.py) and what a training does with it."""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
import threading
import time

import pytest
from typer.testing import CliRunner

from flows.cli.app import app as ppoflow_app
from flows.runs.lock import LOCK_FILE, RunDirInUse, RunLock, lock_held, lock_run_dir
from flows.runs.store import RunStore


def test_a_second_lock_is_refused_naming_the_holder(tmp_path):
    first = RunLock(tmp_path / "run")
    with pytest.raises(RunDirInUse) as refused:
        RunLock(tmp_path / "run")
    message = str(refused.value)
    assert message.startswith(f"run directory {tmp_path / 'run'} is in use by another training")
    assert f"pid {os.getpid()} on " in message and message.endswith("pass another --run-dir")
    first.release()
    first.release()  # idempotent
    RunLock(tmp_path / "run").release()  # free again


def test_the_lock_dies_with_its_holder(tmp_path):
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import sys, time; from flows.runs.lock import RunLock; RunLock(sys.argv[1]); "
         "print('held', flush=True); time.sleep(600)", str(tmp_path)],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert holder.stdout.readline() == "held\n"
    with pytest.raises(RunDirInUse, match=f"pid {holder.pid} "):
        RunLock(tmp_path)
    os.kill(holder.pid, signal.SIGKILL)
    holder.wait()
    time.sleep(0.05)
    RunLock(tmp_path).release()
    assert (tmp_path / LOCK_FILE).read_text() == ""  # released: no holder written


def test_a_url_run_dir_has_no_lock():
    assert lock_run_dir("memory://runs/r", is_local=False) is None


def test_a_second_training_into_a_locked_run_dir_fails_before_writing(prefect_harness, tmp_path):
    held = RunLock(tmp_path / "run")
    try:
        result = CliRunner().invoke(
            ppoflow_app, ["train", "demo-cpu", "--run-dir", str(tmp_path / "run")]
        )
    finally:
        held.release()
    assert result.exit_code == 1
    errors = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "is in use by another training" in errors[0], result.output
    assert not (tmp_path / "run" / "config.json").exists()


def test_temp_files_of_interrupted_writes_are_removed(tmp_path):
    store = RunStore(tmp_path / "run")
    (tmp_path / "run" / "step_3" / ".rollout.tmp-0123456789ab").mkdir(parents=True)
    (tmp_path / "run" / "step_3" / ".rollout.tmp-0123456789ab" / "part.npy").write_bytes(b"x")
    (tmp_path / "run" / "step_3" / ".tmp-journal").write_text("{")
    (tmp_path / "run" / ".tmp-config").write_text("{")
    (tmp_path / "run" / "step_3" / "rollout").mkdir()
    (store.cache_dir / "refs").mkdir(parents=True)
    (store.cache_dir / ".e95409ad.tmp-blthrmve").write_text("{")  # a cache record's write
    (store.cache_dir / "refs" / ".e95409ad.tmp-x1y2z3").write_text("{")  # …its reference's
    (store.cache_dir / "e95409ad").write_text("{}")
    removed = store.remove_temp_files()
    assert [os.path.relpath(p, tmp_path / "run") for p in removed] == [
        ".tmp-config",
        "cache/.e95409ad.tmp-blthrmve",
        "cache/refs/.e95409ad.tmp-x1y2z3",
        "step_3/.rollout.tmp-0123456789ab",
        "step_3/.tmp-journal",
    ]
    assert sorted(os.listdir(tmp_path / "run" / "step_3")) == ["rollout"]
    assert sorted(os.listdir(store.cache_dir)) == ["e95409ad", "refs"]


def test_a_stop_signal_waits_for_the_end_of_a_deferred_block():
    from flows.process.stop_signals import RunStopped, signals_deferred, stop_on_signals

    reached = []
    with pytest.raises(RunStopped, match="SIGTERM"), stop_on_signals():
        with signals_deferred():
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.01)
            reached.append("end of the block")  # not interrupted
        reached.append("after the block")  # the held signal is delivered before this
    assert reached == ["end of the block"]
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL or callable(
        signal.getsignal(signal.SIGTERM)
    )


def test_a_probe_tells_a_held_lock_and_a_starting_training_waits_the_probe_out(tmp_path):
    assert lock_held(tmp_path) is None  # no lock file: a run from before locks
    held = RunLock(tmp_path)
    assert lock_held(tmp_path) is True
    held.release()
    assert lock_held(tmp_path) is False  # a killed or finished training
    probe = os.open(tmp_path / LOCK_FILE, os.O_RDONLY)
    fcntl.flock(probe, fcntl.LOCK_SH)  # a probe in progress, naming no holder
    closer = threading.Timer(0.1, os.close, [probe])
    closer.start()
    RunLock(tmp_path).release()  # waited the probe out instead of refusing
    closer.join()
