"""MLflowLogger against a SQLite store in tmp, and against a tracking server that is down."""

from __future__ import annotations

import json
import logging
import socket
import time

import mlflow.artifacts
import pytest
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from flows.sinks.mlflow_logger import (
    PENDING_FILE,
    MLflowLogger,
    default_tracking_uri,
    is_transient,
)
from stages.metrics.catalog import describe_metric
from stages.metrics.naming import restore_metric_name

CONFIG = {
    "trainer": {"project_name": "proj", "experiment_name": "exp", "logger": ["console", "mlflow"]},
    "algorithm": {"gamma": 1.0, "kl_ctrl": {"kl_coef": 0.001}},
    "data": {"prompt_template": "x" * 7000},
}


@pytest.fixture(scope="module")
def store_uri(tmp_path_factory) -> str:
    """One SQLite store for the module (creating one costs several seconds of migrations)."""
    return f"sqlite:///{tmp_path_factory.mktemp('mlflow') / 'mlflow.db'}"


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def load_json(run, name: str) -> dict:
    return mlflow.artifacts.load_dict(f"{run.info.artifact_uri}/{name}")


def test_params_metrics_and_name_mapping_read_back(tmp_path, store_uri):
    with MLflowLogger("proj", "exp", run_dir=tmp_path, tracking_uri=store_uri) as logger:
        logger.log_params(CONFIG)
        logger.log_metrics({"actor/pg_loss": 0.5, "val-core/gsm8k/acc/mean@4": 0.25}, step=1)
        logger.log_metrics({"actor/pg_loss": 0.25, "timing_s/gen": float("nan")}, step=2)
    client = MlflowClient(store_uri)
    run = client.get_run(logger.run_id)
    assert client.get_experiment(run.info.experiment_id).name == "proj"
    assert run.info.run_name == "exp" and run.info.status == "FINISHED"
    params = run.data.params
    assert params["algorithm.kl_ctrl.kl_coef"] == "0.001" and params["algorithm.gamma"] == "1.0"
    assert params["trainer.logger"] == '["console", "mlflow"]'
    long = params["data.prompt_template"]
    assert len(long) <= 6000 and long.endswith("[truncated from 7000 chars; see config.json]")
    assert load_json(run, "config.json")["data"]["prompt_template"] == "x" * 7000
    history = client.get_metric_history(logger.run_id, "actor/pg_loss")
    assert [(m.step, m.value) for m in history] == [(1, 0.5), (2, 0.25)]
    names = load_json(run, "metric_names.json")
    assert names["val-core/gsm8k/acc/mean_at_4"] == "val-core/gsm8k/acc/mean@4"
    assert all(restore_metric_name(safe) == name for safe, name in names.items())
    assert set(run.data.metrics) == set(names)  # every logged name is in the mapping
    descriptions = load_json(run, "metric_descriptions.json")
    assert descriptions["actor/pg_loss"] == describe_metric("actor/pg_loss")
    assert descriptions["timing_s/gen"] == describe_metric("timing_s/gen")


def test_attaches_to_the_run_named_by_mlflow_run_id(tmp_path, store_uri, monkeypatch):
    client = MlflowClient(store_uri)
    experiment = client.get_experiment_by_name("proj") or client.get_experiment(
        client.create_experiment("proj", artifact_location=(tmp_path / "a").as_uri())
    )
    run_id = client.create_run(experiment.experiment_id, run_name="outer").info.run_id
    monkeypatch.setenv("MLFLOW_RUN_ID", run_id)
    logger = MLflowLogger("proj", "exp", tracking_uri=store_uri)
    logger.log_metrics({"critic/vf_loss": 1.5}, step=7)
    logger.close()
    assert logger.run_id == run_id
    run = client.get_run(run_id)
    assert run.data.metrics == {"critic/vf_loss": 1.5} and run.info.status == "RUNNING"
    monkeypatch.setenv("MLFLOW_RUN_ID", "0" * 32)
    with pytest.raises(MlflowException):  # a run that does not exist is a bug, not an outage
        MLflowLogger("proj", "exp", tracking_uri=store_uri)


def test_unreachable_server_buffers_with_one_warning(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "1")
    uri = f"http://127.0.0.1:{closed_port()}"
    start = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="flows.sinks.mlflow_logger"):
        logger = MLflowLogger("proj", "exp", run_dir=tmp_path, tracking_uri=uri, retry_interval_s=0)
        logger.log_params(CONFIG)
        for step in (1, 2, 3):
            logger.log_metrics({"actor/pg_loss": step / 10, "val-core/d/acc/mean@2": 1.0}, step)
        assert logger.pending == 6 and not logger.flush()
        outage_warnings = [r for r in caplog.records if "unreachable" in r.getMessage()]
        assert len(outage_warnings) == 1 and "Training continues" in outage_warnings[0].getMessage()
        logger.close()
    assert time.monotonic() - start < 20
    rows = [json.loads(line) for line in (tmp_path / PENDING_FILE).read_text().splitlines()]
    assert [(r["key"], r["step"]) for r in rows][:2] == [
        ("actor/pg_loss", 1),
        ("val-core/d/acc/mean@2", 1),
    ]
    assert (
        len(rows) == 6 and "stayed unreachable: 6 metric values" in caplog.records[-1].getMessage()
    )


