"""A resumed training's MLflow run (MLflowLogger.continue_run), its tags, description and tables,
against a SQLite store in tmp: every step exactly once in the history after a kill and a resume."""

from __future__ import annotations

import json
import logging

import mlflow.artifacts
import pytest
from mlflow.tracking import MlflowClient

from flows.runs.identity import CACHE_HITS, run_tags
from flows.sinks.fanout import ResumedRun
from flows.sinks.mlflow_logger import CHANGED_PARAMS_TAG, MLflowLogger
from flows.sinks.run_description import NOTE_TAG, metric_doc
from stages.metrics.catalog import find_metric_doc

CONFIG = {"trainer": {"total_training_steps": 4, "seed": 1}, "algorithm": {"gamma": 1.0}}
RESUMED_CONFIG = {"trainer": {"total_training_steps": 6, "seed": 1}, "algorithm": {"gamma": 1.0}}


def step_metrics(step: int, offset: float = 0.0) -> dict[str, float]:
    return {
        "training/global_step": float(step),
        "actor/pg_loss": step / 10 + offset,
        CACHE_HITS: 0.0,
    }


@pytest.fixture(scope="module")
def store_uri(tmp_path_factory) -> str:
    """One SQLite store for the module (creating one costs several seconds of migrations)."""
    return f"sqlite:///{tmp_path_factory.mktemp('mlflow') / 'mlflow.db'}"


def history_of(client: MlflowClient, run_id: str, key: str) -> list[tuple[int, float]]:
    """The metric's (step, value) points, by step (a replayed step is logged later)."""
    return sorted((m.step, m.value) for m in client.get_metric_history(run_id, key))


def killed_run(store_uri: str, name: str, logged_steps: list[int]) -> str:
    """A run whose process died: the steps in ``logged_steps`` reached MLflow, it was never
    closed (status RUNNING)."""
    logger = MLflowLogger("proj", name, tracking_uri=store_uri, deferred=True)
    logger.log_params(CONFIG)
    for step in logged_steps:
        logger.log_metrics(step_metrics(step), step)
    assert logger.flush()
    return logger.run_id


def test_a_resume_continues_the_run_and_holds_every_step_once(store_uri, caplog):
    # killed after the step-2 checkpoint: step 2's metrics never reached MLflow (the kill came
    # between checkpoint and publishing), step 3 did (published before the kill in step 4)
    run_id = killed_run(store_uri, "killed", [1, 3])
    history = {1: step_metrics(1), 2: {**step_metrics(2), "val-core/d/acc/mean@1": 0.5}}
    resumed = MLflowLogger("proj", "killed", tracking_uri=store_uri, deferred=True)
    resumed.continue_run(ResumedRun(2, run_id, store_uri, history))
    with caplog.at_level(logging.INFO, logger="flows.sinks.mlflow_logger"):
        resumed.log_params(RESUMED_CONFIG)
    assert resumed.run_id == run_id
    client = MlflowClient(store_uri)
    assert client.get_run(run_id).info.status == "RUNNING"
    resumed.log_metrics({"val-core/d/acc/mean@1": 0.75}, 2)  # validation before training at N
    for step in (3, 4):  # the resumed process computes 3 again, then 4
        resumed.log_metrics(step_metrics(step, offset=100.0), step)
    resumed.close()

    run = client.get_run(run_id)
    assert run.info.status == "FINISHED"
    assert history_of(client, run_id, "training/global_step") == [
        (s, float(s)) for s in (1, 2, 3, 4)
    ]
    losses = history_of(client, run_id, "actor/pg_loss")
    assert losses == [(1, 0.1), (2, 0.2), (3, 0.3), (4, 100.4)]  # step 3 keeps its first values
    assert history_of(client, run_id, "val-core/d/acc/mean_at_1") == [(2, 0.5)]
    assert "2 steps, 1 replayed from the journals ([2])" in caplog.text
    # params: unchanged ones are not logged again, a changed one is named in a tag
    assert run.data.params["trainer.total_training_steps"] == "4"
    assert run.data.tags[CHANGED_PARAMS_TAG] == "trainer.total_training_steps: 4 → 6"
    resumed_config = mlflow.artifacts.load_dict(
        f"{run.info.artifact_uri}/config_resumed_step_2.json"
    )
    assert resumed_config["trainer"]["total_training_steps"] == 6
    names = mlflow.artifacts.load_dict(f"{run.info.artifact_uri}/metric_names.json")
    assert names["val-core/d/acc/mean_at_1"] == "val-core/d/acc/mean@1"
    assert {"training/global_step", "actor/pg_loss", CACHE_HITS} <= set(names.values())


