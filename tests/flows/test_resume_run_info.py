"""What a run records about itself for a resume: run_info.json (RunStore), the checkpoint's run
entry and step metrics (flows/runs/checkpoints.py), the history a resume replays and the identity
helpers (flows/runs/identity.py). No training: journals and checkpoints are written by hand."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace

import pytest

from flows.runs.checkpoints import (
    checkpoint_metrics,
    checkpoint_run,
    read_run_state,
    save_run_checkpoint,
    tracking_state,
)
from flows.runs.identity import (
    CACHE_HITS,
    cache_hits,
    config_digest,
    mlflow_identity,
    resume_history,
    run_info,
    run_tags,
)
from flows.runs.store import RUN_INFO_FILE, RunStore, StageRecord, StepJournal
from flows.sinks.fanout import MetricSinks
from flows.version import ppoflow_version
from stages.config import load_config
from stages.engines.checkpoint import read_latest_step
from stages.engines.checkpoint_manifest import CheckpointIntegrityError

MLFLOW = {
    "mlflow_run_id": "abc123",
    "mlflow_tracking_uri": "sqlite:////x/mlflow.db",
    "mlflow_experiment": "proj",
}
KEEP_ALL = SimpleNamespace(max_actor_ckpt_to_keep=None, max_critic_ckpt_to_keep=None)


def test_run_info_round_trips_and_names_what_is_missing(tmp_path):
    store = RunStore(tmp_path / "run")
    info = run_info({"a": 1}, store.root, MLFLOW, resumed_from_step=2)
    store.save_run_info(info)
    assert store.load_run_info() == info
    assert json.loads((tmp_path / "run" / RUN_INFO_FILE).read_text()) == info
    assert info["working_dir"] == str(Path.cwd()) and info["resumed_from_step"] == 2
    assert info["config_digest"] == config_digest({"a": 1})
    assert info["ppoflow_version"] == ppoflow_version()
    store.save_run_info(dict.fromkeys(MLFLOW))  # a run without an MLflow sink: all None
    assert store.load_run_info() == dict.fromkeys(MLFLOW)
    with pytest.raises(ValueError, match="mlflow_experiment is missing; expected each of"):
        store.save_run_info({"mlflow_run_id": "a", "mlflow_tracking_uri": "b"})
    with pytest.raises(ValueError, match="mlflow_run_id is 7; expected each of"):
        store.save_run_info({**MLFLOW, "mlflow_run_id": 7})
    with pytest.raises(KeyError, match="missing"):
        run_info({}, store.root, {"mlflow_run_id": None})


def test_a_missing_or_damaged_run_info_is_one_clear_error(tmp_path):
    store = RunStore(tmp_path / "run")
    with pytest.raises(FileNotFoundError, match=r"no run_info\.json"):
        store.load_run_info()
    store.save_json(RUN_INFO_FILE, {"mlflow_run_id": "a"})
    with pytest.raises(ValueError, match=r"lacks \['mlflow_tracking_uri', 'mlflow_experiment'\]"):
        store.load_run_info()
    (tmp_path / "run" / RUN_INFO_FILE).write_text("[1, 2]")
    with pytest.raises(ValueError, match="holds a list; expected an object"):
        store.load_run_info()
    (tmp_path / "run" / RUN_INFO_FILE).write_text('{"mlflow_run_id": ')
    with pytest.raises(ValueError, match="not valid JSON"):
        store.load_run_info()


def test_the_config_digest_is_canonical_and_sees_every_value(tmp_path):
    cfg = load_config(None, [])
    store = RunStore(tmp_path / "run")
    store.save_config(cfg)
    assert config_digest(cfg) == config_digest(store.load_config())  # = the run's config.json
    assert config_digest(cfg) != config_digest(load_config(None, ["trainer.seed=7"]))
    assert config_digest({"a": 1, "b": 2}) == config_digest({"b": 2, "a": 1})


def test_tags_name_the_version_run_dir_digest_and_resume(monkeypatch):
    tags = run_tags({"a": 1}, "/runs/r", resumed_from_step=None)
    assert tags["ppoflow.run_dir"] == "/runs/r" and tags["ppoflow.version"] == ppoflow_version()
    assert tags["ppoflow.config_digest"] == config_digest({"a": 1})
    assert "ppoflow.resumed_from_step" not in tags
    monkeypatch.setattr("flows.runs.identity.source_commit", lambda: None)  # an installed wheel
    assert "ppoflow.commit" not in run_tags({}, "/r")
    monkeypatch.setattr("flows.runs.identity.source_commit", lambda: "1a2b3c4d5e6f")
    assert run_tags({}, "/r", 5)["ppoflow.commit"] == "1a2b3c4d5e6f"
    assert run_tags({}, "/r", 5)["ppoflow.resumed_from_step"] == "5"


def test_cache_hits_count_the_cached_stages():
    records = [
        StageRecord("rollout", "cached", "cache hit"),
        StageRecord("reward", "cached", "cache hit"),
        StageRecord("values", "skipped", "disabled: uses_critic(config) is False"),
        StageRecord("update_actor", "ran", "writes weights"),
    ]
    assert cache_hits(records) == 2.0 and cache_hits([]) == 0.0


def test_the_mlflow_identity_comes_from_the_mlflow_sink():
    sink = SimpleNamespace(run_id="r1", tracking_uri="http://h:5000")
    assert mlflow_identity(MetricSinks({"mlflow": sink}, None), "proj") == {
        "mlflow_run_id": "r1",
        "mlflow_tracking_uri": "http://h:5000",
        "mlflow_experiment": "proj",
    }
    assert mlflow_identity(MetricSinks({}, None), "proj") == dict.fromkeys(MLFLOW)


def journal(step: int, status: str = "done", **metrics: float) -> StepJournal:
    return StepJournal(step=step, status=status, metrics=metrics)


def test_the_resume_history_is_the_journaled_steps_up_to_the_checkpoint(tmp_path):
    store = RunStore(tmp_path / "run")
    store.write_journal(journal(1, **{"training/global_step": 1.0, CACHE_HITS: 0.0}))
    store.write_journal(journal(2, **{"training/global_step": 2.0, "x": math.nan}))
    store.write_journal(journal(3, **{"training/global_step": 3.0}))  # after the checkpoint
    store.write_journal(journal(4, status="running"))
    published = {"training/global_step": 2.0, "x": 1.0, "val-core/d/acc/mean@1": 0.5}
    history = resume_history(store.root, 2, published)
    assert list(history) == [1, 2]
    assert history[1] == {"training/global_step": 1.0, CACHE_HITS: 0.0}
    assert history[2] == published  # the published metrics win over the journal's
    only_journals = resume_history(store.root, 4, None)
    assert list(only_journals) == [1, 2, 3] and math.isnan(only_journals[2]["x"])
    assert resume_history(None, 2, published) == {2: published}
    assert resume_history(str(tmp_path / "absent"), 2, {}) == {}


def test_a_checkpoint_records_its_run_and_the_published_step_metrics(tmp_path):
    identity = {"run_dir": "/runs/r1", **MLFLOW}
    metrics = {"training/global_step": 2.0, "val-core/d/acc/mean@1": 0.5, "x": math.inf}
    state = {"loader": {"position": 8}, **tracking_state(identity, metrics)}
    save_run_checkpoint(tmp_path / "ckpt", 2, {}, state, KEEP_ALL)
    assert read_latest_step(tmp_path / "ckpt") == 2
    saved = read_run_state(tmp_path / "ckpt", 2)
    assert saved["global_step"] == 2 and saved["loader"] == {"position": 8}
    assert checkpoint_run(saved) == identity
    assert checkpoint_metrics(saved) == metrics
    older = {"global_step": 1, "loader": {}}  # a checkpoint from before these entries
    assert checkpoint_run(older) == dict.fromkeys(identity) and checkpoint_metrics(older) == {}
    with pytest.raises(CheckpointIntegrityError, match=r"global_step_4: no such directory"):
        read_run_state(tmp_path / "ckpt", 4)
