"""Dispatch to data-parallel ranks and the local worker group (no Ray, no model).

Padding duplicates rows cycling from row 0 and flags exactly those rows ``is_pad``; collecting
cuts them and the flag column off again, so split → identity → collect is the identity. Metrics
from ranks (a Metric or a list of Metrics per rank) combine with Metric.aggregate_dp (SUM/MEAN:
mean over ranks first); scalars by their mean, plain lists concatenated by verl's key rule, empty
lists as NaN; ranks that disagree in kind raise.
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dataproto import DataProto, dataproto_equal
from stages.engines.dispatch import (
    collect_from_ranks,
    combine_rank_metrics,
    real_rows_mask,
    split_for_ranks,
)
from stages.engines.worker_group import LocalWorkerGroup, make_worker_group
from stages.metrics.metric import Metric


def make_batch(rows: int) -> DataProto:
    return DataProto.from_dict(
        {"x": torch.arange(rows) * 10, "m": torch.ones(rows, 3)},
        {"uid": np.array([f"u{i}" for i in range(rows)], dtype=object)},
        meta_info={"temperature": 0.7},
    )


def test_three_rows_on_two_ranks_flag_exactly_the_duplicated_row():
    batch = make_batch(3)
    chunks, pad_size = split_for_ranks(batch, 2, allow_padding=True)
    assert pad_size == 1
    assert [c.batch["x"].tolist() for c in chunks] == [[0, 10], [20, 0]]  # row 0 duplicated
    assert [c.non_tensor_batch["is_pad"].tolist() for c in chunks] == [
        [False, False],
        [False, True],
    ]
    assert [c.non_tensor_batch["uid"].tolist() for c in chunks] == [["u0", "u1"], ["u2", "u0"]]
    assert "is_pad" not in batch.non_tensor_batch  # the caller's batch is untouched
    collected = collect_from_ranks(chunks, pad_size)
    assert dataproto_equal(collected, batch)
    assert "is_pad" not in collected.non_tensor_batch


@settings(max_examples=40, deadline=None)
@given(rows=st.integers(1, 11), world_size=st.integers(1, 4))
def test_split_then_collect_is_the_identity(rows, world_size):
    batch = make_batch(rows)
    chunks, pad_size = split_for_ranks(batch, world_size, allow_padding=True)
    assert len(chunks) == world_size
    assert len({len(c) for c in chunks}) == 1
    assert pad_size == (-rows) % world_size
    flags = np.concatenate([c.non_tensor_batch["is_pad"] for c in chunks])
    assert flags.tolist() == [False] * rows + [True] * pad_size
    assert dataproto_equal(collect_from_ranks(chunks, pad_size), batch)


@settings(max_examples=40, deadline=None)
@given(rows=st.integers(1, 11), engines=st.integers(1, 3), ranks_per_chunk=st.integers(1, 3))
def test_ranks_sharing_a_chunk_get_it_together_and_collect_once(rows, engines, ranks_per_chunk):
    """Ranks k·j … k·j + k − 1 get chunk j; collecting their (equal) outputs gives the batch."""
    batch = make_batch(rows)
    world_size = engines * ranks_per_chunk
    chunks, pad_size = split_for_ranks(
        batch, world_size, allow_padding=True, ranks_per_chunk=ranks_per_chunk
    )
    assert len(chunks) == world_size and pad_size == (-rows) % engines
    for rank, chunk in enumerate(chunks):
        assert chunk is chunks[rank - rank % ranks_per_chunk]
    distinct = chunks[::ranks_per_chunk]
    assert dataproto_equal(collect_from_ranks(distinct, pad_size), batch)
    collected = collect_from_ranks(chunks, pad_size, ranks_per_chunk=ranks_per_chunk)
    assert dataproto_equal(collected, batch)


def test_an_engine_whose_ranks_disagree_is_refused_and_its_peers_metrics_do_not_count():
    batch = make_batch(4)
    chunks, pad_size = split_for_ranks(batch, 4, allow_padding=True, ranks_per_chunk=2)

    def output(rank: int, skew: int = 0) -> DataProto:
        return DataProto.from_dict(
            {"x": chunks[rank].batch["x"] + skew},
            meta_info={"metrics": {"rank": float(rank)}},  # a rank's own number: not compared
        )

    collected = collect_from_ranks([output(r) for r in range(4)], pad_size, ranks_per_chunk=2)
    assert collected.batch["x"].tolist() == [0, 10, 20, 30]
    assert collected.meta_info["metrics"] == {"rank": 1.0}  # ranks 0 and 2 only: (0 + 2) / 2
    with pytest.raises(
        RuntimeError, match=r"^ranks 2 and 3 share one engine \(ranks_per_chunk=2\)"
    ):
        collect_from_ranks(
            [output(0), output(1), output(2), output(3, skew=1)], pad_size, ranks_per_chunk=2
        )
    with pytest.raises(
        ValueError, match="ranks_per_chunk must be an int ≥ 1 dividing the 4 ranks, got 3"
    ):
        split_for_ranks(batch, 4, allow_padding=True, ranks_per_chunk=3)
    with (
        LocalWorkerGroup(lambda: None) as group,
        pytest.raises(ValueError, match="dividing the 1 ranks, got 2"),
    ):
        group.call("anything", batch, ranks_per_chunk=2)


def test_real_rows_mask_leaves_padding_out_of_a_per_sample_mean():
    batch = DataProto.from_dict({"v": torch.tensor([1.0, 2.0, 6.0])})
    chunks, _ = split_for_ranks(batch, 2, allow_padding=True)  # rank 1: rows 2 and a copy of 0
    means = [
        float((c.batch["v"] * real_rows_mask(c)).sum() / real_rows_mask(c).sum()) for c in chunks
    ]
    assert means == [1.5, 6.0]  # the copy of row 0 (v=1) does not pull rank 1's mean down
    assert real_rows_mask(batch).tolist() == [True] * 3  # no dispatch: every row is real
    bad = DataProto.from_dict({"v": torch.zeros(2)}, {"is_pad": np.array([0, 1])})
    with pytest.raises(ValueError, match=r"'is_pad' must be a \(2,\) bool array, got dtype int64"):
        real_rows_mask(bad)


def test_updates_refuse_a_batch_that_needs_padding():
    with pytest.raises(ValueError, match="padding") as info:
        split_for_ranks(make_batch(5), 2, allow_padding=False)
    message = str(info.value)
    assert "5 rows" in message and "2 data-parallel ranks" in message
    assert "trainer.n_gpus_per_node" in message  # the config fix
    chunks, pad_size = split_for_ranks(make_batch(4), 2, allow_padding=False)
    assert pad_size == 0 and [c.non_tensor_batch["is_pad"].any() for c in chunks] == [False] * 2


def test_a_dispatched_chunk_cannot_be_dispatched_again():
    chunks, _ = split_for_ranks(make_batch(2), 1, allow_padding=True)
    with pytest.raises(ValueError, match="already has a 'is_pad' column"):
        split_for_ranks(chunks[0], 2, allow_padding=True)


def test_bad_world_size_is_named():
    with pytest.raises(ValueError, match="world_size must be an int ≥ 1, got 0"):
        split_for_ranks(make_batch(2), 0, allow_padding=True)


def test_metrics_combine_by_their_aggregation():
    per_rank = [
        {
            "loss": Metric("sum", [1.0, 2.0]),
            "clipfrac": Metric("mean", [0.1, 0.3]),
            "max_len": Metric("max", [4, 9]),
            "lr": 0.1,
            "count": torch.tensor(3),
        },
        {
            "loss": Metric("sum", [3.0, 4.0]),
            "clipfrac": Metric("mean", [0.3, 0.5]),
            "max_len": Metric("max", [5, 2]),
            "lr": 0.3,
            "count": np.int64(5),
        },
    ]
    combined = combine_rank_metrics(per_rank)
    assert combined["loss"] == pytest.approx(2.0 + 3.0)  # mean over ranks [2, 3], then sum
    assert combined["clipfrac"] == pytest.approx(0.3)  # mean over ranks [0.2, 0.4], then mean
    assert combined["max_len"] == 9.0
    assert combined["lr"] == pytest.approx(0.2)
    assert combined["count"] == 4.0


def test_metrics_must_agree_across_ranks():
    with pytest.raises(ValueError, match=r"'lr' is missing on rank\(s\) \[1\]"):
        combine_rank_metrics([{"lr": 0.1}, {}])
    with pytest.raises(TypeError, match=r"'loss' has different kinds.*\['metric', 'scalar'\]"):
        combine_rank_metrics([{"loss": Metric("sum", [1.0])}, {"loss": 1.0}])


def test_rank_lists_of_sum_metrics_give_the_global_token_mean():
    # 2 ranks × 2 micro-batches of 2 tokens: token-loss sums [1, 3] and [2, 6], 8 tokens in all,
    # global token-mean 12 / 8 = 1.5. Each partial is sum × dp / global tokens = sum / 4, so the
    # gradient all-reduce (a mean over ranks) sees the global mean.
    per_rank = [
        {"actor/pg_loss": [Metric("sum", 1 / 4), Metric("sum", 3 / 4)]},
        {"actor/pg_loss": [Metric("sum", 2 / 4), Metric("sum", 6 / 4)]},
    ]
    # mean over ranks [0.375, 1.125], then sum
    assert combine_rank_metrics(per_rank) == {"actor/pg_loss": pytest.approx(1.5)}


def test_rank_lists_of_max_and_min_metrics_reduce_over_all_values():
    per_rank = [
        {"max_len": [Metric("max", 4), Metric("max", 9)], "min_len": [Metric("min", [4, 3])]},
        {"max_len": [Metric("max", 5), Metric("max", 2)], "min_len": [Metric("min", [1, 8])]},
    ]
    assert combine_rank_metrics(per_rank) == {"max_len": 9.0, "min_len": 1.0}


def test_a_list_of_metrics_and_a_bare_metric_combine_alike():
    bare = combine_rank_metrics([{"x": Metric("mean", [1.0, 3.0])}, {"x": Metric("mean", [5, 7])}])
    listed = combine_rank_metrics(
        [{"x": [Metric("mean", 1.0), 3.0]}, {"x": Metric("mean", [5, 7])}]
    )
    assert bare == listed == {"x": pytest.approx(4.0)}


def test_empty_lists_on_every_rank_give_nan():
    combined = combine_rank_metrics([{"actor/kl_loss": []}, {"actor/kl_loss": ()}])
    assert list(combined) == ["actor/kl_loss"] and np.isnan(combined["actor/kl_loss"])


def test_plain_lists_concatenate_over_ranks_then_follow_the_key_rule():
    combined = combine_rank_metrics(
        [
            {"response_length/max": [4, 9], "entropy": [1.0, 2.0]},
            {"response_length/max": [12], "entropy": []},
            {"response_length/max": [], "entropy": [6.0]},
        ]
    )
    # entropy: mean of the concatenation [1, 2, 6], not the mean of the rank means
    assert combined == {"response_length/max": 12.0, "entropy": pytest.approx(3.0)}


@pytest.mark.parametrize(
    ("first", "second", "kinds"),
    [
        ([Metric("sum", 1.0)], [1.0], "['metric', 'list']"),
        (Metric("sum", [1.0]), [], "['metric', 'empty']"),
        (2.0, [1.0, 3.0], "['scalar', 'list']"),
        ([], 2.0, "['empty', 'scalar']"),
    ],
)
def test_ranks_that_disagree_in_kind_name_the_key_and_kinds(first, second, kinds):
    with pytest.raises(TypeError) as raised:
        combine_rank_metrics([{"actor/pg_loss": first}, {"actor/pg_loss": second}])
    assert "'actor/pg_loss' has different kinds" in str(raised.value)
    assert kinds in str(raised.value)


def test_metric_aggregations_and_counts_must_agree_naming_the_key():
    with pytest.raises(ValueError, match=r"'loss' holds Metric objects with .*\['max', 'sum'\]"):
        combine_rank_metrics(
            [{"loss": [Metric("sum", 1.0), Metric("max", 2.0)]}, {"loss": [Metric("sum", 1.0)]}]
        )
    with pytest.raises(ValueError, match=r"metric 'loss': aggregate_dp needs one aggregation"):
        combine_rank_metrics([{"loss": [Metric("sum", 1.0)]}, {"loss": [Metric("mean", 1.0)]}])
    with pytest.raises(ValueError, match=r"metric 'loss': .*same non-zero number.*\[2, 1\]"):
        combine_rank_metrics([{"loss": Metric("sum", [1, 2])}, {"loss": [Metric("sum", 3)]}])


def test_collect_combines_metrics_and_keeps_other_meta_info():
    outputs = [
        DataProto.from_dict(
            {"y": torch.tensor([r, r])},
            meta_info={"metrics": {"loss": Metric("sum", [float(r)])}, "temperature": 0.7},
        )
        for r in range(2)
    ]
    collected = collect_from_ranks(outputs, pad_size=1)
    assert collected.batch["y"].tolist() == [0, 0, 1]
    assert collected.meta_info == {"temperature": 0.7, "metrics": {"loss": 0.5}}
    assert outputs[0].meta_info["metrics"]["loss"].values == [0.0]  # inputs untouched


def test_collect_combines_per_micro_batch_metric_lists():
    outputs = [
        DataProto(
            batch=None,
            non_tensor_batch={},
            meta_info={"metrics": {"loss": [Metric("sum", r), Metric("sum", r + 1.0)], "kl": []}},
        )
        for r in (0.0, 2.0)
    ]
    metrics = collect_from_ranks(outputs, pad_size=0).meta_info["metrics"]
    assert metrics["loss"] == pytest.approx(1.0 + 2.0) and np.isnan(metrics["kl"])


def test_collect_rowless_outputs_gives_only_metrics():
    outputs = [
        DataProto(batch=None, non_tensor_batch={}, meta_info={"metrics": {"lr": v}})
        for v in (1.0, 3.0)
    ]
    collected = collect_from_ranks(outputs, pad_size=0)
    assert len(collected) == 0 and collected.meta_info["metrics"] == {"lr": 2.0}


def test_collect_names_a_rank_that_returned_no_dataproto():
    with pytest.raises(TypeError, match="rank 1 returned a dict"):
        collect_from_ranks([make_batch(1), {"x": 1}], 0)


class Scaler:
    """A toy role worker: scales ``x``, records what it was given."""

    def __init__(self, factor: int) -> None:
        self.factor = factor
        self.seen: list[DataProto] = []

    def scale(self, batch: DataProto, offset: int = 0) -> DataProto:
        self.seen.append(batch)
        return DataProto.from_dict(
            {"y": batch.batch["x"] * self.factor + offset},
            meta_info={"metrics": {"rows": Metric("sum", [len(batch)]), "factor": self.factor}},
        )

    def describe(self, prefix: str) -> str:
        return f"{prefix}{self.factor}"


def test_local_group_runs_the_worker_in_this_process():
    with LocalWorkerGroup(Scaler, factor=3) as group:
        batch = make_batch(3)
        out = group.call("scale", batch, offset=1)
        assert out.batch["y"].tolist() == [1, 31, 61]
        assert out.meta_info["metrics"] == {"rows": 3.0, "factor": 3.0}
        seen = group.worker.seen[0]
        assert seen.non_tensor_batch["is_pad"].tolist() == [False] * 3
        assert group.call_all("describe", prefix="x") == ["x3"]
        with pytest.raises(AttributeError, match=r"has no method 'missing'.*'scale'"):
            group.call("missing", batch)
    with pytest.raises(RuntimeError, match="closed"):
        group.call("scale", batch)


def test_make_worker_group_checks_backend_and_size():
    group = make_worker_group("local", Scaler, 1, factor=2)
    assert group.world_size == 1 and group.worker.factor == 2
    with pytest.raises(ValueError, match=r"world_size=2.*ppoflow\.workers\.backend=ray"):
        make_worker_group("local", Scaler, 2, factor=2)
    with pytest.raises(KeyError, match=r"unknown worker backend 'mpi'; known: \['local', 'ray'\]"):
        make_worker_group("mpi", Scaler, 1, factor=2)


def test_importing_the_ray_group_does_not_import_ray():
    code = (
        "import sys, stages.engines.worker_group_ray, stages.engines.worker_group; "
        "sys.exit(int('ray' in sys.modules))"
    )
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


def test_missing_ray_says_how_to_install_it(monkeypatch):
    from stages.engines.worker_group_ray import RayWorkerGroup

    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` now raises ImportError
    with pytest.raises(ImportError, match=r"pip install 'ppoflow\[ray\]'"):
        RayWorkerGroup(Scaler, 2, factor=1)
