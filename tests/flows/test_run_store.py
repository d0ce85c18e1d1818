"""The run directory: paths, journal round trip, config, input artifacts, fsspec roots."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from dataproto.artifact import load_artifact
from flows.runs.store import (
    RunStore,
    StageRecord,
    StepJournal,
    decode_metrics,
    encode_metrics,
)


def journal(step: int = 3) -> StepJournal:
    return StepJournal(
        step=step,
        status="done",
        input_artifact="/r/step_3/input",
        input_fingerprint="a" * 64,
        stages=[
            StageRecord(
                "reward",
                "ran",
                "cache miss",
                "/r/step_3/reward",
                "b" * 64,
                "c" * 64,
                4,
                128,
                0.25,
                {"critic/score/mean": 0.5},
            ),
            StageRecord("values", "skipped", "disabled: use_critic(config) is False"),
        ],
        metrics={"timing_s/step": 1.5, "actor/kl": float("nan")},
    )


def test_paths(tmp_path):
    store = RunStore(tmp_path / "run")
    assert store.artifact_path(2, "advantage") == f"{tmp_path}/run/step_2/advantage"
    assert store.input_path(2) == f"{tmp_path}/run/step_2/input"
    assert store.cache_dir == tmp_path / "run" / "cache"
    for bad in ("../x", "a/b", "", "input", ".hidden"):
        with pytest.raises(ValueError, match="cannot name an artifact folder"):
            store.artifact_path(1, bad)
    with pytest.raises(ValueError, match=r"step must be an int >= 0, got -1"):
        store.step_dir(-1)


def test_journal_round_trip_keeps_nan_metrics(tmp_path):
    store = RunStore(tmp_path / "run")
    url = store.write_journal(journal())
    assert Path(url) == tmp_path / "run" / "step_3" / "journal.json"
    back = store.read_journal(3)
    assert math.isnan(back.metrics.pop("actor/kl")) and back.metrics == {"timing_s/step": 1.5}
    assert back.stages == journal().stages and back.record("values").status == "skipped"
    with pytest.raises(KeyError, match=r"no record of stage 'update_actor'"):
        back.record("update_actor")
    assert store.steps() == [3]
    with pytest.raises(FileNotFoundError, match=r"no journal for step 4"):
        store.read_journal(4)


def test_metrics_encoding_refuses_non_scalars():
    assert decode_metrics(encode_metrics({"a": 2, "b": float("-inf")})) == {
        "a": 2.0,
        "b": -math.inf,
    }
    with pytest.raises(TypeError, match=r"stage 'x': metric 'actor/pg_loss' is list"):
        encode_metrics({"actor/pg_loss": [1.0, 2.0]}, "stage 'x'")
    with pytest.raises(ValueError, match=r"status 'done', expected"):
        StageRecord("x", "done", "")


def test_config_and_input_round_trip(tmp_path, make_config, toy_batch):
    store = RunStore(tmp_path / "run")
    store.save_config(make_config(factor=3.0))
    assert store.load_config() == {"toy": {"offset": 1.0, "factor": 3.0, "use_critic": False}}
    ref = store.save_input(1, toy_batch)
    again = store.save_input(1, toy_batch)  # replacing the input of a step is allowed
    assert ref.fingerprint == again.fingerprint and ref.rows == 4
    assert load_artifact(store.input_path(1)).non_tensor_batch["uid"].tolist() == [
        "a",
        "a",
        "b",
        "b",
    ]


def test_fsspec_root(toy_batch):
    store = RunStore("memory://ppoflow-test-run")
    assert store.root == "memory://ppoflow-test-run"
    assert "ppoflow-cache" in str(store.cache_dir) and store.cache_dir.is_absolute()
    store.save_input(1, toy_batch)
    store.write_journal(journal(step=1))
    store.save_config({"a": 1})
    assert store.steps() == [1] and store.read_journal(1).stages == journal().stages
    assert store.load_config() == {"a": 1}
    assert len(load_artifact(store.input_path(1))) == 4


def test_a_truncated_journal_is_named_in_one_line(tmp_path):
    store = RunStore(tmp_path / "run")
    store.write_journal(StepJournal(1, input_artifact=store.input_path(1), input_fingerprint="f"))
    journal = tmp_path / "run" / "step_1" / "journal.json"
    journal.write_text(journal.read_text()[:20])
    with pytest.raises(
        ValueError, match=r"step_1/journal.json: the journal for step 1 is not valid JSON"
    ):
        store.read_journal(1)
    assert store.previous_journal(1) is None  # only explains misses: never fails a step
