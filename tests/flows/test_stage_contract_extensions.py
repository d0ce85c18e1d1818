"""The stage-contract extensions the PPO step needs: a reordering stage, optional inputs,
run-time-named outputs and step-dependent conditions."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import torch

from dataproto import DataProto
from flows.cache.keys import reordered_fingerprints, stage_cache_key
from flows.dag import plan_step
from flows.runs.store import RunStore
from flows.stage_task import check_delta, select_inputs
from flows.step_flow import run_step
from stages.stage import Stage, StageContext, meta, non_tensor, tensor

WEIGHTS = {"score": "weights-v0"}


def reverse_stage(calls: Counter) -> Stage:
    def reverse(batch: DataProto, ctx: StageContext) -> DataProto:
        calls["reverse"] += 1
        return DataProto.from_dict({"order": torch.arange(len(batch) - 1, -1, -1)})

    return Stage("reverse", 1, (tensor("y"),), (tensor("order"),), reverse, reorders="order")


def test_reordering_stage_reorders_the_step_batch_and_is_cached(
    prefect_harness, tmp_path, toy_stages, toy_batch, toy_ctx, calls
):
    stages = [toy_stages[0], reverse_stage(calls), *toy_stages[1:]]
    store = RunStore(tmp_path / "run")
    first = run_step(stages, toy_batch, toy_ctx, store, 1, weights_fingerprints=WEIGHTS)
    x = toy_batch.batch["x"]
    assert torch.equal(first.batch.batch["x"], x.flip(0))  # every key moved
    assert torch.equal(first.batch.batch["y"], x.flip(0) + 1.0)
    assert list(first.batch.non_tensor_batch["uid"]) == ["b", "b", "a", "a"]
    assert "order" not in first.batch.batch
    assert torch.equal(first.batch.batch["s"], (x.flip(0) + 1.0) * 2.0 * 0.5)
    again = run_step(stages, toy_batch, toy_ctx, store, 1, weights_fingerprints=WEIGHTS)
    assert {r.stage: r.status for r in again.records}["total"] == "cached"
    assert calls["reverse"] == 1 and calls["total"] == 1  # the reordered keys hash the same


def test_a_non_permutation_is_rejected(prefect_harness, tmp_path, toy_stages, toy_batch, toy_ctx):
    def bad(batch, ctx):
        return DataProto.from_dict({"order": torch.zeros(len(batch), dtype=torch.long)})

    stage = Stage("bad", 1, (tensor("y"),), (tensor("order"),), bad, reorders="order")
    with pytest.raises(ValueError, match="permutation"):
        run_step([toy_stages[0], stage], toy_batch, toy_ctx, RunStore(tmp_path / "run"), 1)


def test_reorders_must_name_a_produced_tensor():
    with pytest.raises(ValueError, match="reorders"):
        Stage("x", 1, (), (tensor("a"),), lambda b, c: b, reorders="b")


def test_reordered_fingerprints_depend_on_the_permutation():
    base = {tensor("x"): "a" * 64, non_tensor("uid"): "b" * 64, meta("t"): "c" * 64}
    one, two = reordered_fingerprints(base, "1" * 64), reordered_fingerprints(base, "2" * 64)
    assert (
        one[tensor("x")] != two[tensor("x")] and one[non_tensor("uid")] != base[non_tensor("uid")]
    )
    assert one[meta("t")] == base[meta("t")]


def optional_stage() -> Stage:
    return Stage(
        "opt", 1, (tensor("x"),), (tensor("y"),), lambda b, c: b,
        optional=(non_tensor("extra"),), extra_outputs=("non_tensor_batch",),
    )  # fmt: skip


def test_optional_keys_are_selected_when_present_and_enter_the_cache_key():
    stage = optional_stage()
    plain = DataProto.from_dict({"x": torch.zeros(2), "z": torch.ones(2)})
    assert sorted(select_inputs(stage, plain).batch.keys()) == ["x"]
    extra = plain | DataProto.from_dict(non_tensors={"extra": np.array([1, 2], dtype=object)})
    assert list(select_inputs(stage, extra).non_tensor_batch) == ["extra"]
    without = stage_cache_key(stage, {}, {tensor("x"): "a" * 64})
    with_extra = stage_cache_key(stage, {}, {tensor("x"): "a" * 64, non_tensor("extra"): "e" * 64})
    assert without != with_extra
    assert plan_step([stage], {}, [tensor("x")]).names == ["opt"]  # absent optional: fine


def test_extra_outputs_allow_run_time_named_keys_of_that_layer_only():
    stage = optional_stage()
    delta = DataProto.from_dict({"y": torch.zeros(2)}, {"acc": np.array([1.0, 0.0], dtype=object)})
    check_delta(stage, delta, 2)
    with pytest.raises(ValueError, match="undeclared"):
        check_delta(stage, DataProto.from_dict({"y": torch.zeros(2), "w": torch.zeros(2)}), 2)


def test_step_dependent_condition():
    stage = Stage("late", 1, (), (), lambda b, c: b, when=lambda config, step: step > 2)
    assert stage.needs_step
    assert plan_step([stage], {}, [], step=3).names == ["late"]
    assert plan_step([stage], {}, [], step=2).skipped == {
        "late": "disabled: when(config, step) is False"
    }
    with pytest.raises(ValueError, match="global step"):
        plan_step([stage], {}, [])
