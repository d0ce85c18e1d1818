"""The stage task body and its checks, called as plain functions (no Prefect server)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dataproto import DataProto
from dataproto.artifact import ArtifactError, read_manifest
from flows.cache.keys import stage_cache_key
from flows.stage_task import (
    check_delta,
    compute_stage,
    load_delta,
    select_inputs,
    stage_task,
    timer_name,
)
from flows.step_flow import run_step
from stages.stage import Stage, StageContext, meta, tensor


def by_name(stages, name):
    return next(stage for stage in stages if stage.name == name)


def test_select_inputs_keeps_only_required_keys(toy_stages, toy_batch):
    batch = toy_batch | DataProto.from_dict(meta_info={"step": 3, "other": 1})
    total = by_name(toy_stages, "total")
    chosen = select_inputs(total, batch | DataProto.from_dict({"s": torch.ones(4, 3)}))
    assert list(chosen.batch.keys()) == ["s"] and list(chosen.non_tensor_batch) == ["uid"]
    assert chosen.meta_info == {}
    needs_meta = Stage("m", 1, (meta("step"),), (), total.fn)
    chosen = select_inputs(needs_meta, batch)
    assert chosen.meta_info == {"step": 3} and list(chosen.batch.keys()) == []
    assert len(chosen) == 4


def test_delta_must_hold_exactly_the_declared_keys(toy_stages):
    double = by_name(toy_stages, "double")
    z, extra = torch.zeros(4, 3), torch.ones(4, 3)
    check_delta(double, DataProto.from_dict({"z": z}), rows=4)
    with pytest.raises(ValueError) as err:
        check_delta(double, DataProto.from_dict({"z": z, "leak": extra}), rows=4)
    assert "stage 'double'" in str(err.value) and "undeclared keys ['batch.leak']" in str(err.value)
    with pytest.raises(ValueError, match=r"missing declared keys \['batch.z'\]"):
        check_delta(double, DataProto.from_dict({"q": z}), rows=4)
    with pytest.raises(ValueError, match=r"'double' returned 2 rows for an input of 4 rows"):
        check_delta(double, DataProto.from_dict({"z": z[:2]}), rows=4)
    with pytest.raises(TypeError, match=r"stage 'double' returned dict"):
        check_delta(double, {"z": z}, rows=4)


def test_compute_stage_with_an_undeclared_key_writes_nothing(tmp_path, toy_stages, toy_ctx):
    leaky = Stage(
        "leaky",
        1,
        (),
        (tensor("z"),),
        lambda b, c: DataProto.from_dict({"z": torch.zeros(2), "w": torch.zeros(2)}),
    )
    inputs = DataProto.from_dict({"x": torch.zeros(2)}).select([])
    with pytest.raises(ValueError, match=r"stage 'leaky'.*undeclared keys \['batch.w'\]"):
        compute_stage(leaky, inputs, toy_ctx, str(tmp_path / "leaky"), "k" * 64)
    assert not (tmp_path / "leaky").exists()


def test_compute_stage_stores_metrics_key_and_config(tmp_path, toy_stages, toy_ctx):
    total = by_name(toy_stages, "total")
    inputs = DataProto.from_dict(
        {"s": torch.ones(2, 3)}, {"uid": np.array(["a", "b"], dtype=object)}
    )
    ctx = StageContext(toy_ctx.config, toy_ctx.engines, step=1, metrics={"timing_s/gen": 1.0})
    sink: dict = {}
    ref = compute_stage(total, inputs, ctx, str(tmp_path / "total"), "k" * 64, sink)
    manifest = read_manifest(ref.path)
    assert manifest["stage"] == "total" and manifest["stage_version"] == "1"
    assert manifest["extra"] == {"cache_key": "k" * 64, "metrics": {"toy/total_mean": 3.0}}
    assert ctx.metrics == {"timing_s/gen": 1.0}  # the caller's context is not touched
    assert sink["metrics"] == {"toy/total_mean": 3.0}
    delta, metrics, derived = load_delta(ref, "k" * 64, "full", total, inputs)
    assert delta.non_tensor_batch["total"].tolist() == [3.0, 3.0] and metrics == sink["metrics"]
    assert derived == [] and sink["derived"] == []  # the stage derives no key
    with pytest.raises(ArtifactError, match="the artifact was overwritten"):
        load_delta(ref, "j" * 64, "full", total, inputs)  # a record for another key never matches


def test_config_slice_is_recorded(tmp_path, toy_stages, toy_ctx):
    double = by_name(toy_stages, "double")
    ref = compute_stage(
        double,
        DataProto.from_dict({"y": torch.ones(2)}),
        toy_ctx,
        str(tmp_path / "double"),
        "k" * 64,
    )
    assert read_manifest(ref.path)["config"] == {"toy.factor": 2.0}
    key = stage_cache_key(double, toy_ctx.config, {tensor("y"): "f" * 64})
    assert len(key) == 64


def test_weight_writing_stages_are_never_retried(tmp_path, toy_stages):
    update = Stage("update_actor", 1, (), (), toy_stages[0].fn, writes_weights=True)
    with pytest.raises(ValueError, match=r"'update_actor' writes weights.*got 2"):
        stage_task(update, tmp_path, retries=2)
    assert stage_task(update, tmp_path).retries == 0
    assert stage_task(by_name(toy_stages, "produce"), tmp_path, retries=2).retries == 2
    assert stage_task(update, tmp_path).name == "update_actor"


def test_timer_names_follow_verl():
    assert [timer_name(n) for n in ("rollout", "reward", "ref_log_prob", "advantage")] == [
        "gen",
        "reward",
        "ref",
        "adv",
    ]


def test_flow_records_parameter_summaries_not_tensors(tmp_path, toy_stages, toy_batch, toy_ctx):
    from flows.runs.store import RunStore

    summary = run_step.serialize_parameters(
        {
            "stages": toy_stages,
            "batch": toy_batch,
            "ctx": toy_ctx,
            "step": 2,
            "store": RunStore(tmp_path),
            "weights_fingerprints": {"score": "w"},
            "other": object(),
        }
    )
    assert summary["batch"] == "DataProto(rows=4, keys=['batch.x', 'non_tensor_batch.uid'])"
    assert summary["stages"] == ["produce", "double", "score", "critic", "total"]
    assert summary["ctx"] == "StageContext(step=0, engines=['model'])" and summary["step"] == 2
    assert summary["other"] == "<object>" and summary["weights_fingerprints"] == {"score": "w"}
    assert (
        type(run_step.with_options(name="x")).serialize_parameters
        is type(run_step).serialize_parameters
    )


def test_weights_for_accepts_a_mapping_or_a_callable(toy_stages):
    from flows.step_flow import weights_for

    score, double = by_name(toy_stages, "score"), by_name(toy_stages, "double")
    assert weights_for(score, {"score": "w1"}) == "w1"
    assert weights_for(score, lambda stage: f"fp-of-{stage.name}") == "fp-of-score"
    assert weights_for(double, None) is None  # reads no weights
