"""Derived keys (flows/runs/derived_keys.py): left out of a stage's artifact when they rebuild exactly,
rebuilt on every load (cache hit, re-run), with lineage fingerprints that see the inputs they are
built from; the rollout's artifact stores the response side only."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import torch

from dataproto import DataProto
from dataproto.artifact import ArtifactError, load_artifact, read_manifest
from flows.runs.derived_keys import (
    derived_fingerprints,
    load_stage_artifact,
    rebuild_derived,
    stored_delta,
)
from flows.runs.store import RunStore
from flows.step_flow import run_step
from stages.rollout import ROLLOUT_STAGE
from stages.stage import DerivedKey, Stage, tensor


def joined(t):
    return torch.cat([t["x"], t["y"]], dim=1)


def join_stage(calls: Counter, break_join: bool = False) -> Stage:
    """y = x + 1 and xy = x ‖ y, xy derived (``break_join``: the stage returns another xy)."""

    def fn(batch: DataProto, ctx) -> DataProto:
        calls["join"] += 1
        y = batch.batch["x"] + 1
        xy = torch.cat([batch.batch["x"], y], dim=1)
        return DataProto.from_dict({"y": y, "xy": xy + 1 if break_join else xy})

    return Stage(
        "join",
        1,
        (tensor("x"),),
        (tensor("y"), tensor("xy")),
        fn,
        derived={"xy": DerivedKey((tensor("x"), tensor("y")), joined)},
    )


def step_batch(offset: float = 0.0) -> DataProto:
    x = torch.arange(8, dtype=torch.float32).reshape(4, 2) + offset
    return DataProto.from_dict({"x": x}, {"uid": np.array(list("aabb"), dtype=object)})


@pytest.mark.usefixtures("prefect_harness")
def test_a_derived_key_is_left_out_rebuilt_on_a_cache_hit_and_on_a_rerun(tmp_path, toy_ctx):
    calls: Counter = Counter()
    stage = join_stage(calls)
    store = RunStore(tmp_path / "run", cache_dir=tmp_path / "cache")
    first = run_step([stage], step_batch(), toy_ctx, store, 1)
    artifact = store.artifact_path(1, "join")
    assert list(load_artifact(artifact).batch.keys()) == ["y"]
    assert read_manifest(artifact)["extra"]["derived"] == ["xy"]
    again = run_step([stage], step_batch(), toy_ctx, store, 1)
    assert calls["join"] == 1 and again.records[0].status == "cached"
    assert torch.equal(again.batch.batch["xy"], first.batch.batch["xy"])
    assert list(again.batch.batch.keys()) == list(first.batch.batch.keys())
    script_view = load_stage_artifact(artifact, stages=[stage])  # one stage of a past step
    assert torch.equal(script_view.batch["xy"], first.batch.batch["xy"])
    with pytest.raises(ArtifactError, match="xy: not stored; rebuilt when the step is loaded"):
        load_stage_artifact(artifact, stages=[])  # the stage is unknown: says so
    branch = RunStore(tmp_path / "branch", cache_dir=tmp_path / "cache2")
    reused = run_step(
        [stage], step_batch(), toy_ctx, branch, 1,
        reuse={"join": first.records[0]}, reuse_origin="the parent",
    )  # fmt: skip
    assert calls["join"] == 1 and torch.equal(reused.batch.batch["xy"], first.batch.batch["xy"])


def test_a_key_that_does_not_rebuild_exactly_is_stored(tmp_path):
    stage = join_stage(Counter(), break_join=True)
    inputs = step_batch()
    delta = stage.fn(inputs, None)
    stored, derived = stored_delta(stage, inputs, delta)
    assert derived == [] and stored is delta
    good = join_stage(Counter())
    stored, derived = stored_delta(good, inputs, good.fn(inputs, None))
    assert derived == ["xy"] and list(stored.batch.keys()) == ["y"]
    rebuilt = rebuild_derived(good, inputs, stored, derived)
    assert list(rebuilt.batch.keys()) == ["y", "xy"]
    assert torch.equal(rebuilt.batch["xy"], good.fn(inputs, None).batch["xy"])
    with pytest.raises(ValueError, match=r"derived keys \['z'\] that stage 'join' does not derive"):
        rebuild_derived(good, inputs, stored, ["z"])


def test_a_derived_fingerprint_sees_the_inputs_it_is_built_from():
    stage = join_stage(Counter())
    artifact = "a" * 64
    one = derived_fingerprints(stage, ["xy"], artifact, {tensor("x"): "1" * 64})
    other = derived_fingerprints(stage, ["xy"], artifact, {tensor("x"): "2" * 64})
    assert one[tensor("xy")] != other[tensor("xy")]  # same artifact, other prompts
    assert one == derived_fingerprints(stage, ["xy"], artifact, {tensor("x"): "1" * 64})


def test_a_stage_cannot_derive_what_it_neither_reads_nor_stores():
    with pytest.raises(ValueError, match="derived key 'xy' must be a tensor it produces"):
        Stage(
            "bad", 1, (tensor("x"),), (tensor("xy"),), lambda b, c: b,
            derived={"xy": DerivedKey((tensor("w"),), joined)},
        )  # fmt: skip


def test_the_rollout_artifact_stores_the_response_side_only(tmp_path):
    generator = torch.Generator().manual_seed(0)
    prompt_mask = torch.tensor([[0, 1, 1], [1, 1, 1]])
    prompt_ids = torch.randint(3, 50, (2, 3), generator=generator) * prompt_mask
    prompt_pos = (prompt_mask.cumsum(-1) - 1).clamp(min=0)
    responses = torch.tensor([[5, 6, 0, 0], [7, 8, 9, 2]])
    response_mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1]])
    inputs = DataProto.from_dict(
        {
            "prompt_input_ids": prompt_ids,
            "prompt_attention_mask": prompt_mask,
            "prompt_position_ids": prompt_pos,
        }
    )
    offsets = torch.arange(1, 5)
    delta = DataProto.from_dict(
        {  # what the HF and vLLM rollouts return
            "prompts": prompt_ids,
            "responses": responses,
            "response_mask": response_mask,
            "input_ids": torch.cat([prompt_ids, responses], 1),
            "attention_mask": torch.cat([prompt_mask, response_mask], 1),
            "position_ids": torch.cat([prompt_pos, prompt_pos[:, -1:] + offsets], 1),
            "rollout_log_probs": -torch.rand(2, 4, generator=generator) * response_mask,
        }
    )
    stored, derived = stored_delta(ROLLOUT_STAGE, inputs, delta)
    assert derived == ["attention_mask", "input_ids", "position_ids", "prompts"]
    assert sorted(stored.batch.keys()) == ["response_mask", "responses", "rollout_log_probs"]
    rebuilt = rebuild_derived(ROLLOUT_STAGE, inputs, stored, derived)
    assert list(rebuilt.batch.keys()) == list(delta.batch.keys())  # the stage's order
    for key, value in delta.batch.items():
        assert rebuilt.batch[key].dtype == value.dtype and torch.equal(rebuilt.batch[key], value)
