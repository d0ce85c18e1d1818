"""flows/sinks/mlflow_process.py: the MLflow sink in a process of its own, against a SQLite store in tmp
and a tracking server that is down; the calling process never imports MLflow."""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time

import mlflow.artifacts
import pytest
from mlflow.tracking import MlflowClient

from flows.sinks.fanout import ResumedRun
from flows.sinks.mlflow_logger import PENDING_FILE
from flows.sinks.mlflow_process import MLflowProcessError, MLflowProcessSink

CONFIG = {
    "trainer": {"project_name": "proj", "experiment_name": "exp", "logger": ["mlflow"]},
    "algorithm": {"gamma": 1.0, "kl_ctrl": {"kl_coef": float("inf")}},
}


@pytest.fixture(scope="module")
def store_uri(tmp_path_factory) -> str:
    """One SQLite store for the module (creating one costs seconds of migrations)."""
    return f"sqlite:///{tmp_path_factory.mktemp('mlflow') / 'mlflow.db'}"


def start(tmp_path, uri: str, experiment: str = "exp") -> MLflowProcessSink:
    return MLflowProcessSink.start("proj", experiment, run_dir=tmp_path, tracking_uri=uri)


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_a_run_logged_through_the_process_reads_back(tmp_path, store_uri):
    sink = start(tmp_path, store_uri)
    try:
        assert sink.run_id is None  # deferred: the run is created at the first call
        sink.set_tags({"ppoflow.version": "0.1.0"})
        run_id = sink.run_id
        assert run_id is not None
        sink.log_params(CONFIG)
        sink.log_metrics({"actor/pg_loss": 0.5, "val-core/d/acc/mean@4": 0.25}, step=1)
        sink.log_metrics({"actor/pg_loss": 0.25, "training/global_step": 2.0}, step=2)
        sink.log_table([{"step": 1, "output": "abc"}], "val_generations/step_1.json")
        report = sink.log_plots([{"training/global_step": 1.0}, {"training/global_step": 2.0}])
        assert report.written == {} and report.skipped  # no reward series: every plot skipped
    finally:
        sink.close("FINISHED")
    assert sink.run_id == run_id and sink.popen.returncode == 0
    client = MlflowClient(store_uri)
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED" and run.data.tags["ppoflow.version"] == "0.1.0"
    assert run.data.params["algorithm.gamma"] == "1.0"
    history = client.get_metric_history(run_id, "actor/pg_loss")
    assert [(m.step, m.value) for m in history] == [(1, 0.5), (2, 0.25)]
    config = mlflow.artifacts.load_dict(f"{run.info.artifact_uri}/config.json")
    assert config["algorithm"]["kl_ctrl"]["kl_coef"] == {"float": "inf"}  # JSON has no inf
    names = mlflow.artifacts.load_dict(f"{run.info.artifact_uri}/metric_names.json")
    assert "val-core/d/acc/mean@4" in names.values()


def test_a_resumed_run_is_continued_in_the_process(tmp_path, store_uri):
    first = start(tmp_path, store_uri, "resumed")
    first.log_metrics({"training/global_step": 1.0}, step=1)
    first.close("KILLED")
    second = start(tmp_path, store_uri, "resumed")
    history = {1: {"training/global_step": 1.0}, 2: {"training/global_step": 2.0}}
    second.continue_run(ResumedRun(2, first.run_id, store_uri, history))
    second.log_metrics({"training/global_step": 3.0}, step=3)
    second.close("FINISHED")
    assert second.run_id == first.run_id
    steps = MlflowClient(store_uri).get_metric_history(first.run_id, "training/global_step")
    assert sorted(m.step for m in steps) == [1, 2, 3]  # step 2 replayed, step 1 not repeated


def test_an_error_the_logger_raises_is_raised_here_with_its_traceback(tmp_path, store_uri):
    sink = start(tmp_path, store_uri, "bad-tag")
    try:
        with pytest.raises(Exception, match="Invalid value") as raised:
            sink.set_tags({"bad\x00name": "x"})
        assert any("raised in the MLflow process" in note for note in raised.value.__notes__)
        assert sink.popen.poll() is None  # it still serves (the fan-out retires the sink)
    finally:
        with pytest.raises(Exception, match="Invalid value"):  # the queued tags, flushed again
            sink.close("FAILED")
    assert sink.popen.wait(timeout=10) == 0


