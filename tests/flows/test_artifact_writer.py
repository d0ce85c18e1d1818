"""The background artifact writer (flows/runs/artifact_writer.py): the fingerprint is known before the
files are written, the files are those of a synchronous save, the step ends when its writes
have, and a failed write is the step's error."""

from __future__ import annotations

import errno
import threading

import pytest
import torch
from pydantic import BaseModel

from dataproto import DataProto
from dataproto.artifact import load_artifact, read_manifest, save_artifact, verify_artifact
from dataproto.artifact_store import Store
from flows.runs.artifact_writer import (
    THREAD_NAME,
    ArtifactWriter,
    current_writer,
    writing_in_background,
)
from flows.runs.store import RunStore
from flows.step_flow import run_step
from stages.stage import StageContext

from .conftest import ToyConfig, ToyModel


class ArtifactsConfig(BaseModel):
    write_in_background: bool = True


class PPOFlowSlice(BaseModel):
    artifacts: ArtifactsConfig = ArtifactsConfig()


class BackgroundConfig(BaseModel):
    """The toy run config with ``ppoflow.artifacts.write_in_background``."""

    toy: ToyConfig = ToyConfig()
    ppoflow: PPOFlowSlice = PPOFlowSlice()


def batch() -> DataProto:
    ids = torch.zeros(4, 6, dtype=torch.int64)
    ids[:, 3:] = torch.arange(12).view(4, 3) + 5
    return DataProto.from_dict({"ids": ids, "lp": torch.randn(4, 6)}, meta_info={"t": 1.0})


def test_the_fingerprint_comes_first_and_the_files_equal_a_synchronous_save(tmp_path):
    data = batch()
    plain = save_artifact(data, tmp_path / "plain")
    queued = []
    ref = save_artifact(data, tmp_path / "later", write_in=queued.append)
    assert ref.fingerprint == plain.fingerprint and ref.nbytes == plain.nbytes
    assert not (tmp_path / "later").exists() and len(queued) == 1  # nothing written yet
    queued[0]()
    verify_artifact(tmp_path / "later")
    assert read_manifest(tmp_path / "later") == {
        **read_manifest(tmp_path / "plain"),
        **{"fingerprint": ref.fingerprint},
    }
    loaded = load_artifact(tmp_path / "later")
    assert torch.equal(loaded.batch["ids"], data.batch["ids"]) and loaded.meta_info == {"t": 1.0}


def test_writes_run_in_order_on_one_thread_and_the_first_error_is_raised():
    done, threads = [], set()

    def write(name):
        def run():
            threads.add(threading.current_thread().name)
            if name == "bad":
                raise OSError(errno.ENOSPC, "No space left on device")
            done.append(name)

        return run

    with pytest.raises(OSError, match="No space left"), writing_in_background(True) as writer:
        assert current_writer() is writer
        for name in ("a", "bad", "b"):
            writer.submit(write(name))
    assert done == ["a", "b"] and len(threads) == 1 and threads.pop().startswith(THREAD_NAME)
    assert current_writer() is None
    with writing_in_background(False) as nothing:
        assert nothing is None and current_writer() is None
    writer = ArtifactWriter()
    writer.submit(write("c"))
    writer.close()
    assert done[-1] == "c"


@pytest.mark.usefixtures("prefect_harness")
def test_a_step_writes_its_artifacts_in_the_background_and_ends_when_they_are_written(
    tmp_path, toy_stages, toy_batch, monkeypatch
):
    committed = []
    commit = Store.commit

    def recording_commit(self, *args, **kwargs):
        committed.append((self.root.rsplit("/", 1)[-1], threading.current_thread().name))
        return commit(self, *args, **kwargs)

    monkeypatch.setattr(Store, "commit", recording_commit)
    ctx = StageContext(config=BackgroundConfig(), engines={"model": ToyModel(weight=0.5)})
    store = RunStore(tmp_path / "run", cache_dir=tmp_path / "cache")
    result = run_step(toy_stages, toy_batch, ctx, store, 1, weights_fingerprints={"score": "w"})
    stages = [record.stage for record in result.records if record.artifact]
    assert [name for name, _ in committed if name != "input"] == stages
    assert all(thread.startswith(THREAD_NAME) for name, thread in committed if name != "input")
    for record in result.records:  # every artifact on disk when the step returned
        if record.artifact:
            assert read_manifest(record.artifact)["fingerprint"] == record.fingerprint
            verify_artifact(record.artifact)
    assert store.read_journal(1).status == "done"


@pytest.mark.usefixtures("prefect_harness")
def test_a_failed_background_write_fails_the_step(tmp_path, toy_stages, toy_batch, monkeypatch):
    def full_disk(self, *args, **kwargs):
        if self.root.endswith("/double"):
            raise OSError(errno.ENOSPC, "No space left on device")
        return commit(self, *args, **kwargs)

    commit = Store.commit
    monkeypatch.setattr(Store, "commit", full_disk)
    ctx = StageContext(config=BackgroundConfig(), engines={"model": ToyModel(weight=0.5)})
    store = RunStore(tmp_path / "run", cache_dir=tmp_path / "cache")
    with pytest.raises(OSError, match="No space left on device"):
        run_step(toy_stages, toy_batch, ctx, store, 1, weights_fingerprints={"score": "w"})
    assert store.read_journal(1).status != "done"
    assert not (tmp_path / "run" / "step_1" / "double").exists()
    assert list((tmp_path / "run" / "step_1").glob(".double.tmp-*")) == []  # cleaned up
