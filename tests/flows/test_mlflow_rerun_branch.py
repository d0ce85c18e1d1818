"""A ``ppoflow rerun`` branch as an MLflow run (flows/rerun.py ``log_branch_run``): next to its
parent, nested under it, with the step's metrics and the diff table; against SQLite in tmp."""

from __future__ import annotations

import json

import mlflow.artifacts
import pytest
from mlflow.tracking import MlflowClient

from flows.rerun_diff import MetricChange, branch_tags, diff_rows, log_branch_run
from flows.runs.identity import config_digest, run_info
from flows.runs.store import RunStore
from flows.sinks.mlflow_logger import MLflowLogger
from stages.config import load_config

INFO = {"step": 3, "from": "reward", "to": "advantage", "overrides": ["algorithm.gamma=0.9"]}
CHANGES = [MetricChange("critic/score/mean", 0.0, 0.5), MetricChange("reward/new", None, 1.0)]


@pytest.fixture(scope="module")
def store_uri(tmp_path_factory) -> str:
    """One SQLite store for the module (creating one costs several seconds of migrations)."""
    return f"sqlite:///{tmp_path_factory.mktemp('mlflow') / 'mlflow.db'}"


def parent_run(tmp_path, store_uri: str) -> tuple[RunStore, str]:
    """A parent run directory whose run_info.json names its MLflow run in ``store_uri``."""
    with MLflowLogger("proj", "parent", tracking_uri=store_uri) as logger:
        logger.log_metrics({"critic/score/mean": 0.0}, 3)
    parent = RunStore(tmp_path / "parent")
    identity = {
        "mlflow_run_id": logger.run_id,
        "mlflow_tracking_uri": store_uri,
        "mlflow_experiment": "proj",
    }
    parent.save_run_info(run_info({}, parent.root, identity))
    return parent, logger.run_id


def test_a_branch_is_nested_under_its_parent_in_the_parents_store(tmp_path, store_uri, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI")  # neither the env var nor the key: the parent's
    parent, parent_id = parent_run(tmp_path, store_uri)
    cfg = load_config(
        None,
        ["trainer.project_name=proj", "trainer.experiment_name=exp", "algorithm.gamma=0.9"],
    )
    branch = RunStore(tmp_path / "branch")
    metrics = {"critic/score/mean": 0.5, "reward/new": 1.0, "training/global_step": 3.0}
    run_id = log_branch_run(cfg, parent, branch, INFO, metrics, CHANGES)

    client = MlflowClient(store_uri)
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED" and run.info.run_name == "exp-rerun-step3-reward"
    assert run.info.experiment_id == client.get_run(parent_id).info.experiment_id
    tags = run.data.tags
    assert tags["mlflow.parentRunId"] == parent_id == tags["ppoflow.parent_mlflow_run_id"]
    assert tags["ppoflow.parent_run_dir"] == parent.root
    assert tags["ppoflow.run_dir"] == branch.root
    assert tags["ppoflow.config_digest"] == config_digest(cfg)
    assert (tags["ppoflow.rerun.step"], tags["ppoflow.rerun.from"]) == ("3", "reward")
    assert json.loads(tags["ppoflow.rerun.overrides"]) == ["algorithm.gamma=0.9"]
    assert run.data.params["algorithm.gamma"] == "0.9"
    history = client.get_metric_history(run_id, "critic/score/mean")
    assert [(m.step, m.value) for m in history] == [(3, 0.5)]
    diff = mlflow.artifacts.load_dict(f"{run.info.artifact_uri}/metric_diff.json")
    assert diff["columns"] == ["metric", "original", "re-run", "delta"]
    assert diff["data"] == [["critic/score/mean", 0.0, 0.5, 0.5], ["reward/new", None, 1.0, None]]
    logged = json.loads(tags["mlflow.loggedArtifacts"])
    assert {"path": "metric_diff.json", "type": "table"} in logged
    info = branch.load_run_info()
    assert info["mlflow_run_id"] == run_id and info["mlflow_tracking_uri"] == store_uri


def test_a_parent_in_another_store_is_named_but_not_nested(tmp_path):
    parent = RunStore(tmp_path / "parent")
    info = {"mlflow_run_id": "p1", "mlflow_tracking_uri": "http://old:5000"}
    tags = branch_tags(parent, info, "sqlite:////new/mlflow.db", INFO)
    assert tags["ppoflow.parent_mlflow_run_id"] == "p1" and "mlflow.parentRunId" not in tags
    unrecorded = branch_tags(parent, {}, "sqlite:////new/mlflow.db", INFO)
    assert unrecorded["ppoflow.parent_run_dir"] == parent.root
    assert "ppoflow.parent_mlflow_run_id" not in unrecorded
    assert "mlflow.parentRunId" not in unrecorded


def test_diff_rows_keep_the_missing_side_empty():
    assert diff_rows(CHANGES) == [
        {"metric": "critic/score/mean", "original": 0.0, "re-run": 0.5, "delta": 0.5},
        {"metric": "reward/new", "original": None, "re-run": 1.0, "delta": None},
    ]
