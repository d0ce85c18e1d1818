"""The step plan: enabled stages in order, skipped ones with a reason, inputs checked up front."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from dataproto import DataProto
from flows.dag import batch_keys, plan_step, stages_between
from flows.runs.store import RunStore
from flows.step_flow import run_step
from stages.stage import KeyRef, Stage, meta, non_tensor, tensor


def test_plan_keeps_enabled_stages_in_order_and_says_why_others_skip(
    toy_stages, toy_batch, make_config
):
    plan = plan_step(toy_stages, make_config(), batch_keys(toy_batch))
    assert plan.names == ["produce", "double", "score", "total"]
    assert plan.skipped == {"critic": "disabled: uses_critic(config) is False"}
    plan_on = plan_step(toy_stages, make_config(use_critic=True), batch_keys(toy_batch))
    assert (
        plan_on.names == ["produce", "double", "score", "critic", "total"] and not plan_on.skipped
    )


def test_lambda_condition_is_reported_generically(toy_stages, toy_batch):
    off = Stage("off", 1, (), (tensor("q"),), toy_stages[0].fn, when=lambda config: False)
    assert plan_step([off], None, set()).skipped == {"off": "disabled: when(config) is False"}


def test_missing_input_of_a_disabled_producer_is_named(toy_stages, toy_batch, make_config):
    reads_v = Stage("uses_v", 1, (tensor("v"), meta("step")), (tensor("w"),), toy_stages[0].fn)
    with pytest.raises(KeyError) as err:
        plan_step([*toy_stages, reads_v], make_config(), batch_keys(toy_batch))
    message = str(err.value)
    assert (
        "'uses_v'" in message
        and "batch.v (produced by stage 'critic', which is disabled)" in message
    )
    assert "meta_info.step (no stage produces it and the input batch lacks it)" in message


def test_missing_input_fails_before_any_stage_runs(tmp_path, toy_stages, toy_batch, toy_ctx, calls):
    """run_step's body (no Prefect needed: it fails in the plan) runs no stage, writes nothing."""
    batch = toy_batch.select(batch_keys=["x"], non_tensor_batch_keys=[])  # uid missing
    store = RunStore(tmp_path / "run")
    with pytest.raises(KeyError, match=r"stage 'total' requires non_tensor_batch.uid"):
        run_step.fn(toy_stages, batch, toy_ctx, store, 1, weights_fingerprints={"score": "w"})
    assert not calls and not Path(store.root).exists()


def test_missing_weights_fingerprint_fails_before_any_work(
    tmp_path, toy_stages, toy_batch, toy_ctx, calls
):
    store = RunStore(tmp_path / "run")
    with pytest.raises(KeyError, match=r"no entry for weight-reading stage 'score'"):
        run_step.fn(toy_stages, toy_batch, toy_ctx, store, 1, weights_fingerprints={"other": "w"})
    with pytest.raises(ValueError, match=r"stage 'score' reads weights"):
        run_step.fn(toy_stages, toy_batch, toy_ctx, store, 1)
    assert not calls and not Path(store.root).exists()


def test_a_key_has_one_producer(toy_stages, toy_batch, make_config):
    again = Stage("again", 1, (tensor("x"),), (tensor("y"),), toy_stages[0].fn)
    with pytest.raises(ValueError, match=r"'again' produces batch.y, which stage 'produce'"):
        plan_step([toy_stages[0], again], make_config(), batch_keys(toy_batch))
    shadow = Stage("shadow", 1, (), (non_tensor("uid"),), toy_stages[0].fn)
    with pytest.raises(ValueError, match=r"non_tensor_batch.uid, which the input batch"):
        plan_step([shadow], make_config(), batch_keys(toy_batch))


def test_duplicate_names_and_non_bool_conditions_are_refused(toy_stages, toy_batch, make_config):
    with pytest.raises(ValueError, match=r"'produce' appears twice"):
        plan_step([toy_stages[0], toy_stages[0]], make_config(), batch_keys(toy_batch))
    vague = Stage("vague", 1, (), (), toy_stages[0].fn, when=lambda config: "yes")
    with pytest.raises(TypeError, match=r"'vague': when\(config\) returned str"):
        plan_step([vague], make_config(), set())


def test_batch_keys_covers_three_layers():
    data = DataProto.from_dict({"a": torch.zeros(2)}, {"u": [1, 2]}, {"m": 1})
    assert batch_keys(data) == {KeyRef("batch", "a"), non_tensor("u"), meta("m")}


def test_stages_between(toy_stages):
    assert stages_between(toy_stages, "double") == ["double", "score", "critic", "total"]
    assert stages_between(toy_stages, "double", "score") == ["double", "score"]
    with pytest.raises(KeyError, match="no stage named 'nope'"):
        stages_between(toy_stages, "nope")
    with pytest.raises(ValueError, match="must not precede"):
        stages_between(toy_stages, "score", "produce")
