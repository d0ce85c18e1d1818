"""ensure_process_group without a launcher: one rank through a file store, whatever the parent
process left in the environment."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

SCRIPT = """
import torch
from stages.engines.deepspeed_setup import ensure_process_group
ensure_process_group()
print(torch.distributed.get_world_size(), torch.distributed.get_rank())
"""
LAUNCHER = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


@pytest.mark.slow  # a fresh interpreter importing DeepSpeed: ~20 s
def test_a_parent_single_ranks_variables_are_not_a_launcher():
    """A child of a process that ran one rank inherits RANK / LOCAL_RANK / WORLD_SIZE but no
    MASTER_*; it must still start its own single rank (before: MPI discovery, or the parent's
    port, which the parent still held: EADDRINUSE)."""
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER}
    env.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", OMP_NUM_THREADS="1")
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "1 0"
