"""The pure parts of ``flows.rerun``: stage windows, metric diffs, lazy engines, parent checks."""

from __future__ import annotations

import math

import pytest

from flows.rerun import LazyEngines, parent_step, stage_window
from flows.rerun_diff import format_diff, metric_diff
from flows.runs.store import RunStore, StepJournal


def test_window_reuses_every_stage_before_from():
    stages, before = stage_window("old_log_prob", None)
    assert before == ["rollout", "baseline_rollout", "balance", "reward", "baseline_reward"]
    assert [s.name for s in stages][-1] == "update_actor"  # --to defaults to the end (metrics)


def test_window_to_cuts_the_plan():
    stages, _ = stage_window("reward", "reward")
    assert [s.name for s in stages] == ["rollout", "baseline_rollout", "balance", "reward"]


@pytest.mark.parametrize(
    ("start", "stop", "message"),
    [
        ("advantages", None, "--from 'advantages' is not a stage"),
        ("advantage", "update", "--to 'update' is not a stage"),
        ("update_actor", "reward", "comes before"),
    ],
)
def test_window_errors_name_the_bad_stage(start, stop, message):
    with pytest.raises(ValueError, match=message) as info:
        stage_window(start, stop)
    assert "update_critic" in str(info.value) or "comes before" in message


def test_metric_diff_keeps_changed_and_one_sided_and_treats_nan_as_equal():
    before = {"a": 1.0, "n": math.nan, "gone": 2.0, "timing_s/step": 1.0}
    after = {"a": 1.5, "n": math.nan, "new": 3.0, "timing_s/step": 9.0}
    changes = {c.name: (c.before, c.after, c.delta) for c in metric_diff(before, after)}
    assert changes == {"a": (1.0, 1.5, 0.5), "gone": (2.0, None, None), "new": (None, 3.0, None)}
    assert "timing_s/step" in {c.name for c in metric_diff(before, after, include_timing=True)}


def test_format_diff_lists_changes_and_counts():
    text = format_diff(metric_diff({"x": 1.0}, {"x": 2.0}), unchanged=4)
    assert "x" in text and "1 changed, 4 unchanged" in text
    assert format_diff([], 3).startswith("no metric changed (3 compared")


def test_lazy_engines_build_on_first_access_only():
    made = []

    def build():
        made.append("pair")
        return {"a": 1, "b": 2}

    engines = LazyEngines({"a": build, "b": build, "c": lambda: {"c": 3}})
    assert "a" in engines and sorted(engines) == ["a", "b", "c"] and made == []
    assert engines["b"] == 2 and engines["a"] == 1 and made == ["pair"]
    assert engines.built == ["a", "b"]
    with pytest.raises(KeyError):
        engines["d"]


def test_parent_step_needs_a_finished_step(tmp_path):
    store = RunStore(tmp_path / "run")
    store.write_journal(StepJournal(1, status="running", input_artifact="x"))
    with pytest.raises(ValueError, match="has no step 2; its steps are \\[1\\]"):
        parent_step(store, 2)
    with pytest.raises(ValueError, match="did not finish"):
        parent_step(store, 1)
