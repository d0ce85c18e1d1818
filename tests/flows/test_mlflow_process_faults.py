"""Faults of the MLflow process (flows/sinks/mlflow_process.py, issue 36): a deadline on every call,
a dead or stopped process replaced by one that continues the same MLflow run with what it had not
stored sent again, a bound on the replacements, and no process left behind the training process.

Against a SQLite store in tmp, with real MLflow processes; the faults are real signals (SIGSTOP,
SIGKILL) sent to them, except where a test names the moment it injects one at the pipe.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from flows.sinks import mlflow_process
from flows.sinks.fanout import MetricSinks
from flows.sinks.mlflow_logger import NAMES_ARTIFACT, PENDING_FILE
from flows.sinks.mlflow_process import MLflowProcessGone, MLflowProcessSink

REPO = Path(__file__).resolve().parents[2]
#: the call deadline of these tests: far above a SQLite call's time, short enough to wait out
DEADLINE_S = 5.0
#: how long a test waits for something that must happen (a process to end, a call to return)
PATIENCE_S = 60.0


@pytest.fixture(scope="module")
def store_uri(tmp_path_factory) -> str:
    """One SQLite store for the module, made here (creating one costs seconds of migrations,
    which the short call deadline of these tests does not cover; the store-creating call's own
    bound has its test)."""
    uri = f"sqlite:///{tmp_path_factory.mktemp('mlflow') / 'mlflow.db'}"
    MlflowClient(uri).search_experiments()
    return uri


def start(tmp_path: Path, uri: str, experiment: str, **bounds) -> MLflowProcessSink:
    return MLflowProcessSink.start(
        "proj", experiment, run_dir=tmp_path, tracking_uri=uri, call_timeout_s=DEADLINE_S, **bounds
    )


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, which nobody may reap in a container, does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] not in "ZX"


def wait_gone(pid: int, timeout_s: float = PATIENCE_S) -> bool:
    deadline = time.monotonic() + timeout_s
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not alive(pid)


def history(uri: str, run_id: str, key: str) -> list[tuple[int, float]]:
    points = MlflowClient(uri).get_metric_history(run_id, key)
    return sorted((point.step, point.value) for point in points)


def restarts_logged(caplog) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "flows.sinks.mlflow_process" and "continues the run" in r.getMessage()
    ]


def call_within(call, timeout_s: float) -> None:
    """``call()`` on a thread; fails the test if it has not returned within ``timeout_s``."""
    errors: list[BaseException] = []

    def run() -> None:
        try:
            call()
        except BaseException as err:
            errors.append(err)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout_s)
    assert not thread.is_alive(), f"the call still waits after {timeout_s} s"
    if errors:
        raise errors[0]


# --- the deadline -----------------------------------------------------------------------------


@pytest.mark.slow
def test_a_stopped_process_misses_its_deadline_and_a_new_one_logs_the_step(
    tmp_path, store_uri, caplog
):
    sink = start(tmp_path, store_uri, "stopped")
    try:
        sink.set_tags({"ppoflow.version": "0.1.0"})
        sink.log_metrics({"a": 1.0, "training/global_step": 1.0}, 1)
        stopped, run_id = sink.pid, sink.run_id
        os.kill(stopped, signal.SIGSTOP)
        with caplog.at_level(logging.WARNING, logger="flows.sinks.mlflow_process"):
            # returns once the deadline has passed, without waiting for the new process
            step_2 = {"a": 2.0, "training/global_step": 2.0}
            call_within(lambda: sink.log_metrics(step_2, 2), DEADLINE_S + PATIENCE_S)
        assert wait_gone(stopped), "the stopped process was not killed"
        assert sink.pid != stopped and sink.restarts == 1
        (warning,) = restarts_logged(caplog)
        assert f"(pid {stopped}) did not answer log_metrics within 5 s" in warning
        assert "ppoflow.mlflow_call_timeout_s" in warning
        sink.log_metrics({"a": 3.0, "training/global_step": 3.0}, 3)
    finally:
        sink.close("FINISHED")
    assert sink.run_id == run_id and sink.popen.returncode == 0
    assert history(store_uri, run_id, "a") == [(1, 1.0), (2, 2.0), (3, 3.0)]
    run = MlflowClient(store_uri).get_run(run_id)
    assert run.info.status == "FINISHED" and run.data.tags["ppoflow.version"] == "0.1.0"


def test_a_process_that_does_not_answer_its_start_is_killed_at_the_start_bound(tmp_path):
    """A stand-in for the process that never answers (``sleep``), the start bound short and no
    restarts: the first call ends at the bound, naming it, and the stand-in is killed."""
    request_read, request_write = os.pipe()
    reply_read, reply_write = os.pipe()
    silent = subprocess.Popen(["sleep", "600"], pass_fds=(request_read, reply_write))
    os.close(request_read)
    os.close(reply_write)
    for fd in (request_write, reply_read):
        os.set_blocking(fd, False)
    child = mlflow_process._Process(silent, request_write, reply_read)
    settings = {"logger": {"run_dir": str(tmp_path)}, "output": None}
    sink = MLflowProcessSink(
        child, None, settings, call_timeout_s=1, start_timeout_s=2, max_restarts=0
    )
    try:
        with pytest.raises(MLflowProcessGone, match=r"did not answer its start within 2 s"):
            call_within(lambda: sink.set_tags({"k": "v"}), PATIENCE_S)
        assert silent.poll() == -signal.SIGKILL
    finally:
        sink.close("FAILED")
        if silent.poll() is None:
            silent.kill()


@pytest.mark.slow
def test_the_call_that_creates_the_store_is_not_cut_off_by_the_call_deadline(tmp_path):
    """A new store is created by the first call (MLflow's migrations, seconds): it runs under the
    start bound, not the call deadline, since a kill in the middle would leave the store
    half-migrated for every later process."""
    uri = f"sqlite:///{tmp_path / 'new' / 'mlflow.db'}"
    (tmp_path / "new").mkdir()
    sink = MLflowProcessSink.start(
        "proj", "new", run_dir=tmp_path, tracking_uri=uri, call_timeout_s=1.0
    )
    try:
        started = time.monotonic()
        sink.log_metrics({"a": 1.0}, 1)
        took = time.monotonic() - started
        assert sink.restarts == 0
    finally:
        sink.close("FINISHED")
    assert took > 1.0, "the store was made within the call deadline: this proves nothing here"
    assert history(uri, sink.run_id, "a") == [(1, 1.0)]


# --- a dead process is replaced -----------------------------------------------------------------


def test_a_killed_process_is_replaced_and_the_run_holds_every_step_once(
    tmp_path, store_uri, caplog
):
    sink = start(tmp_path, store_uri, "killed")
    config = {"trainer": {"project_name": "proj"}, "algorithm": {"gamma": 1.0}}
    try:
        sink.set_tags({"ppoflow.version": "0.1.0"})
        sink.log_params(config)
        for step in (1, 2):
            metrics = {"a": step / 10, "val-core/d/acc/mean@4": step, "training/global_step": step}
            sink.log_metrics(metrics, step)
        run_id, killed = sink.run_id, sink.pid
        os.kill(killed, signal.SIGKILL)
        with caplog.at_level(logging.WARNING, logger="flows.sinks.mlflow_process"):
            for step in (3, 4, 5):  # b: a name the new process adds to the run's description
                sink.log_metrics({"a": step / 10, "b": step, "training/global_step": step}, step)
        assert sink.restarts == 1 and sink.pid != killed
        (warning,) = restarts_logged(caplog)
        assert f"run {run_id} (pid {killed}) ended with exit status -9" in warning
        sink.log_params(config)  # the same config again adds nothing (params are read back)
    finally:
        sink.close("FINISHED")
    assert sink.run_id == run_id
    assert history(store_uri, run_id, "a") == [(s, s / 10) for s in range(1, 6)]
    assert [s for s, _ in history(store_uri, run_id, "training/global_step")] == [1, 2, 3, 4, 5]
    client = MlflowClient(store_uri)
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED"
    assert (
        run.data.params["algorithm.gamma"] == "1.0" and run.data.tags["ppoflow.version"] == "0.1.0"
    )
    note = run.data.tags["mlflow.note.content"]  # written again by the new process
    assert "ppoflow 0.1.0" in note and "`b`" in note and "`val-core/d/acc/mean@4`" in note
    names = json.loads(
        Path(client.download_artifacts(run_id, NAMES_ARTIFACT, str(tmp_path))).read_text()
    )
    assert {"a", "b", "val-core/d/acc/mean@4"} <= set(names.values())  # the dead one's kept
    assert not (tmp_path / PENDING_FILE).exists()


def test_a_step_stored_just_before_the_death_is_held_once(tmp_path, store_uri, monkeypatch):
    """The one window a replay can repeat: the process stored step 2 and died before its answer
    was read. Injected at the pipe: the answer is read once it is there, the process is then
    SIGKILLed and the answer dropped, as if it had died a moment earlier."""
    sink = start(tmp_path, store_uri, "stored-then-killed")
    receive = mlflow_process._Process.receive
    dropped = []

    def receive_or_die(process, deadline):
        reply = receive(process, deadline)
        if not dropped and sink._unsettled and sink._unsettled[-1][1][1:2] == (2,):
            dropped.append(process.popen.pid)
            os.kill(process.popen.pid, signal.SIGKILL)
            process.popen.wait()
            raise EOFError("the MLflow process closed its reply pipe")
        return reply

    try:
        sink.log_metrics({"a": 1.0, "training/global_step": 1.0}, 1)
        monkeypatch.setattr(mlflow_process._Process, "receive", receive_or_die)
        sink.log_metrics({"a": 2.0, "training/global_step": 2.0}, 2)  # stored; the answer lost
        assert dropped and sink.restarts == 1
        sink.log_metrics({"a": 3.0, "training/global_step": 3.0}, 3)  # step 2 is sent again first
    finally:
        sink.close("FINISHED")
    assert history(store_uri, sink.run_id, "a") == [(1, 1.0), (2, 2.0), (3, 3.0)]


def test_a_run_created_by_a_process_that_died_before_answering_is_not_created_twice(
    tmp_path, store_uri, monkeypatch
):
    """The process created the MLflow run at the first call and died before its answer was read
    (injected at the pipe, as above): the replacement must go on with that run, not start a
    second one. Without the creation token the experiment holds two runs."""
    sink = start(tmp_path, store_uri, "created-then-killed")
    receive = mlflow_process._Process.receive
    dropped = []

    def receive_or_die(process, deadline):
        reply = receive(process, deadline)
        if not dropped and sink._unsettled and sink._unsettled[-1][0] == "log_metrics":
            dropped.append(process.popen.pid)
            os.kill(process.popen.pid, signal.SIGKILL)
            process.popen.wait()
            raise EOFError("the MLflow process closed its reply pipe")
        return reply

    monkeypatch.setattr(mlflow_process._Process, "receive", receive_or_die)
    try:
        sink.log_metrics({"a": 1.0, "training/global_step": 1.0}, 1)  # creates the run; lost
        assert dropped and sink.restarts == 1 and sink.run_id is None
        sink.log_metrics({"a": 2.0, "training/global_step": 2.0}, 2)
    finally:
        sink.close("FINISHED")
    client = MlflowClient(store_uri)
    (experiment,) = [e for e in client.search_experiments() if e.name == "proj"]
    runs = client.search_runs(
        [experiment.experiment_id], filter_string="attributes.run_name = 'created-then-killed'"
    )
    assert [run.info.run_id for run in runs] == [sink.run_id]
    assert runs[0].info.status == "FINISHED"
    assert history(store_uri, sink.run_id, "a") == [(1, 1.0), (2, 2.0)]


@pytest.mark.slow
def test_what_the_dead_process_had_queued_in_an_outage_is_sent_by_the_next(
    tmp_path, store_uri, caplog
):
    """The store locked (SQLite's ``database is locked``, an outage to the logger, once MLflow's
    busy timeout has passed): steps 2–3 wait in the process's queue, which the sink keeps too. The
    process is SIGKILLed, the lock ends, and the next process sends them: the run holds steps
    1–4, and no pending file is written."""
    sink = MLflowProcessSink.start(
        "proj", "outage", run_dir=tmp_path, tracking_uri=store_uri, call_timeout_s=PATIENCE_S
    )
    try:
        sink.log_metrics({"a": 1.0}, 1)
        run_id = sink.run_id
        database = sqlite3.connect(store_uri.removeprefix("sqlite:///"), timeout=60)
        database.execute("BEGIN EXCLUSIVE")
        try:
            with caplog.at_level(logging.WARNING, logger="flows.sinks.mlflow_logger"):
                sink.log_metrics({"a": 2.0}, 2)
                sink.log_metrics({"a": 3.0}, 3)
            assert any("unreachable" in r.getMessage() for r in caplog.records)
            assert len(sink._unsettled) == 2  # both still queued in the process
            os.kill(sink.pid, signal.SIGKILL)
        finally:
            database.rollback()
            database.close()
        sink.log_metrics({"a": 4.0}, 4)
        assert sink.restarts == 1
    finally:
        sink.close("FINISHED")
    assert history(store_uri, run_id, "a") == [(1, 1.0), (2, 2.0), (3, 3.0), (4, 4.0)]
    assert MlflowClient(store_uri).get_run(run_id).info.status == "FINISHED"
    assert not (tmp_path / PENDING_FILE).exists()


def test_a_process_killed_before_close_is_replaced_and_the_run_ends_killed(tmp_path, store_uri):
    sink = start(tmp_path, store_uri, "close")
    sink.log_metrics({"a": 1.0}, 1)
    os.kill(sink.pid, signal.SIGKILL)
    sink.close("KILLED")
    assert sink.restarts == 1 and sink.popen.returncode == 0
    assert MlflowClient(store_uri).get_run(sink.run_id).info.status == "KILLED"


# --- the bound -----------------------------------------------------------------------------------


def test_past_its_restarts_the_sink_is_retired_in_one_line_and_the_pending_file_holds_the_rest(
    tmp_path, store_uri, caplog
):
    sink = start(tmp_path, store_uri, "bound", max_restarts=1)
    sinks = MetricSinks({"mlflow": sink}, run_dir=str(tmp_path))
    with caplog.at_level(logging.WARNING):
        sinks.log_metrics({"a": 1.0, "b": float("nan")}, 1)
        first = sink.pid
        os.kill(first, signal.SIGKILL)
        sinks.log_metrics({"a": 2.0, "b": 2.5}, 2)  # a new process is launched; step 2 waits
        assert sink.restarts == 1 and "mlflow" not in sinks.retired
        second = sink.pid
        os.kill(second, signal.SIGKILL)
        sinks.log_metrics({"a": 3.0, "b": 3.5}, 3)  # past the bound: retired
        sinks.log_metrics({"a": 4.0, "b": 4.5}, 4)
    assert "mlflow" in sinks.retired and sink.restarts == 1
    retired = [r for r in caplog.records if "retired" in r.getMessage()]
    assert len(retired) == 1, [r.getMessage() for r in retired]
    (line,) = retired
    text = line.getMessage()
    assert line.levelno == logging.WARNING and line.exc_info is None and "\n" not in text
    pending = tmp_path / PENDING_FILE
    assert f"the MLflow process (pid {second}) ended with exit status -9" in text
    assert f"2 metric values of step 2 it had not stored are saved to {pending}" in text
    rows = [json.loads(row) for row in pending.read_text().splitlines()]
    assert [(r["key"], r["value"], r["step"]) for r in rows] == [
        ("a", 2.0, 2),
        ("b", 2.5, 2),
        ("a", 3.0, 3),
        ("b", 3.5, 3),
        ("a", 4.0, 4),
        ("b", 4.5, 4),
    ]
    assert len(restarts_logged(caplog)) == 1
    assert not alive(first) and not alive(second)
    with caplog.at_level(logging.WARNING):
        sinks.close("FINISHED")
    assert not alive(sink.pid)
    # the last attempt at close: the pending values reach the run, which ends FINISHED
    (ended,) = [r.getMessage() for r in caplog.records if "by a last process" in r.getMessage()]
    assert f"run {sink.run_id} ended FINISHED" in ended and f"6 values saved to {pending}" in ended
    run = MlflowClient(store_uri).get_run(sink.run_id)
    assert history(store_uri, sink.run_id, "a") == [(s, float(s)) for s in (1, 2, 3, 4)]
    assert history(store_uri, sink.run_id, "b")[1:] == [(2, 2.5), (3, 3.5), (4, 4.5)]
    assert run.info.status == "FINISHED"
    assert not pending.exists() and not list(tmp_path.glob("*.sending"))


def test_a_last_attempt_that_fails_keeps_the_pending_file_whole_and_the_run_running(
    tmp_path, store_uri, caplog, monkeypatch
):
    sink = start(tmp_path, store_uri, "last-attempt-fails", max_restarts=0)
    sinks = MetricSinks({"mlflow": sink}, run_dir=str(tmp_path))
    with caplog.at_level(logging.WARNING):
        sinks.log_metrics({"a": 1.0}, 1)
        os.kill(sink.pid, signal.SIGKILL)
        sinks.log_metrics({"a": 2.0}, 2)  # no restart allowed: retired, step 2 pending
        sinks.log_metrics({"a": 3.0}, 3)
        assert "mlflow" in sinks.retired
        pending = tmp_path / PENDING_FILE
        before = pending.read_text()

        def no_process():
            raise OSError("[Errno 12] Cannot allocate memory")

        monkeypatch.setattr(mlflow_process._Process, "launch", staticmethod(no_process))
        sinks.close("FAILED")
    (line,) = [
        r.getMessage() for r in caplog.records if "no process could be launched" in r.getMessage()
    ]
    assert f"end run {sink.run_id}" in line and "Cannot allocate memory" in line
    assert pending.read_text() == before  # whole, in its order
    assert [json.loads(row)["step"] for row in before.splitlines()] == [2, 3]
    assert MlflowClient(store_uri).get_run(sink.run_id).info.status == "RUNNING"
    assert not list(tmp_path.glob("*.sending"))


# --- no orphan -----------------------------------------------------------------------------------

PARENT = textwrap.dedent(
    """
    import os, sys, time
    from flows.sinks.mlflow_process import MLflowProcessSink
    sink = MLflowProcessSink.start("proj", "orphan", run_dir=sys.argv[1], tracking_uri=sys.argv[2])
    sink.log_metrics({"a": 1.0}, 1)
    fork = sys.argv[3] == "fork"
    holder = os.fork() if fork else None  # a process that holds the pipes' ends, as this one
    if holder == 0:
        time.sleep(600)
        os._exit(0)
    print(sink.pid, holder or 0, flush=True)
    time.sleep(600)
    """
)


@pytest.mark.parametrize("holder", ["alone", "fork"])
def test_the_process_ends_when_the_training_process_is_killed(tmp_path, store_uri, holder):
    """``fork``: a process forked from the training process (after the sink started) still holds
    the request pipe, so the pipe does not end; the process ends with its parent anyway."""
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, str(tmp_path), store_uri, holder],
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )
    pids: list[int] = []
    try:
        pids = [int(pid) for pid in parent.stdout.readline().split()]
        assert len(pids) == 2, "the parent did not start its sink"
        child, forked = pids
        assert alive(child)
        parent.kill()
        parent.wait()
        assert wait_gone(child, timeout_s=10), "the MLflow process outlived the training process"
        if forked:
            assert alive(forked)  # so the pipe was still held
    finally:
        parent.kill()
        parent.wait()
        for pid in pids:
            if pid and alive(pid):
                os.kill(pid, signal.SIGKILL)


# --- end to end ----------------------------------------------------------------------------------

#: metrics that measure wall time, so differ between any two runs
TIME_DEPENDENT = (
    "timing_s/",
    "timing_per_token_ms/",
    "perf/throughput",
    "perf/time_per_step",
    "reward/time_s",
)
RUN_TIMEOUT_S = 900


def mlflow_children(parent: int) -> list[int]:
    """The MLflow processes (``…mlflow_process import serve…``) whose parent is ``parent``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        ppid = int(stat[stat.rindex(")") + 2 :].split()[1])
        if ppid == parent and "mlflow_process import serve" in command and alive(int(entry.name)):
            found.append(int(entry.name))
    return found


def train(home: Path, demo: Path, tiny_run_overrides, kill_after: int | None) -> str:
    """A tiny 4-step ``ppoflow train`` in ``home`` (its own Prefect home and MLflow store); with
    ``kill_after``, its MLflow process is SIGKILLed once that step's journal is done. Returns the
    run's output; it must exit 0."""
    home.mkdir(parents=True)
    command = [
        sys.executable,
        "-m",
        "flows.cli",
        "train",
        str(REPO / "configs" / "demo-cpu.yaml"),
        *tiny_run_overrides(
            demo, home, 4, "trainer.val_before_train=false", f"ppoflow.artifact_dir={home}/runs"
        ),
    ]
    env = {
        **os.environ,
        "PREFECT_HOME": str(home / "prefect-home"),
        "PREFECT_RESULTS_LOCAL_STORAGE_PATH": str(home / "prefect-results"),
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "120",
        "HF_HUB_OFFLINE": "1",
        "OMP_NUM_THREADS": "1",
    }
    with open(home / "output.log", "wb") as output:
        trainer = subprocess.Popen(
            command,
            cwd=home,
            env=env,
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        if kill_after is not None:
            deadline = time.monotonic() + RUN_TIMEOUT_S
            journals = home / "runs"
            while not any(
                json.loads(path.read_text()).get("status") == "done"
                for path in journals.glob(f"*/step_{kill_after}/journal.json")
            ):
                assert trainer.poll() is None, (home / "output.log").read_text()[-3000:]
                assert time.monotonic() < deadline, f"no step {kill_after} in time"
                time.sleep(0.05)
            (victim,) = mlflow_children(trainer.pid)
            os.kill(victim, signal.SIGKILL)
        status = trainer.wait(timeout=RUN_TIMEOUT_S)
    finally:
        if trainer.poll() is None:
            os.killpg(trainer.pid, signal.SIGKILL)
            trainer.wait()
    text = (home / "output.log").read_text(errors="replace")
    assert status == 0, text[-3000:]
    return text


def logged(home: Path) -> tuple[str, dict[str, dict[int, float]]]:
    """The status of the one MLflow run in ``home/mlflow.db``, and metric → step → value; each
    step of each metric must be there once."""
    client = MlflowClient(f"sqlite:///{home}/mlflow.db")
    (run,) = client.search_runs([e.experiment_id for e in client.search_experiments()])
    metrics: dict[str, dict[int, float]] = {}
    for name in run.data.metrics:
        points = client.get_metric_history(run.info.run_id, name)
        steps = [point.step for point in points]
        assert len(steps) == len(set(steps)), f"{name}: a step logged twice: {sorted(steps)}"
        metrics[name] = {point.step: point.value for point in points}
    return run.info.status, metrics


@pytest.mark.slow
def test_a_training_whose_mlflow_process_is_killed_logs_what_an_uninterrupted_one_does(
    tmp_path, make_demo_inputs, tiny_run_overrides
):
    """Two tiny 4-step trainings, the second with its MLflow process SIGKILLed after step 2: the
    second's MLflow run ends FINISHED with the same metrics at the same steps, each once, and the
    same values but the timings."""
    demo = make_demo_inputs(tmp_path / "demo")
    train(tmp_path / "whole", demo, tiny_run_overrides, kill_after=None)
    output = train(tmp_path / "killed", demo, tiny_run_overrides, kill_after=2)
    assert "ended with exit status -9" in output and "continues the run" in output, output[-3000:]
    assert "retired" not in output
    (status, want), (killed_status, have) = logged(tmp_path / "whole"), logged(tmp_path / "killed")
    assert status == killed_status == "FINISHED"
    assert {name: sorted(steps) for name, steps in have.items()} == {
        name: sorted(steps) for name, steps in want.items()
    }
    assert sorted(have["training/global_step"]) == [1, 2, 3, 4]
    for name, steps in want.items():
        if not name.startswith(TIME_DEPENDENT):
            assert have[name] == pytest.approx(steps, rel=1e-6, abs=1e-7), name
    assert not list((tmp_path / "killed" / "runs").glob("*/mlflow_pending.jsonl"))
