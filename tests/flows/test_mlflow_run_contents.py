"""Issue 7, test 7: the MLflow run of a training holds the metric registry's every-step metrics
(at step = global_step), the flattened config as params, and its artifacts (resolved config,
metric-name mapping and descriptions, validation generations as MLflow tables, the end-of-run
PNG plots).

One 2-step GRPO run on the tiny model and the demo task (4 prompts × n 2, 8 response tokens,
validation before training and at step 2, 3 sample generations logged), read back with
MlflowClient.
"""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import mlflow.artifacts
import pytest
from mlflow.tracking import MlflowClient

from flows.sinks.mlflow_logger import flatten_config, truncate_param
from flows.train import resolve_config, train
from stages.metrics.catalog import describe_metric, find_metric_doc, step_metric_names
from stages.metrics.naming import restore_metric_name, sanitize_metric_name

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "configs" / "demo-cpu.yaml"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
FLAGS = ("use_critic", "use_reference_policy", "balance_batch", "use_kl_in_reward", "use_kl_loss",
         "recomputes_old_log_probs")  # fmt: skip


#: 2 steps, validation before training and at step 2, 3 generations logged per validation
SMALL_RUN = (
    "trainer.save_freq=0",
    "trainer.val_before_train=true",
    "trainer.log_val_generations=3",
)


