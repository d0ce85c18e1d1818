"""Metric, AggregationType, aggregate_dp and reduce_metrics' substring fallback."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from stages.metrics import AggregationType, Metric, reduce_metrics


@pytest.mark.parametrize(
    ("aggregation", "expected"), [("mean", 2.5), ("sum", 10.0), ("min", 1.0), ("max", 4.0)]
)
def test_aggregate(aggregation, expected):
    assert Metric(aggregation, [1, 2.0, 3, 4]).aggregate() == expected


def test_append_accepts_scalars_of_every_kind():
    metric = Metric(AggregationType.SUM)
    for value in [
        1,
        2.0,
        torch.tensor(3.0),
        torch.tensor([4.0]),
        np.float32(5.0),
        np.array(6.0),
        np.array([7]),
    ]:
        metric.append(value)
    metric.append(Metric("sum", [8.0]))
    assert metric.values == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]
    assert all(type(value) is float for value in metric.values)


def test_non_scalar_values_are_rejected():
    with pytest.raises(ValueError, match=r"shape \(2,\)"):
        Metric("mean").append(torch.tensor([1.0, 2.0]))
    with pytest.raises(ValueError, match="scalar"):
        Metric("mean").append(np.ones((2, 2)))
    with pytest.raises(TypeError, match="str"):
        Metric("mean").append("1.0")


def test_extend_requires_the_same_aggregation():
    metric = Metric("mean", [1.0])
    metric.extend(Metric("mean", [3.0]))
    assert metric.aggregate() == 2.0
    with pytest.raises(ValueError, match=r"'mean'.*'sum'"):
        metric.extend(Metric("sum", [1.0]))
    with pytest.raises(ValueError, match="'sum'"):
        metric.append(Metric("sum", [1.0]))


def test_unknown_aggregation_lists_the_known_ones():
    with pytest.raises(ValueError, match=r"median.*'mean', 'sum', 'min', 'max'"):
        Metric("median")


def test_empty_metric_cannot_aggregate():
    with pytest.raises(ValueError, match="empty"):
        Metric("max").aggregate()


# [dp = 2, micro = 3]
RANK_VALUES = [[1.0, 2.0, 6.0], [3.0, 4.0, 0.0]]


@pytest.mark.parametrize(
    ("aggregation", "expected"),
    [
        ("sum", 2.0 + 3.0 + 3.0),  # mean over ranks [2, 3, 3], then sum over micro-batches
        ("mean", (2.0 + 3.0 + 3.0) / 3),
        ("min", 0.0),  # over all six values
        ("max", 6.0),
    ],
)
def test_aggregate_dp(aggregation, expected):
    ranks = [Metric(aggregation, values) for values in RANK_VALUES]
    assert Metric.aggregate_dp(ranks) == pytest.approx(expected)


def test_aggregate_dp_errors():
    with pytest.raises(ValueError, match=r"\[2, 1\]"):
        Metric.aggregate_dp([Metric("sum", [1.0, 2.0]), Metric("sum", [1.0])])
    with pytest.raises(ValueError, match="one aggregation"):
        Metric.aggregate_dp([Metric("sum", [1.0]), Metric("mean", [1.0])])
    with pytest.raises(ValueError, match="at least one"):
        Metric.aggregate_dp([])


def test_from_dict_and_init_list():
    metrics = Metric.from_dict({"a": 1.0, "b": 2.0}, aggregation="max")
    assert {key: metric.aggregate() for key, metric in metrics.items()} == {"a": 1.0, "b": 2.0}
    empty = metrics["a"].init_list()
    assert empty.aggregation is AggregationType.MAX and empty.values == []


def test_reduce_metrics_substring_fallback_for_plain_lists():
    reduced = reduce_metrics(
        {
            "actor/pg_loss": [1.0, 2.0, 6.0],
            "actor/perf/max_memory_allocated_gb": [3.0, 9.0],
            "critic/score/min_seen": [3.0, 9.0],
            # the quirk: "admin" contains "min", so a plain-list admin metric reduces by min
            "admin/requests": [5.0, 2.0, 8.0],
            # "max" is tested before "min"
            "minmax_diff": [1.0, 4.0],
        }
    )
    assert reduced == {
        "actor/pg_loss": 3.0,
        "actor/perf/max_memory_allocated_gb": 9.0,
        "critic/score/min_seen": 3.0,
        "admin/requests": 2.0,
        "minmax_diff": 4.0,
    }


def test_reduce_metrics_metric_wins_over_the_key_name():
    reduced = reduce_metrics(
        {"admin/requests": Metric("sum", [5.0, 2.0]), "max_x": Metric("mean", [1.0, 3.0])}
    )
    assert reduced == {"admin/requests": 7.0, "max_x": 2.0}


def test_reduce_metrics_leaves_its_input_alone_and_returns_floats():
    metrics = {"loss": [torch.tensor(1.0), np.float64(3.0)], "lr": 0.1}
    reduced = reduce_metrics(metrics)
    assert reduced == {"loss": 2.0, "lr": 0.1}
    assert all(type(value) is float for value in reduced.values())
    assert isinstance(metrics["loss"], list)


def test_reduce_metrics_empty_list_names_the_key():
    with pytest.raises(ValueError, match="'actor/kl_loss'"):
        reduce_metrics({"actor/kl_loss": []})
