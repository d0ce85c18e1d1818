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
def test_a_parent_single_ranks_variables_are_not_a_launcher(tmp_path):
    """A child of a process that ran one rank inherits RANK / LOCAL_RANK / WORLD_SIZE but no
    MASTER_*; it must still start its own single rank (before: MPI discovery, or the parent's
    port, which the parent still held: EADDRINUSE). The file store's temp directory is gone
    when the process has exited (before: one empty directory left per run)."""
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER}
    env.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", OMP_NUM_THREADS="1", TMPDIR=str(tmp_path))
    script = (
        SCRIPT
        + "import glob, tempfile; print(len(glob.glob(tempfile.gettempdir() + '/ppoflow-pg-*')))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-2:] == ["1 0", "1"]  # the store's, while it runs
    assert not list(tmp_path.glob("ppoflow-pg-*"))


REBUILD_SCRIPT = """
import torch
import deepspeed
from stages.engines.deepspeed_setup import ensure_process_group

def build():
    ensure_process_group()
    model = torch.nn.Linear(4, 4)
    config = {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 0}}
    engine, *_ = deepspeed.initialize(model=model, config=config)
    return engine

build()
torch.distributed.destroy_process_group()  # what vLLM's clean-up does, bypassing DeepSpeed
build()
print("rebuilt", torch.distributed.get_world_size())
"""


@pytest.mark.slow  # a fresh interpreter importing DeepSpeed
def test_an_engine_builds_after_the_world_was_destroyed_behind_deepspeeds_back():
    """A second DeepSpeed engine in one process after torch.distributed's own
    destroy_process_group (vLLM's clean-up): before, DeepSpeed's cached clone of the dead world
    group made the new engine's broadcast fail with "Group ... is not registered"."""
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER}
    env["OMP_NUM_THREADS"] = "1"
    done = subprocess.run(
        [sys.executable, "-c", REBUILD_SCRIPT], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "rebuilt 1"


ONE_RANK_SCRIPT = """
import os
import deepspeed.comm.comm as deepspeed_comm
import deepspeed.ops
from stages.engines.deepspeed_setup import SHARED_MEMORY_OP, ensure_process_group
ensure_process_group()
print(deepspeed_comm.cdb.shm_comm_op, deepspeed.ops.__compatible_ops__[SHARED_MEMORY_OP])
print(sorted(os.listdir(os.environ["TORCH_EXTENSIONS_DIR"])))
"""


@pytest.mark.slow  # a fresh interpreter importing DeepSpeed
def test_a_single_rank_builds_no_shared_memory_op(tmp_path):
    """A world of one rank neither builds nor loads DeepSpeed's shared-memory all-reduce op
    (before: a 25–60 s C++ build on a fresh machine, for a rank with no peer); DeepSpeed's
    table of ops is left as probed, so a larger world in this environment still uses it."""
    extensions = tmp_path / "torch-extensions"
    extensions.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER}
    env.update(OMP_NUM_THREADS="1", TORCH_EXTENSIONS_DIR=str(extensions))
    done = subprocess.run(
        [sys.executable, "-c", ONE_RANK_SCRIPT], env=env, capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    op_line, built = done.stdout.strip().splitlines()[-2:]
    op, probed_compatible = op_line.split()
    assert op == "None" and probed_compatible == "True"
    assert built == "[]"


def test_the_op_table_is_restored_and_larger_worlds_keep_the_op():
    import deepspeed.ops

    from stages.engines.deepspeed_setup import SHARED_MEMORY_OP, _shared_memory_op_for

    table = deepspeed.ops.__compatible_ops__
    before = table.get(SHARED_MEMORY_OP, False)
    with _shared_memory_op_for(1):
        assert table[SHARED_MEMORY_OP] is False
    assert table.get(SHARED_MEMORY_OP, False) == before
    with _shared_memory_op_for(2):
        assert table.get(SHARED_MEMORY_OP, False) == before


def test_each_python_environment_builds_ops_in_its_own_directory(tmp_path):
    from stages.engines.deepspeed_setup import extensions_dir

    main, bench = (
        extensions_dir(str(tmp_path / ".venv")),
        extensions_dir(str(tmp_path / ".venv-bench")),
    )
    assert main != bench and main.parent == bench.parent
    assert (
        main.name.startswith("ppoflow-.venv-") and extensions_dir(str(tmp_path / ".venv")) == main
    )
