"""The experiment's headline chart view (flows/sinks/headline_view.py) as the MLflow logger
writes it: an experiment tag MLflow's runs page loads, linked from the run description."""

from __future__ import annotations

import base64
import json
import zlib

from mlflow.tracking import MlflowClient

from flows.sinks.headline_view import VIEW_TAG, headline_metrics, section_name
from flows.sinks.mlflow_logger import MLflowLogger


def saved_state(client: MlflowClient, experiment_id: str) -> tuple[dict, dict]:
    envelope = json.loads(client.get_experiment(experiment_id).tags[VIEW_TAG])
    packed = envelope["state"].removeprefix("deflate;")
    return envelope, json.loads(zlib.decompress(base64.b64decode(packed)))


def test_headline_metrics_come_first_in_the_order_a_run_is_judged_by():
    names = [
        "actor/pg_loss",
        "actor/kl_loss",
        "actor/entropy",
        "response_length/clip_ratio",
        "response_length/mean",
        "val-aux/gsm8k/reward/mean@4",
        "val-core/math/acc/mean@4",
        "val-core/gsm8k/acc/mean@4",
        "critic/score/max",
        "critic/score/mean",
    ]
    assert headline_metrics(names) == [
        "critic/score/mean",
        "val-core/gsm8k/acc/mean@4",
        "val-core/math/acc/mean@4",
        "val-aux/gsm8k/reward/mean@4",
        "response_length/mean",
        "response_length/clip_ratio",
        "actor/entropy",
        "actor/kl_loss",
    ]
    assert section_name("val-core/gsm8k/acc/mean_at_4") == "val-core/gsm8k/acc"


def test_the_logger_writes_the_view_with_mlflow_names_and_links_it(tmp_path):
    uri = f"sqlite:///{tmp_path / 'view.db'}"
    with MLflowLogger("proj", "exp", run_dir=tmp_path, tracking_uri=uri) as logger:
        logger.log_metrics({"actor/pg_loss": 0.5, "timing_s/gen": 1.0}, step=1)
        logger.flush()
        client = MlflowClient(uri)
        experiment_id = client.get_run(logger.run_id).info.experiment_id
        assert VIEW_TAG not in client.get_experiment(experiment_id).tags, "no headline metric yet"
        logger.log_metrics({"critic/score/mean": 0.1, "val-core/demo/acc/mean@1": 0.2}, step=2)
        logger.flush()
        first_envelope, _ = saved_state(client, experiment_id)
        logger.log_metrics({"actor/entropy": 2.0}, step=3)
    envelope, state = saved_state(client, experiment_id)
    assert envelope["name"] == "Headline charts (ppoflow)"
    assert envelope["createdAt"] == first_envelope["createdAt"] <= envelope["updatedAt"]
    charts = state["compareRunCharts"]
    assert [chart["metricKey"] for chart in charts] == [
        "critic/score/mean",
        "val-core/demo/acc/mean_at_1",  # the name MLflow holds (stages/metrics/naming.py)
        "actor/entropy",
    ]
    sections = [section["name"] for section in state["compareRunSections"]]
    assert sections == ["Headline", "actor", "critic/score", "timing_s", "val-core/demo/acc"]
    assert {chart["metricSectionId"] for chart in charts} == {
        state["compareRunSections"][0]["uuid"]
    }
    assert state["isAccordionReordered"] is True
    note = client.get_run(logger.run_id).data.tags["mlflow.note.content"]
    link = (
        f"(#/experiments/{experiment_id}/runs?compareRunsMode=CHART"
        "&viewStateShareKey=ppoflow-headline&workflowType=machine_learning)"
    )
    assert f"[the headline charts first]{link}" in note
