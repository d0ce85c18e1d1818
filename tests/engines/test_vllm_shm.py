"""vLLM's CPU shared-memory segments (stages/engines/vllm_shm.py): the names this process owns,
read from its groups' communicators, removed once; vLLM's EEXIST at build explained."""

from __future__ import annotations

from types import SimpleNamespace

from stages.engines import vllm_shm
from stages.engines.vllm_shm import explain_existing_segment, owned_segments, remove_segments


def group(name: str | None, rank: int) -> SimpleNamespace:
    """A vLLM GroupCoordinator's shape: a communicator whose dist_module names the segment."""
    dist_module = SimpleNamespace(group_name=name) if name else object()
    return SimpleNamespace(device_communicator=SimpleNamespace(dist_module=dist_module, rank=rank))


def test_each_shared_memory_group_names_this_ranks_segment(monkeypatch, tmp_path):
    monkeypatch.setattr(vllm_shm, "SHM_DIR", tmp_path)
    groups = [
        group("//-tp:0-[0-1]-cpushm", 1),  # external_launcher: VLLM_DIST_IDENT "//"
        group(None, 0),  # a communicator without shared memory (torch.distributed fallback)
        SimpleNamespace(device_communicator=None),  # a group with no device communicator
        None,  # a group already freed (its weakref is dead)
        group("29500-pp:0-[0]-cpushm", 0),
    ]
    assert owned_segments(groups) == [
        tmp_path / "-tp:0-[0-1]-cpushm_1",
        tmp_path / "29500-pp:0-[0]-cpushm_0",
    ]


def test_removing_unlinks_what_exists_and_skips_what_does_not(tmp_path):
    present, absent = tmp_path / "-tp:0-[0-1]-cpushm_0", tmp_path / "-tp:0-[0-1]-cpushm_1"
    present.write_bytes(b"\0" * 16)
    other = tmp_path / "someone-elses-segment"
    other.write_bytes(b"")
    assert remove_segments([present, absent]) == [present]
    assert not present.exists() and other.exists()
    assert remove_segments([present]) == []


def test_the_eexist_at_build_says_what_is_in_the_way_and_what_to_do():
    error = RuntimeError("create shm in SHMManager failed. errno: 17")
    clear = explain_existing_segment(error)
    assert clear is not None
    assert "exists already in /dev/shm" in str(clear) and "*-cpushm_*" in str(clear)
    assert explain_existing_segment(RuntimeError("CUDA out of memory")) is None
