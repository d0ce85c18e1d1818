"""The shared-memory segments of vLLM's CPU communicators, which vLLM itself never removes.

On CPU, a vLLM engine spanning ranks (tensor parallelism > 1) moves its all-reduces through POSIX
shared memory: in every process group each rank creates one segment, named
``{group_name}_{rank in group}``, and maps its peers'. vLLM unlinks none of them when the engine
shuts down, and the group name is the same in every run of an engine built in the ranks' own
processes (``external_launcher``: ``-tp:0-[0-1]-cpushm`` for two ranks), so the next such engine
on the machine fails to start with "create shm in SHMManager failed. errno: 17" (EEXIST).

`owned_segments` reads the names of this process's segments from vLLM's live groups (call it
while the engine is up); `remove_segments` unlinks them once it is down. Unlinking only removes
the name: a peer rank still mapping the segment keeps its memory until it unmaps it.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

#: where glibc's shm_open keeps POSIX shared-memory objects on Linux
SHM_DIR = Path("/dev/shm")

#: the error vLLM's SHM manager raises when a segment of that name exists already
EXISTS_ERROR = "create shm in SHMManager failed. errno: 17"


def owned_segments(groups: Iterable[Any] | None = None) -> list[Path]:
    """The segment files this process created for vLLM's CPU shared-memory communicators.

    ``groups``: vLLM ``GroupCoordinator``s (default: every live group of this process, from
    ``vllm.distributed.parallel_state``). A group whose communicator does not use shared memory
    (GPU, one rank, or vLLM's fallback to torch.distributed) contributes nothing.
    """
    if groups is None:
        from vllm.distributed import parallel_state

        groups = (ref() for ref in list(parallel_state._groups.values()))
    paths = []
    for group in groups:
        communicator = getattr(group, "device_communicator", None)
        name = getattr(getattr(communicator, "dist_module", None), "group_name", None)
        if isinstance(name, str):  # shm_open drops the leading slashes of a name
            paths.append(SHM_DIR / f"{name.lstrip('/')}_{communicator.rank}")
    return paths


def remove_segments(paths: Iterable[Path]) -> list[Path]:
    """Unlink each segment that still exists; returns the ones removed."""
    removed = []
    for path in paths:
        try:
            path.unlink()
        except FileNotFoundError:
            continue
        removed.append(path)
    return removed


def explain_existing_segment(error: BaseException) -> RuntimeError | None:
    """A clear error for vLLM's EEXIST at engine build (None for any other error)."""
    if EXISTS_ERROR not in str(error):
        return None
    return RuntimeError(
        f"a vLLM CPU shared-memory segment of this engine's name exists already in {SHM_DIR} "
        "(left by an earlier run on this machine that was killed before it closed its engine): "
        f"remove the *-cpushm_* files there (ls {SHM_DIR}) once no other vLLM run uses them"
    )
