"""A full disk during an artifact write (issue 18): the error names the file, the previous
artifact (or no artifact) stays under the final name, and no temp folder is left.

The disk fills deterministically: ``open`` in ``dataproto/artifact_store.py`` (the one call every
local artifact file is opened with) returns files that fail like a full disk, with
``OSError(ENOSPC)`` and no file name, on the first ``write`` (after half the bytes reached the
file) or on ``close`` (the buffered bytes flushed), for one file name of the artifact.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from tensordict import TensorDict

from dataproto import DataProto
from dataproto import artifact_store as store_module
from dataproto.artifact import TENSOR_FILE, load_artifact, save_artifact, verify_artifact
from dataproto.artifact_store import MANIFEST, naming_failed_writes

ARTIFACT_FILES = [TENSOR_FILE, "non_tensor_000.npy", "non_tensor_001.json", "meta_info.json"]


class FullDiskFile:
    """A binary file that fails like a full disk: ``at="write"``: the first write puts half its
    bytes in the file, then raises; ``at="close"``: every write is kept, closing raises."""

    def __init__(self, handle, at: str) -> None:
        self._handle, self._at = handle, at

    def write(self, data) -> int:
        if self._at == "write":
            view = memoryview(data).cast("B")
            self._handle.write(view[: len(view) // 2])
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return self._handle.write(data)

    def close(self) -> None:
        self._handle.close()
        if self._at == "close":
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def __enter__(self):
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


def fill_disk_at(monkeypatch, name: str, at: str = "write") -> None:
    """From now on, the artifact file ``name`` fails like a full disk (module docstring)."""

    def full_disk_open(path, mode="r", *args, **kwargs):
        handle = open(path, mode, *args, **kwargs)  # noqa: SIM115 (the caller closes it)
        is_full = "w" in mode and os.path.basename(path) == name
        return FullDiskFile(handle, at) if is_full else handle

    monkeypatch.setattr(store_module, "open", full_disk_open, raising=False)


def batch(seed: int) -> DataProto:
    generator = torch.Generator().manual_seed(seed)
    return DataProto(
        batch=TensorDict({"x": torch.randn(8, 64, generator=generator)}, batch_size=[8]),
        non_tensor_batch={
            "uid": np.arange(8) + seed,
            "tag": np.array([f"s{seed}"] * 8, dtype=object),
        },
        meta_info={"seed": seed},
    )


def leftovers(folder: Path) -> list[str]:
    """The hidden entries of ``folder``: temp folders of unfinished writes."""
    return sorted(entry.name for entry in folder.iterdir() if entry.name.startswith("."))


@pytest.mark.parametrize("at", ["write", "close"])
@pytest.mark.parametrize("name", [*ARTIFACT_FILES, MANIFEST])
def test_a_full_disk_keeps_the_previous_artifact_and_leaves_no_temp_folder(
    tmp_path, monkeypatch, name, at
):
    path = tmp_path / "step_3" / "rollout"
    before = save_artifact(batch(1), path)
    listing = sorted(p.name for p in path.iterdir())
    fill_disk_at(monkeypatch, name, at)
    with pytest.raises(OSError) as failed:
        save_artifact(batch(2), path, overwrite=True)
    assert failed.value.errno == errno.ENOSPC
    written = Path(failed.value.filename)  # the file being written, in the temp folder
    assert written.name == name and written.parent.name.startswith(".rollout.tmp-")
    assert leftovers(path.parent) == []
    assert sorted(p.name for p in path.iterdir()) == listing
    verify_artifact(path)
    kept = load_artifact(path)
    assert kept.meta_info == {"seed": 1} and torch.equal(kept.batch["x"], batch(1).batch["x"])
    monkeypatch.undo()  # space freed: the write goes through
    assert save_artifact(batch(1), path, overwrite=True).fingerprint == before.fingerprint


def test_a_full_disk_on_a_new_artifact_leaves_nothing_under_its_name(tmp_path, monkeypatch):
    path = tmp_path / "step_1" / "reward"
    fill_disk_at(monkeypatch, TENSOR_FILE)
    with pytest.raises(OSError, match="No space left on device") as failed:
        save_artifact(batch(1), path)
    assert failed.value.filename.endswith(f"/{TENSOR_FILE}")
    assert not path.exists() and leftovers(path.parent) == []
    monkeypatch.undo()  # space freed: the same write succeeds
    save_artifact(batch(1), path)
    verify_artifact(path)


def test_a_full_disk_at_the_final_rename_puts_the_previous_artifact_back(tmp_path, monkeypatch):
    """With ``overwrite=True`` the old artifact is renamed aside first; a rename of the new one
    that fails (a directory entry needs a block too) renames it back."""
    path = tmp_path / "step_2" / "old_log_prob"
    save_artifact(batch(1), path)
    real_rename = os.rename

    def rename(source, target):
        if os.fspath(target) == str(path) and ".tmp-" in os.fspath(source) and "-old" not in source:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), source)
        return real_rename(source, target)

    monkeypatch.setattr(store_module.os, "rename", rename)
    with pytest.raises(OSError, match="No space left on device"):
        save_artifact(batch(2), path, overwrite=True)
    monkeypatch.undo()
    assert leftovers(path.parent) == []
    assert load_artifact(path).meta_info == {"seed": 1}


def test_naming_failed_writes_keeps_a_name_already_given():
    with pytest.raises(OSError) as failed, naming_failed_writes("/other"):
        raise OSError(errno.EDQUOT, os.strerror(errno.EDQUOT), "/data/x")
    assert failed.value.filename == "/data/x"
