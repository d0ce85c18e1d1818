"""Sweeps over a past step (flows/rerun_sweep.py): the grid, the checks made before anything
runs, and the table."""

from __future__ import annotations

import re
from types import SimpleNamespace

import pytest

from flows.rerun_sweep import (
    SweepAxis,
    axis_problem,
    format_table,
    grid,
    label,
    parse_axes,
    readers,
    sweep_rows,
)


def test_axes_are_parsed_and_a_bad_one_is_one_line():
    axes = parse_axes(
        ["algorithm.adv_estimator=grpo,rloo", "actor_rollout_ref.actor.clip_ratio=0.1,0.3"]
    )
    assert axes == [
        SweepAxis("algorithm.adv_estimator", ("grpo", "rloo")),
        SweepAxis("actor_rollout_ref.actor.clip_ratio", ("0.1", "0.3")),
    ]
    for spec, needle in [
        ("algorithm.adv_estimator", "is not KEY=V1,V2,…"),
        ("algorithm.adv_estimator=grpo,,rloo", "is not KEY=V1,V2,…"),
        ("=grpo", "is not KEY=V1,V2,…"),
        ("algorithm.adv_estimator=grpo,grpo", "names a value twice"),
    ]:
        with pytest.raises(ValueError, match=re.escape(needle)):
            parse_axes([spec])
    with pytest.raises(ValueError, match=re.escape("--sweep names algorithm.gamma twice")):
        parse_axes(["algorithm.gamma=0.9", "algorithm.gamma=1.0"])


def test_the_grid_is_every_combination_first_axis_slowest():
    points = grid([SweepAxis("a.x", ("1", "2", "3")), SweepAxis("b.y", ("p", "q"))])
    assert len(points) == 6
    assert points[:3] == [("a.x=1", "b.y=p"), ("a.x=1", "b.y=q"), ("a.x=2", "b.y=p")]
    assert label(points[-1]) == "x=3 y=q"


def test_a_key_is_read_by_the_stages_that_declare_it_or_its_section():
    assert readers("algorithm.adv_estimator") == ["advantage"]
    assert readers("actor_rollout_ref.actor.clip_ratio") == ["update_actor"]
    assert readers("actor_rollout_ref.rollout.temperature") == ["rollout"]
    assert readers("trainer.total_epochs") == []


def test_an_axis_that_would_change_nothing_is_refused_before_anything_runs():
    before = ["rollout", "balance", "reward", "old_log_prob"]
    temperature = SweepAxis("actor_rollout_ref.rollout.temperature", ("0.5", "1.0"))
    assert axis_problem(temperature, "advantage", before) == (
        "--sweep actor_rollout_ref.rollout.temperature is read by the rollout stage(s), before "
        "--from advantage: every branch would reuse the original's artifacts; pass --from rollout"
    )
    epochs = SweepAxis("trainer.total_epochs", ("1", "2"))
    assert "no stage of the step reads it" in axis_problem(epochs, "advantage", before)
    estimator = SweepAxis("algorithm.adv_estimator", ("grpo", "rloo"))
    assert axis_problem(estimator, "advantage", before) is None


def test_the_table_holds_the_metrics_any_branch_changed_with_the_original_first():
    original = {"critic/advantages/mean": 0.0, "actor/pg_loss": 0.5, "timing_s/step": 1.0}
    points = [("algorithm.adv_estimator=grpo",), ("algorithm.adv_estimator=rloo",)]
    branches = [
        SimpleNamespace(
            metrics={"critic/advantages/mean": 0.0, "actor/pg_loss": 0.5, "timing_s/step": 2.0}
        ),
        SimpleNamespace(
            metrics={"critic/advantages/mean": 0.1, "actor/pg_loss": 0.4, "timing_s/step": 3.0}
        ),
    ]
    rows = sweep_rows(original, points, branches)
    assert rows == [
        {
            "metric": "actor/pg_loss",
            "original": 0.5,
            "adv_estimator=grpo": 0.5,
            "adv_estimator=rloo": 0.4,
        },
        {
            "metric": "critic/advantages/mean",
            "original": 0.0,
            "adv_estimator=grpo": 0.0,
            "adv_estimator=rloo": 0.1,
        },
    ]
    headings = {"original": "original", "adv_estimator=grpo": "b0", "adv_estimator=rloo": "b1"}
    table = format_table(rows, headings).splitlines()
    assert table[0].split() == ["metric", "original", "b0", "b1"]
    assert table[1].split() == ["actor/pg_loss", "0.5", "0.5", "0.4"]
    assert "timing_s" not in "\n".join(table)
    assert format_table([], headings).startswith("no metric differs")
