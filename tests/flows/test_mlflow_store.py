"""Which MLflow store a run logs to (flows/sinks/mlflow_store.py), and several runs sharing one SQLite
file: created by two processes at once, a locked file treated as an outage."""

from __future__ import annotations

import logging
import os
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from mlflow.exceptions import MlflowException
from mlflow.protos.databricks_pb2 import TEMPORARILY_UNAVAILABLE
from mlflow.tracking import MlflowClient
from sqlalchemy.exc import OperationalError

from flows.sinks.fanout import open_mlflow_sink
from flows.sinks.mlflow_logger import MLflowLogger, is_transient
from flows.sinks.mlflow_store import (
    artifact_location,
    lock_file,
    select_tracking_uri,
    sqlite_file,
)
from stages.config import load_config

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def store_uri(tmp_path_factory) -> str:
    """One SQLite store for the module (creating one costs several seconds of migrations)."""
    return f"sqlite:///{tmp_path_factory.mktemp('mlflow') / 'mlflow.db'}"


def test_the_config_key_wins_then_the_env_var_then_the_recorded_store_then_the_project():
    env = {"MLFLOW_TRACKING_URI": "http://env:5000"}
    assert select_tracking_uri("http://key:5000", "/a", recorded="http://rec", environ=env) == (
        "http://key:5000"
    )
    assert select_tracking_uri(None, "/a", recorded="http://rec", environ=env) == "http://env:5000"
    assert select_tracking_uri(None, "/a", recorded="http://rec", environ={}) == "http://rec"
    assert select_tracking_uri(None, "/a/runs", environ={}) == "sqlite:////a/runs/mlflow.db"
    assert select_tracking_uri("", "/a", environ={"MLFLOW_TRACKING_URI": ""}) == (
        "sqlite:////a/mlflow.db"
    )


def test_a_relative_artifact_dir_is_below_the_working_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    uri = select_tracking_uri(None, "outputs/runs", environ={})
    assert uri == f"sqlite:///{tmp_path}/outputs/runs/mlflow.db"
    assert sqlite_file(uri) == tmp_path / "outputs" / "runs" / "mlflow.db"
    assert artifact_location(uri) == (tmp_path / "outputs" / "runs" / "mlflow-artifacts").as_uri()


def test_a_remote_artifact_dir_without_a_uri_is_one_error_naming_both_settings():
    with pytest.raises(ValueError) as caught:
        select_tracking_uri(None, "s3://bucket/runs", environ={})
    message = str(caught.value)
    assert "'s3://bucket/runs' is not a local path" in message
    assert "ppoflow.mlflow_tracking_uri" in message and "MLFLOW_TRACKING_URI" in message
    assert select_tracking_uri(None, "s3://b/runs", environ={"MLFLOW_TRACKING_URI": "http://h"})


def test_the_lock_file_is_per_database_and_outside_the_store():
    one, two = lock_file("sqlite:////r/a/mlflow.db"), lock_file("sqlite:////r/b/mlflow.db?x=1")
    assert one != two and one.parent == two.parent and one.parent != Path("/r/a")
    assert lock_file("sqlite:////r/a/mlflow.db?timeout=3") == one
    assert lock_file("postgresql://db/mlflow") is None


