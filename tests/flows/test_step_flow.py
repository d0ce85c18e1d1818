"""The step flow under a real (temporary) Prefect server: artifacts, journal, caching, re-runs."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from dataproto.artifact import load_artifact, read_manifest
from flows.runs.store import RunStore
from flows.step_flow import run_step

pytestmark = pytest.mark.usefixtures("prefect_harness")

WEIGHTS = {"score": "weights-v0"}
ENABLED = ["produce", "double", "score", "total"]


def statuses(result) -> dict[str, str]:
    return {record.stage: record.status for record in result.records}


def expected_total(x: torch.Tensor, offset: float, factor: float, weight: float) -> torch.Tensor:
    return ((x + offset) * factor * weight).sum(dim=-1)


@pytest.fixture
def first_run(tmp_path, toy_stages, toy_batch, toy_ctx, calls):
    """Step 1 of a fresh run in tmp_path/run (cache in tmp_path/cache)."""
    store = RunStore(tmp_path / "run", cache_dir=tmp_path / "cache")
    result = run_step(toy_stages, toy_batch, toy_ctx, store, 1, weights_fingerprints=WEIGHTS)
    assert dict(calls) == dict.fromkeys(ENABLED, 1)
    return store, result


def test_step_runs_writes_artifacts_and_identical_rerun_hits_cache(
    first_run, toy_stages, toy_batch, toy_ctx, calls
):
    store, result = first_run
    assert statuses(result) == {**dict.fromkeys(ENABLED, "ran"), "critic": "skipped"}
    critic = next(r for r in result.records if r.stage == "critic")
    assert critic.reason == "disabled: uses_critic(config) is False" and critic.artifact is None
    want = expected_total(toy_batch.batch["x"], offset=1.0, factor=2.0, weight=0.5)
    assert torch.allclose(torch.as_tensor(result.batch.non_tensor_batch["total"]), want.double())
    assert result.metrics["toy/total_mean"] == pytest.approx(float(want.mean()))
    for name in [*ENABLED, "step"]:
        assert result.metrics[f"timing_s/{name}"] >= 0
    for name in ENABLED:  # one artifact per enabled stage, holding exactly its delta
        path = Path(store.artifact_path(1, name))
        assert path == Path(store.root) / "step_1" / name and (path / "manifest.json").is_file()
        assert read_manifest(path)["stage"] == name
    assert list(load_artifact(store.artifact_path(1, "double")).batch.keys()) == ["z"]
    assert not (Path(store.root) / "step_1" / "critic").exists()
    journal = store.read_journal(1)
    assert journal.status == "done" and [r.stage for r in journal.stages] == [
        "produce",
        "double",
        "score",
        "critic",
        "total",
    ]
    assert journal.metrics["toy/total_mean"] == result.metrics["toy/total_mean"]

    again = run_step(toy_stages, toy_batch, toy_ctx, store, 1, weights_fingerprints=WEIGHTS)
    assert statuses(again) == {**dict.fromkeys(ENABLED, "cached"), "critic": "skipped"}
    assert dict(calls) == dict.fromkeys(ENABLED, 1)  # no stage function ran again
    assert again.metrics["toy/total_mean"] == result.metrics["toy/total_mean"]  # from the manifest
    assert [r.fingerprint for r in again.records] == [r.fingerprint for r in result.records]
    assert torch.equal(again.batch.batch["s"], result.batch.batch["s"])


def test_config_change_invalidates_that_stage_and_downstream_only(
    tmp_path, first_run, toy_stages, toy_batch, toy_ctx, calls
):
    store, _ = first_run
    changed = toy_ctx.config.model_copy(
        update={"toy": toy_ctx.config.toy.model_copy(update={"factor": 3.0})}
    )
    branch = RunStore(
        tmp_path / "branch", cache_dir=store.cache_dir, parents=[store.root]
    )  # a re-run branch
    ctx = type(toy_ctx)(config=changed, engines=toy_ctx.engines)
    rerun = run_step(toy_stages, toy_batch, ctx, branch, 1, weights_fingerprints=WEIGHTS)
    assert statuses(rerun) == {
        "produce": "cached",
        "double": "ran",
        "score": "ran",
        "critic": "skipped",
        "total": "ran",
    }
    assert dict(calls) == {"produce": 1, "double": 2, "score": 2, "total": 2}
    produce = rerun.records[0]
    assert produce.artifact == store.artifact_path(1, "produce")  # the parent's artifact, reused
    want = expected_total(toy_batch.batch["x"], offset=1.0, factor=3.0, weight=0.5)
    assert torch.allclose(torch.as_tensor(rerun.batch.non_tensor_batch["total"]), want.double())
    assert (Path(branch.root) / "step_1" / "double" / "manifest.json").is_file()


def test_weights_fingerprint_change_invalidates_the_weight_reading_stage(
    tmp_path, first_run, toy_stages, toy_batch, toy_ctx, calls
):
    store, _ = first_run
    toy_ctx.engines["model"].weight = 2.0  # new weights, announced by a new fingerprint
    branch = RunStore(tmp_path / "branch", cache_dir=store.cache_dir, parents=[store.root])
    rerun = run_step(
        toy_stages, toy_batch, toy_ctx, branch, 1, weights_fingerprints={"score": "weights-v1"}
    )
    assert statuses(rerun) == {
        "produce": "cached",
        "double": "cached",
        "score": "ran",
        "critic": "skipped",
        "total": "ran",
    }
    want = expected_total(toy_batch.batch["x"], offset=1.0, factor=2.0, weight=2.0)
    assert torch.allclose(torch.as_tensor(rerun.batch.non_tensor_batch["total"]), want.double())


def test_corrupted_cached_artifact_is_recomputed_not_used(
    first_run, toy_stages, toy_batch, toy_ctx, calls
):
    store, _ = first_run
    tensors = Path(store.artifact_path(1, "double")) / "tensors.safetensors"
    raw = bytearray(tensors.read_bytes())
    raw[-1] ^= 0xFF  # flip one byte of tensor data: same size, same header
    os.chmod(tensors, 0o644)
    tensors.write_bytes(bytes(raw))
    rerun = run_step(toy_stages, toy_batch, toy_ctx, store, 1, weights_fingerprints=WEIGHTS)
    double = next(r for r in rerun.records if r.stage == "double")
    assert double.status == "ran" and double.reason.startswith("recomputed: ")
    assert calls["double"] == 2 and calls["produce"] == 1
    assert torch.equal(rerun.batch.batch["z"], (toy_batch.batch["x"] + 1.0) * 2.0)  # correct values
    assert statuses(rerun)["score"] == "cached"  # same content → same fingerprint downstream
    assert json.loads(Path(store.step_dir(1), "journal.json").read_text())["status"] == "done"


def test_a_failing_stage_stops_the_step_with_its_own_error(
    tmp_path, toy_stages, toy_batch, toy_ctx
):
    def explode(batch, ctx):
        raise ValueError("score engine exploded")

    stages = [replace(s, fn=explode) if s.name == "score" else s for s in toy_stages]
    store = RunStore(tmp_path / "run")
    with pytest.raises(ValueError, match="score engine exploded"):
        run_step(stages, toy_batch, toy_ctx, store, 1, weights_fingerprints=WEIGHTS)
    journal = store.read_journal(1)  # finished and skipped stages are on record; score is not
    assert journal.status == "running"
    assert [(r.stage, r.status) for r in journal.stages] == [
        ("produce", "ran"),
        ("double", "ran"),
        ("critic", "skipped"),
    ]


def test_ppoflow_artifact_digest_sha256_tree_writes_every_artifact_with_it(
    first_run, tmp_path, toy_stages, toy_batch, toy_ctx
):
    """The default digest is blake3 (the toy config has no ppoflow section); the key switches
    every artifact of the step to sha256_tree: same content, other fingerprints."""
    from pydantic import BaseModel

    class PPOFlowSection(BaseModel):
        artifact_digest: str = "sha256_tree"

    config = toy_ctx.config.model_copy(update={"ppoflow": PPOFlowSection()})
    sha_store = RunStore(tmp_path / "sha-run", cache_dir=tmp_path / "sha-cache")
    sha_result = run_step(
        toy_stages,
        toy_batch,
        replace(toy_ctx, config=config),
        sha_store,
        1,
        weights_fingerprints=WEIGHTS,
    )
    store, result = first_run
    assert read_manifest(store.input_path(1))["digest"] == "blake3"
    assert read_manifest(sha_store.input_path(1))["digest"] == "sha256_tree"
    for name in ENABLED:
        assert read_manifest(sha_store.artifact_path(1, name))["digest"] == "sha256_tree"
    assert torch.equal(result.batch.batch["s"], sha_result.batch.batch["s"])  # same content…
    fingerprints = {r.stage: r.fingerprint for r in result.records if r.fingerprint}
    sha_fingerprints = {r.stage: r.fingerprint for r in sha_result.records if r.fingerprint}
    assert fingerprints.keys() == sha_fingerprints.keys() == set(ENABLED)
    assert all(fingerprints[s] != sha_fingerprints[s] for s in ENABLED)  # …other digests