class FlakyClient:
    """Delegates to a real client; log_batch fails like an unreachable server while ``down``."""

    def __init__(self, client: MlflowClient) -> None:
        self.client, self.down = client, False

    def log_batch(self, *args, **kwargs):
        if self.down:
            raise MlflowException(
                "API request to http://x/api failed with exception ConnectionError"
            )
        return self.client.log_batch(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.client, name)


def test_buffered_metrics_are_flushed_when_the_server_returns(tmp_path, store_uri, caplog):
    logger = MLflowLogger("proj", "flaky", tracking_uri=store_uri, retry_interval_s=0)
    flaky = FlakyClient(logger._client)
    logger._client = flaky
    flaky.down = True
    with caplog.at_level(logging.INFO, logger="flows.sinks.mlflow_logger"):
        logger.log_metrics({"actor/pg_loss": 1.0}, step=1)
        logger.log_metrics({"actor/pg_loss": 2.0}, step=2)
        assert logger.pending == 2
        flaky.down = False
        logger.log_metrics({"actor/pg_loss": 3.0}, step=3)
    assert logger.pending == 0
    messages = [r.getMessage() for r in caplog.records]
    assert sum("unreachable" in m for m in messages) == 1
    assert any("reachable again" in m for m in messages)
    logger.close()
    history = MlflowClient(store_uri).get_metric_history(logger.run_id, "actor/pg_loss")
    assert [(m.step, m.value) for m in history] == [(1, 1.0), (2, 2.0), (3, 3.0)]
    assert history[0].timestamp <= history[2].timestamp  # logged-at time kept, not flush time
    assert not (tmp_path / PENDING_FILE).exists()


def test_transient_errors_and_default_uri(tmp_path, monkeypatch):
    assert is_transient(MlflowException("API request failed"))  # INTERNAL_ERROR
    assert is_transient(ConnectionRefusedError())
    assert not is_transient(MlflowException("bad", error_code=1000))  # INVALID_PARAMETER_VALUE
    assert default_tracking_uri(tmp_path / "run") == f"sqlite:///{tmp_path / 'run' / 'mlflow.db'}"
    with pytest.raises(ValueError, match="not a local path"):
        default_tracking_uri("s3://bucket/run")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    with pytest.raises(ValueError, match="needs run_dir, tracking_uri or MLFLOW_TRACKING_URI"):
        MLflowLogger("proj", "exp")


def test_warm_up_reads_only_and_leaves_an_outage_to_the_first_call(
    tmp_path, store_uri, monkeypatch
):
    logger = MLflowLogger("proj", "warm", run_dir=tmp_path, tracking_uri=store_uri, deferred=True)
    logger.warm_up()
    assert logger.run_id is None and logger.pending == 0  # no run created, nothing queued
    logger.close()
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "1")
    down = f"http://127.0.0.1:{closed_port()}"
    MLflowLogger("proj", "warm", run_dir=tmp_path, tracking_uri=down, deferred=True).warm_up()


def test_the_experiment_is_a_model_training_experiment_unless_its_kind_was_chosen(tmp_path):
    uri = f"sqlite:///{tmp_path / 'kind.db'}"
    with MLflowLogger("fresh", "exp", run_dir=tmp_path, tracking_uri=uri) as logger:
        logger.log_metrics({"actor/pg_loss": 0.5}, step=1)
    client = MlflowClient(uri)
    kind = "mlflow.experimentKind"
    assert client.get_experiment_by_name("fresh").tags[kind] == "custom_model_development"
    where = (tmp_path / "artifacts").as_uri()
    old = client.create_experiment("made-before", where)  # by an older ppoflow: no kind yet
    chosen = client.create_experiment("chosen", where, tags={kind: "finetuning"})
    for name in ("made-before", "chosen"):
        with MLflowLogger(name, "exp", run_dir=tmp_path, tracking_uri=uri) as logger:
            logger.log_metrics({"actor/pg_loss": 0.5}, step=1)
    assert client.get_experiment(old).tags[kind] == "custom_model_development"
    assert client.get_experiment(chosen).tags[kind] == "finetuning", "a user's choice stays"


def test_system_metrics_are_sampled_into_the_run_until_close(tmp_path, store_uri):
    logger = MLflowLogger(
        "proj", "sys", run_dir=tmp_path, tracking_uri=store_uri, system_metrics_interval_s=0.2
    )
    logger.log_metrics({"actor/pg_loss": 0.5}, step=1)
    time.sleep(1.5)
    logger.close()
    client = MlflowClient(store_uri)
    system = {k for k in client.get_run(logger.run_id).data.metrics if k.startswith("system/")}
    assert {"system/cpu_utilization_percentage", "system/system_memory_usage_megabytes"} <= system
    history = client.get_metric_history(logger.run_id, "system/cpu_utilization_percentage")
    assert len(history) >= 2 and [m.step for m in history] == list(range(len(history)))
    time.sleep(0.5)
    after = client.get_metric_history(logger.run_id, "system/cpu_utilization_percentage")
    assert len(after) == len(history), "close stops the sampling"
    assert describe_metric("system/cpu_utilization_percentage").startswith("MLflow's own")


def test_a_logger_without_an_interval_samples_no_system_metrics(tmp_path, store_uri):
    with MLflowLogger("proj", "nosys", run_dir=tmp_path, tracking_uri=store_uri) as logger:
        logger.log_metrics({"actor/pg_loss": 0.5}, step=1)
        time.sleep(0.3)
    metrics = MlflowClient(store_uri).get_run(logger.run_id).data.metrics
    assert not any(name.startswith("system/") for name in metrics)