def same(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or a == pytest.approx(b, rel=1e-6, abs=1e-9)


@pytest.mark.parametrize("flags", list(itertools.product([False, True], repeat=len(FLAGS))))
def test_every_step_metric_the_registry_lists_is_described(flags):
    names = step_metric_names(**dict(zip(FLAGS, flags)))
    assert len(names) == len(set(names))
    assert [name for name in names if find_metric_doc(name) is None] == []


@pytest.mark.slow
@pytest.mark.usefixtures("prefect_harness")
def test_mlflow_run_holds_registry_metrics_params_and_artifacts(
    tmp_path, make_demo_inputs, tiny_run_overrides
):
    demo = make_demo_inputs(tmp_path, n_train=16, n_val=4)
    overrides = tiny_run_overrides(demo, tmp_path, 2, *SMALL_RUN)
    cfg = resolve_config(CONFIG, overrides)
    result = train(CONFIG, overrides, str(tmp_path / "run"))
    assert len(result.history) == 2
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path}/mlflow.db")
    run = client.get_run(result.mlflow_run_id)
    assert run.info.status == "FINISHED" and run.info.run_name == cfg.trainer.experiment_name
    assert client.get_experiment(run.info.experiment_id).name == cfg.trainer.project_name

    # metrics: every name the registry expects of this config, at step = global_step, as computed
    expected = step_metric_names(
        use_critic=cfg.derived.use_critic,
        use_reference_policy=cfg.derived.use_reference_policy,
        balance_batch=cfg.trainer.balance_batch,
        use_kl_in_reward=cfg.algorithm.use_kl_in_reward,
        use_kl_loss=cfg.actor_rollout_ref.actor.use_kl_loss,
        recomputes_old_log_probs=not cfg.algorithm.rollout_correction.bypass_mode,
    )
    assert "actor/ppo_kl" in expected and "critic/vf_loss" not in expected
    # the hf rollout's old log-probs are reused: the update measures the entropy, every step
    assert "actor/entropy" in expected
    for name in expected:
        logged = client.get_metric_history(run.info.run_id, sanitize_metric_name(name))
        assert [m.step for m in logged] == [1, 2], name
        for metric, row in zip(logged, result.history):
            assert same(metric.value, row[name]), (name, metric.value, row[name])
    steps = client.get_metric_history(run.info.run_id, "training/global_step")
    assert [(m.step, m.value) for m in steps] == [(1, 1.0), (2, 2.0)]
    val_core = [name for name in result.history[1] if name.startswith("val-core/")]
    assert val_core, "no val-core metric at step 2"
    for name in val_core:  # validation before training (step 0) and at the last step
        logged = client.get_metric_history(run.info.run_id, sanitize_metric_name(name))
        assert [m.step for m in logged] == [0, 2], name
    absent = {"critic/vf_loss", "critic/values/mean", "timing_s/ref", "actor/reward_kl_penalty"}
    assert absent.isdisjoint(restore_metric_name(name) for name in run.data.metrics)

    # params: the resolved config flattened
    params = run.data.params
    flat = flatten_config(cfg)
    assert set(params) == set(flat)
    assert all(params[key] == truncate_param(value) for key, value in flat.items())
    assert params["algorithm.adv_estimator"] == "grpo"
    assert params["actor_rollout_ref.rollout.n"] == "2"

    # artifacts
    def load(name: str):
        return mlflow.artifacts.load_dict(f"{run.info.artifact_uri}/{name}")

    top = {item.path for item in client.list_artifacts(run.info.run_id)}
    assert {"config.json", "metric_names.json", "metric_descriptions.json"} <= top
    assert {"val_generations", "train_generations", "plots"} <= top
    assert load("config.json")["algorithm"]["adv_estimator"] == "grpo"
    names = load("metric_names.json")
    # MLflow's own system/* samples (every ppoflow.mlflow_system_metrics_interval_s) are not ours
    assert set(names) == {m for m in run.data.metrics if not m.startswith("system/")}
    assert all(sanitize_metric_name(original) == safe for safe, original in names.items())
    descriptions = load("metric_descriptions.json")
    assert all(descriptions[name] == describe_metric(name) for name in expected)
    generations = {item.path for item in client.list_artifacts(run.info.run_id, "val_generations")}
    assert generations == {"val_generations/step_000000.json", "val_generations/step_000002.json"}
    table = load("val_generations/step_000002.json")  # MLflow's table file (pandas "split" layout)
    rows = [dict(zip(table["columns"], row)) for row in table["data"]]
    assert len(rows) == 3 and all(row["step"] == 2 for row in rows)
    assert set(table["columns"]) == {"step", "input", "output", "score", "ground_truth"}
    # a sample of the training batches: 2 prompt groups (ppoflow.log_train_generations) × n 2,
    # at step 1 and at the last step (which validates)
    trained = {item.path for item in client.list_artifacts(run.info.run_id, "train_generations")}
    assert trained == {"train_generations/step_000001.json", "train_generations/step_000002.json"}
    table = load("train_generations/step_000002.json")
    rows = [dict(zip(table["columns"], row)) for row in table["data"]]
    assert len(rows) == 4 and len({row["uid"] for row in rows}) == 2
    assert {"uid", "input", "output", "score", "advantage", "response_length"} <= set(rows[0])
    for uid in {row["uid"] for row in rows}:  # GRPO: a group's advantages are its scores, centred
        group = [row for row in rows if row["uid"] == uid]
        assert sum(row["advantage"] or 0.0 for row in group) == pytest.approx(0.0, abs=1e-5)
    # the same groups as a sample page each time (flows/runs/sample_page.py)
    pages = {item.path for item in client.list_artifacts(run.info.run_id, "train_samples")}
    assert pages == {"train_samples/step_000001.html", "train_samples/step_000002.html"}
    page = Path(
        mlflow.artifacts.download_artifacts(
            run_id=run.info.run_id,
            artifact_path="train_samples/step_000002.html",
            tracking_uri=f"sqlite:///{tmp_path}/mlflow.db",
            dst_path=str(tmp_path / "pages"),
        )
    ).read_text(encoding="utf-8")
    data = json.loads(page.split('id="data">', 1)[1].split("</script>", 1)[0])
    assert data["step"] == 2 and len(data["samples"]) == 4
    assert {s["uid"] for s in data["samples"]} == {row["uid"] for row in rows}
    tables = json.loads(run.data.tags["mlflow.loggedArtifacts"])
    assert {t["path"] for t in tables} == generations | trained
    assert {t["type"] for t in tables} == {"table"}
    plots = {item.path for item in client.list_artifacts(run.info.run_id, "plots")}
    assert plots == {"plots/reward.png", "plots/response_length.png", "plots/kl.png"}
    for plot in sorted(plots):
        local = mlflow.artifacts.download_artifacts(
            run_id=run.info.run_id,
            artifact_path=plot,
            tracking_uri=f"sqlite:///{tmp_path}/mlflow.db",
            dst_path=str(tmp_path / "downloaded"),
        )
        assert Path(local).read_bytes().startswith(PNG_SIGNATURE), plot
