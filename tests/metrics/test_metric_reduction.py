"""Metric, AggregationType, aggregate_dp and reduce_metrics (Metrics, lists of Metrics, fallback)."""

from __future__ import annotations

import math

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


@pytest.mark.filterwarnings("error")  # no numpy "Mean of empty slice" RuntimeWarning
@pytest.mark.parametrize("empty", [[], ()])
def test_reduce_metrics_empty_list_is_nan_as_in_verl(empty):
    reduced = reduce_metrics({"actor/kl_loss": empty, "critic/max_x": empty})
    assert math.isnan(reduced["actor/kl_loss"]) and math.isnan(reduced["critic/max_x"])
    assert type(reduced["actor/kl_loss"]) is float


def test_reduce_metrics_sum_partials_per_micro_batch_add_up_to_the_global_mean():
    # 8 global tokens, split 3 + 5 over two micro-batches; each token's loss is 1.0, so each
    # micro-batch reports (its token sum) / 8 and the partials add up to the global mean 1.0
    partials = [Metric("sum", 3.0 / 8), Metric("sum", 5.0 / 8)]
    assert [metric.aggregate() for metric in partials] == [0.375, 0.625]
    reduced = reduce_metrics({"actor/pg_loss": partials, "mean_like_name": tuple(partials)})
    assert reduced == {"actor/pg_loss": 1.0, "mean_like_name": 1.0}  # the key name is ignored


@pytest.mark.parametrize(
    ("aggregation", "expected"),
    [
        ("mean", 3.0),  # mean of all values [1, 2, 6], not of the per-Metric means (3.75)
        ("sum", 9.0),
        ("min", 1.0),
        ("max", 6.0),
    ],
)
def test_reduce_metrics_list_of_metrics_pools_all_values(aggregation, expected):
    micro_batches = [Metric(aggregation, [1.0, 2.0]), Metric(aggregation, [6.0])]
    assert reduce_metrics({"admin/x": micro_batches}) == {"admin/x": expected}
    assert micro_batches[0].values == [1.0, 2.0]  # the input Metrics are left alone


def test_reduce_metrics_list_of_metrics_with_mixed_aggregations_names_key_and_aggregations():
    with pytest.raises(ValueError, match=r"'actor/pg_loss'.*\['max', 'sum'\]"):
        reduce_metrics({"actor/pg_loss": [Metric("sum", 1.0), Metric("max", 2.0), 3.0]})


def test_reduce_metrics_numbers_beside_metrics_are_values_of_their_aggregation():
    mixed = [Metric("sum", 0.375), 0.5, torch.tensor(0.125)]
    assert reduce_metrics({"max_named": mixed}) == {"max_named": 1.0}
    with pytest.raises(TypeError, match=r"'actor/pg_loss'.*str"):
        reduce_metrics({"actor/pg_loss": [Metric("sum", 1.0), "0.5"]})


def test_reduce_metrics_list_of_empty_metrics_raises_naming_the_key():
    with pytest.raises(ValueError, match=r"'actor/pg_loss' holds 2 Metric objects with no values"):
        reduce_metrics({"actor/pg_loss": [Metric("sum"), Metric("sum")]})


def test_dp_ranks_of_micro_batch_lists_go_through_aggregate_dp():
    # rank 0: token sums 3 and 5 over 8 tokens → [0.375, 0.625] (its mean 1.0)
    # rank 1: the same split with every token's loss 2.0 → [0.75, 1.25] (its mean 2.0)
    per_rank = [
        [Metric("sum", 0.375), Metric("sum", 0.625)],
        [Metric("sum", 0.75), Metric("sum", 1.25)],
    ]
    assert [reduce_metrics({"loss": rank})["loss"] for rank in per_rank] == [1.0, 2.0]
    combined = [Metric("sum", rank) for rank in per_rank]  # one Metric per rank: [dp=2, micro=2]
    # aggregate_dp unchanged: mean over ranks [0.5625, 0.9375], then sum over micro-batches
    assert Metric.aggregate_dp(combined) == 1.5