def test_outage_warnings_reach_this_process_and_close_saves_the_pending(tmp_path, caplog):
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    uri = f"http://127.0.0.1:{closed_port()}"
    sink = start(tmp_path, uri)
    with caplog.at_level(logging.WARNING, logger="flows.sinks.mlflow_logger"):
        for step in (1, 2):
            sink.log_metrics({"actor/pg_loss": step / 10}, step)
        sink.close("FINISHED")
    outage = [r for r in caplog.records if "unreachable" in r.getMessage()]
    assert len(outage) >= 1 and outage[0].name == "flows.sinks.mlflow_logger"
    assert outage[0].levelno == logging.WARNING
    rows = [json.loads(line) for line in (tmp_path / PENDING_FILE).read_text().splitlines()]
    assert [(r["key"], r["step"]) for r in rows] == [("actor/pg_loss", 1), ("actor/pg_loss", 2)]


def test_a_logger_that_cannot_start_fails_the_first_call_and_closes_quietly(monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI")  # no store named anywhere: MLflowLogger refuses
    sink = MLflowProcessSink.start("proj", "exp", run_dir=None, tracking_uri=None)
    try:
        with pytest.raises(ValueError, match="needs run_dir, tracking_uri"):
            sink.log_metrics({"a": 1.0}, 1)
        with pytest.raises(ValueError, match="needs run_dir, tracking_uri"):
            sink.log_metrics({"a": 1.0}, 2)
    finally:
        sink.close("FAILED")  # does not raise the start error again
    assert sink.popen.returncode == 0


def test_a_dead_process_is_an_error_naming_its_exit_status(tmp_path, store_uri):
    """With restarts off (max_restarts=0); tests/flows/test_mlflow_process_faults.py has the
    restarts."""
    sink = MLflowProcessSink.start(
        "proj", "dead", run_dir=tmp_path, tracking_uri=store_uri, max_restarts=0
    )
    sink.log_metrics({"a": 1.0}, 1)
    os.kill(sink.pid, signal.SIGKILL)
    with pytest.raises(MLflowProcessError, match=r"ended with exit status -9 before answering"):
        sink.log_metrics({"a": 2.0}, 2)
    started = time.monotonic()
    sink.close("FINISHED")
    assert time.monotonic() - started < 5


def test_the_process_ignores_sigint_and_sigterm(tmp_path, store_uri):
    sink = start(tmp_path, store_uri, "stops")
    try:
        sink.log_metrics({"a": 1.0}, 1)
        for stop in (signal.SIGINT, signal.SIGTERM):  # Ctrl-C or a stop sent to the group
            os.kill(sink.pid, stop)
        time.sleep(0.2)
        sink.log_metrics({"a": 2.0}, 2)
    finally:
        sink.close("KILLED")
    assert MlflowClient(store_uri).get_run(sink.run_id).info.status == "KILLED"


def test_the_calling_process_never_imports_mlflow(tmp_path, store_uri):
    probe = textwrap.dedent(
        """
        import sys
        from flows.sinks.mlflow_process import MLflowProcessSink
        sink = MLflowProcessSink.start("proj", "probe", run_dir=sys.argv[1], tracking_uri=sys.argv[2])
        sink.set_tags({"k": "v"})
        sink.log_params({"a": {"b": 1}})
        sink.log_metrics({"actor/pg_loss": 1.0}, 1)
        sink.close("FINISHED")
        print(sorted(m for m in ("mlflow", "sqlalchemy", "matplotlib") if m in sys.modules))
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", probe, str(tmp_path), store_uri],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert done.stdout.strip().splitlines()[-1] == "[]"


def test_the_process_started_ahead_is_taken_over_and_an_untaken_one_ends_at_exit(tmp_path):
    probe = textwrap.dedent(
        """
        import sys
        from flows.sinks import mlflow_process as mp
        mp.start_ahead()
        ahead = mp._ahead[0].popen.pid
        sink = mp.MLflowProcessSink.start(
            "proj", "ahead", run_dir=sys.argv[1], tracking_uri=sys.argv[2], output=sys.argv[3]
        )
        sink.log_metrics({"a": 1.0}, 1)
        sink.close("FINISHED")
        print("taken", sink.pid == ahead, sink.popen.returncode)
        mp.start_ahead()  # nobody takes this one
        print("untaken", mp._ahead[0].popen.pid)
        """
    )
    uri = f"sqlite:///{tmp_path / 'fresh' / 'mlflow.db'}"  # a new store: created at the first call
    (tmp_path / "fresh").mkdir()
    output = tmp_path / "ppoflow.log"
    done = subprocess.run(
        [sys.executable, "-c", probe, str(tmp_path), uri, str(output)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    taken, untaken = done.stdout.strip().splitlines()[-2:]
    assert taken == "taken True 0"
    pid = int(untaken.split()[1])
    with pytest.raises(ProcessLookupError):  # ended (and reaped) when the probe exited
        os.kill(pid, 0)
    assert "Creating initial MLflow database tables" in output.read_text()  # not on stderr
    assert "Creating initial MLflow database tables" not in done.stderr