def test_the_training_sink_logs_to_the_project_store(tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI")
    monkeypatch.chdir(tmp_path)
    cfg = load_config(None, ["ppoflow.artifact_dir=out/runs"])
    sink = open_mlflow_sink(cfg, str(tmp_path / "out" / "runs" / "r1"))
    try:
        assert sink.tracking_uri == f"sqlite:///{tmp_path}/out/runs/mlflow.db"
        assert sink.run_id is None  # deferred: created at the first call
        sink.log_metrics({"training/global_step": 1.0}, 1)
        run = MlflowClient(sink.tracking_uri).get_run(sink.run_id)
        assert run.info.artifact_uri.startswith((tmp_path / "out/runs/mlflow-artifacts").as_uri())
    finally:
        sink.close()
    keyed = load_config(None, [f"ppoflow.mlflow_tracking_uri=sqlite:///{tmp_path}/k.db"])
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/env.db")
    keyed_sink = open_mlflow_sink(keyed, None)
    try:
        assert keyed_sink.tracking_uri == f"sqlite:///{tmp_path}/k.db"
    finally:
        keyed_sink.close()


WRITER = textwrap.dedent(
    """
    import sys
    from flows.sinks.mlflow_logger import MLflowLogger
    with MLflowLogger("shared", sys.argv[2], tracking_uri=sys.argv[1], retry_interval_s=0) as log:
        for step in range(1, 31):
            log.log_metrics({f"m/{i}": float(step * i) for i in range(50)}, step)
        assert log.flush(), "metrics left queued"
    print(log.run_id)
    """
)


@pytest.mark.slow
def test_two_processes_create_and_fill_one_new_sqlite_store_at_once(tmp_path):
    """Without the creation lock one of them fails in MLflow's migrations (about 20 s)."""
    uri = f"sqlite:///{tmp_path}/fresh/mlflow.db"
    env = {**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true", "PYTHONPATH": str(REPO)}
    writers = [
        subprocess.Popen(
            [sys.executable, "-c", WRITER, uri, name],
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name in ("a", "b")
    ]
    outputs = [writer.communicate(timeout=300) for writer in writers]
    for writer, (_, err) in zip(writers, outputs):
        assert writer.returncode == 0, err[-2000:]
    run_ids = [out.strip().splitlines()[-1] for out, _ in outputs]
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("shared")
    runs = client.search_runs([experiment.experiment_id])
    assert sorted(run.info.run_id for run in runs) == sorted(run_ids)
    for run_id in run_ids:
        history = client.get_metric_history(run_id, "m/3")
        assert [(m.step, m.value) for m in history] == [(s, 3.0 * s) for s in range(1, 31)]


def database_is_locked() -> MlflowException:
    """What MLflow's SQL store raises when the file stayed locked for its 20 s busy timeout."""
    cause = OperationalError("INSERT INTO metrics …", {}, sqlite3.OperationalError("locked"))
    return MlflowException(message=cause, error_code=TEMPORARILY_UNAVAILABLE)


class LockedStore:
    """Delegates to a real client; ``log_batch`` fails as a locked SQLite file does while
    ``locked``."""

    def __init__(self, client: MlflowClient) -> None:
        self.client, self.locked = client, False

    def log_batch(self, *args, **kwargs):
        if self.locked:
            raise database_is_locked()
        return self.client.log_batch(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.client, name)


def test_a_locked_sqlite_file_is_an_outage_and_the_metrics_follow(store_uri, caplog):
    assert is_transient(database_is_locked())
    logger = MLflowLogger("proj", "locked", tracking_uri=store_uri, retry_interval_s=0)
    locked = LockedStore(logger._client)
    logger._client, locked.locked = locked, True
    with caplog.at_level(logging.WARNING, logger="flows.sinks.mlflow_logger"):
        logger.log_metrics({"actor/pg_loss": 1.0}, step=1)
        logger.log_metrics({"actor/pg_loss": 2.0}, step=2)
    assert logger.pending == 2 and "Training continues" in caplog.text
    locked.locked = False
    logger.close()
    history = MlflowClient(store_uri).get_metric_history(logger.run_id, "actor/pg_loss")
    assert [(m.step, m.value) for m in history] == [(1, 1.0), (2, 2.0)]


def test_two_runs_creating_the_experiment_at_once_share_it(store_uri):
    first = MLflowLogger("race", "first", tracking_uri=store_uri)
    second = MLflowLogger("race", "second", tracking_uri=store_uri, deferred=True)
    real = second._client

    class LateToCreate:  # saw no experiment, then lost the race to create it
        calls = 0

        def get_experiment_by_name(self, name):
            LateToCreate.calls += 1
            return None if LateToCreate.calls == 1 else real.get_experiment_by_name(name)

        def __getattr__(self, name):
            return getattr(real, name)

    second._client = LateToCreate()
    second.log_metrics({"actor/pg_loss": 1.0}, step=1)
    first.close()
    second.close()
    runs = [real.get_run(logger.run_id) for logger in (first, second)]
    assert runs[0].info.experiment_id == runs[1].info.experiment_id
    assert LateToCreate.calls == 2


@pytest.mark.slow
def test_a_really_locked_sqlite_file_is_an_outage(tmp_path, caplog):
    """A writer holding the file longer than MLflow's 20 s busy timeout (about 25 s)."""
    db = tmp_path / "mlflow.db"
    logger = MLflowLogger("proj", "locked", tracking_uri=f"sqlite:///{db}", retry_interval_s=60)
    blocker = sqlite3.connect(db, isolation_level=None)
    blocker.execute("BEGIN EXCLUSIVE")
    try:
        with caplog.at_level(logging.WARNING, logger="flows.sinks.mlflow_logger"):
            logger.log_metrics({"actor/pg_loss": 1.0}, step=1)
        assert logger.pending == 1 and "database is locked" in caplog.text
    finally:
        blocker.execute("ROLLBACK")
        blocker.close()
    logger.close()
    history = MlflowClient(f"sqlite:///{db}").get_metric_history(logger.run_id, "actor/pg_loss")
    assert [(m.step, m.value) for m in history] == [(1, 1.0)]