def test_a_resume_that_lost_nothing_replays_nothing(store_uri):
    run_id = killed_run(store_uri, "clean", [1, 2])
    resumed = MLflowLogger("proj", "clean", tracking_uri=store_uri, deferred=True)
    resumed.continue_run(ResumedRun(2, run_id, store_uri, {1: step_metrics(1), 2: step_metrics(2)}))
    resumed.log_params(CONFIG)
    resumed.log_metrics(step_metrics(3), 3)
    resumed.close("FAILED")
    client = MlflowClient(store_uri)
    assert history_of(client, run_id, "actor/pg_loss") == [(1, 0.1), (2, 0.2), (3, 0.3)]
    run = client.get_run(run_id)
    assert run.info.status == "FAILED" and CHANGED_PARAMS_TAG not in run.data.tags


def test_a_resume_into_another_store_starts_a_new_run_with_the_steps_replayed(store_uri):
    history = {1: step_metrics(1), 2: step_metrics(2)}
    resumed = MLflowLogger("proj", "moved", tracking_uri=store_uri, deferred=True)
    resumed.continue_run(ResumedRun(2, "0" * 32, "http://elsewhere:5000", history))
    resumed.log_params(CONFIG)
    resumed.log_metrics(step_metrics(3), 3)
    resumed.close()
    client = MlflowClient(store_uri)
    assert resumed.run_id != "0" * 32
    assert history_of(client, resumed.run_id, "actor/pg_loss") == [(1, 0.1), (2, 0.2), (3, 0.3)]
    artifacts = {item.path for item in client.list_artifacts(resumed.run_id)}
    assert "config.json" in artifacts  # a new run: its config, not a resumed one


def test_a_deleted_run_is_continued_by_a_new_run(store_uri, caplog):
    run_id = killed_run(store_uri, "deleted", [1])
    MlflowClient(store_uri).delete_run(run_id)
    resumed = MLflowLogger("proj", "deleted", tracking_uri=store_uri, deferred=True)
    resumed.continue_run(ResumedRun(1, run_id, store_uri, {1: step_metrics(1)}))
    with caplog.at_level(logging.WARNING, logger="flows.sinks.mlflow_logger"):
        resumed.log_params(CONFIG)
    resumed.close()
    assert resumed.run_id != run_id and "(deleted?); a new run continues it" in caplog.text
    client = MlflowClient(store_uri)
    assert history_of(client, resumed.run_id, "actor/pg_loss") == [(1, 0.1)]


def test_tags_and_the_description_name_the_run_and_every_metric(store_uri, tmp_path):
    tags = run_tags(CONFIG, str(tmp_path / "run"), resumed_from_step=3)
    with MLflowLogger("proj", "described", tracking_uri=store_uri) as logger:
        logger.set_tags(tags)
        logger.log_metrics({**step_metrics(4), "critic/score/mean": 0.5, "critic/score/max": 1}, 4)
    run = MlflowClient(store_uri).get_run(logger.run_id)
    assert {key: run.data.tags[key] for key in tags} == tags
    assert tags["ppoflow.resumed_from_step"] == "3" and len(tags["ppoflow.config_digest"]) == 64
    note = run.data.tags[NOTE_TAG]
    header, charts, table = note.split("\n\n")
    assert header.startswith("**described** · run directory") and "resumed from step 3" in header
    assert charts.startswith("**Charts:** [the headline charts first](#/experiments/")
    rows = table.splitlines()[2:]
    assert len(rows) == 4  # critic/score/{max,mean} share their catalog entry's row
    score = find_metric_doc("critic/score/mean")
    assert (
        f"| `critic/score/max`, `critic/score/mean` | {score.what} | {score.denominator} |" in rows
    )
    hits = metric_doc(CACHE_HITS)  # the train flow's own metric, beside the catalog
    assert any(row.startswith(f"| `{CACHE_HITS}` | {hits.what}") for row in rows)


def test_a_table_is_logged_once_per_file(store_uri, tmp_path):
    rows = [{"step": 2, "input": "copy: a", "output": "a", "score": 1.0}]
    with MLflowLogger("proj", "tables", tracking_uri=store_uri) as logger:
        logger.log_table(rows, "val_generations/step_2.json")
        logger.log_table(rows, "val_generations/step_2.json")  # a resumed run validating again
    run = MlflowClient(store_uri).get_run(logger.run_id)
    # MLflow's table file: pandas' "split" layout (MlflowClient.load_table reads it, but searches
    # the runs through the global tracking URI, so it cannot be pointed at this store)
    table = mlflow.artifacts.load_dict(f"{run.info.artifact_uri}/val_generations/step_2.json")
    assert table["columns"] == ["step", "input", "output", "score"]
    assert table["data"] == [[2, "copy: a", "a", 1.0]]
    logged = json.loads(run.data.tags["mlflow.loggedArtifacts"])
    assert logged == [{"path": "val_generations/step_2.json", "type": "table"}]
