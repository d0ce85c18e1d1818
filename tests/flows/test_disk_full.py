"""A full disk while a run writes (issue 18): a journal / JSON record or a checkpoint whose write
fails leaves nothing half-written under its final name and no temp file; the previous checkpoint
still verifies and loads, the tracker keeps its step; the command line prints one line naming
the file, the room left and how to go on (flows/cli/disk_full.py), exit status 1.

The disk fills deterministically: the ``open`` each writer calls (``os.fdopen`` for the run
store, ``open`` in ``stages/engines/checkpoint.py`` for every engine file, DeepSpeed's through
its checkpoint engine, and the tracker) returns files that fail as a full disk does:
``OSError(ENOSPC)`` with no file name, on the first ``write`` after half its bytes went in.
The slow test ``test_a_run_out_of_room_mid_run_says_so_and_resumes`` fills a real limit instead.
"""

from __future__ import annotations

import errno
import json
import os
import re
import resource
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import typer

from flows.cli.disk_full import explain_disk_full, human_bytes, mount_of
from flows.cli.error_lines import explain
from flows.cli.train import fail_in_one_line
from flows.engines import InProcessRole
from flows.runs import store as run_store_module
from flows.runs.checkpoints import (
    load_run_checkpoint,
    resume_checkpoint,
    save_run_checkpoint,
    tracking_state,
)
from flows.runs.store import RunStore, StepJournal
from stages.engines import checkpoint as checkpoint_module
from stages.engines.checkpoint import LATEST_FILE, read_latest_step
from stages.engines.checkpoint_manifest import verify_checkpoint
from stages.engines.deepspeed_setup import EngineSettings, initialize_engine
from stages.engines.logprob import ResponseLogProbModel
from stages.engines.models import load_causal_lm
from stages.engines.roles import _CheckpointMixin

KEEP_ALL = SimpleNamespace(max_actor_ckpt_to_keep=None, max_critic_ckpt_to_keep=None)
ENOSPC_TEXT = os.strerror(errno.ENOSPC)


class FullDiskFile:
    """A file whose first write puts half its bytes in, then fails as a full disk does."""

    def __init__(self, handle) -> None:
        self._handle = handle

    def write(self, data) -> int:
        half = (
            data[: len(data) // 2] if isinstance(data, str) else memoryview(data)[: len(data) // 2]
        )
        self._handle.write(half)
        raise OSError(errno.ENOSPC, ENOSPC_TEXT)

    def __getattr__(self, name):
        return getattr(self._handle, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc_info) -> None:
        self._handle.close()


def full_disk(real_open, is_full):
    """``real_open`` whose files opened for writing fail (:class:`FullDiskFile`) where
    ``is_full(first argument)``."""

    def opener(target, mode="r", *args, **kwargs):
        handle = real_open(target, mode, *args, **kwargs)
        return FullDiskFile(handle) if "w" in mode and is_full(target) else handle

    return opener


def hidden_entries(root: Path) -> list[str]:
    """Every hidden file or folder below ``root``: temp files, ``.partial`` / ``.old`` folders."""
    return sorted(str(p.relative_to(root)) for p in root.rglob(".*"))


# --- the run store's JSON writes -----------------------------------------------------------------


def journal(step: int, stage: str) -> StepJournal:
    return StepJournal(step=step, status="done", metrics={"stage": float(len(stage))})


WRITES = {
    "journal": (lambda store, v: store.write_journal(journal(3, v)), "step_3/journal.json"),
    "config": (lambda store, v: store.save_config({"value": v}), "config.json"),
    "json record": (lambda store, v: store.save_json("rerun.json", {"value": v}), "rerun.json"),
    "run_info": (
        lambda store, v: store.save_run_info(
            {"mlflow_run_id": v, "mlflow_tracking_uri": None, "mlflow_experiment": None}
        ),
        "run_info.json",
    ),
}


@pytest.mark.parametrize("kind", list(WRITES))
def test_a_full_disk_keeps_a_run_store_file_as_it_was(tmp_path, monkeypatch, kind):
    write, name = WRITES[kind]
    store = RunStore(tmp_path / "run")
    write(store, "before")
    target = tmp_path / "run" / name
    before = target.read_bytes()
    monkeypatch.setattr(run_store_module.os, "fdopen", full_disk(os.fdopen, lambda fd: True))
    with pytest.raises(OSError, match=ENOSPC_TEXT) as failed:
        write(store, "after, much longer than before")
    temp = Path(failed.value.filename)
    assert temp.parent == target.parent and temp.name.startswith(f".tmp-{target.name}-")
    assert target.read_bytes() == before
    assert hidden_entries(tmp_path / "run") == []
    monkeypatch.undo()  # space freed: the write goes through
    write(store, "after")
    assert target.read_bytes() != before


# --- engine checkpoints --------------------------------------------------------------------------


class Holder(_CheckpointMixin):
    """A role worker reduced to its checkpoint methods."""

    def __init__(self, engine) -> None:
        self.engine = engine


@pytest.fixture(scope="module")
def engines(tmp_path_factory) -> dict:
    from stages.data import make_tiny_model

    base = make_tiny_model(tmp_path_factory.mktemp("base") / "model")
    torch.manual_seed(0)
    actor = initialize_engine(
        ResponseLogProbModel(load_causal_lm(base)), EngineSettings(zero_stage=1, lr=1e-2)
    )
    return {"actor": InProcessRole(Holder(actor))}


def run_state(run_dir: Path, position: int) -> dict:
    identity = {"run_dir": str(run_dir), "mlflow_run_id": None, "mlflow_tracking_uri": None}
    identity["mlflow_experiment"] = None
    return {
        "loader": {"position": position},
        "kl_ctrl": None,
        "weights_lineage": {},
        **tracking_state(identity, {"actor/pg_loss": 0.5}),
    }


ENGINE_FILES = [
    "mp_rank_00_model_states.pt",  # DeepSpeed's, through its checkpoint engine
    "zero_pp_rank_0_mp_rank_00_optim_states.pt",
    "rng_state_rank0.pt",
    "lr_scheduler.pt",
    "client_state.json",
    "ppoflow_checkpoint.json",
    f".{LATEST_FILE}.partial",  # the tracker
]


@pytest.mark.parametrize("name", ENGINE_FILES)
def test_a_full_disk_during_a_checkpoint_keeps_the_previous_one(
    tmp_path, monkeypatch, engines, name
):
    root, run_dir = tmp_path / "ckpt", tmp_path / "run"
    save_run_checkpoint(root, 1, engines, run_state(run_dir, 4), KEEP_ALL)
    is_full = lambda target: os.path.basename(target) == name  # noqa: E731
    monkeypatch.setattr(checkpoint_module, "open", full_disk(open, is_full), raising=False)
    with pytest.raises(OSError, match=ENOSPC_TEXT) as failed:
        save_run_checkpoint(root, 2, engines, run_state(run_dir, 8), KEEP_ALL)
    monkeypatch.undo()
    assert os.path.basename(failed.value.filename) == name

    assert read_latest_step(root) == 1
    assert hidden_entries(root) == []  # no .partial, .old or temp file
    verify_checkpoint(root, 1)  # hashes every file
    trainer = SimpleNamespace(resume_mode="auto", default_local_dir=str(root))
    checkpoint, _ = resume_checkpoint(trainer)
    assert checkpoint.step == 1
    assert load_run_checkpoint(root, 1, engines)["loader"] == {"position": 4}

    line = explain(failed.value)
    assert line.startswith(f"no space left on device writing {failed.value.filename} (")
    assert line.endswith(f"; free space, then continue with `ppoflow resume {run_dir}`")

    save_run_checkpoint(root, 2, engines, run_state(run_dir, 8), KEEP_ALL)  # space freed
    assert read_latest_step(root) == 2 and verify_checkpoint(root, 2).step == 2


@pytest.mark.parametrize("module", ["flows.runs.checkpoints", "stages.engines.checkpoint_manifest"])
def test_a_full_disk_writing_the_state_or_the_manifest_keeps_the_previous_checkpoint(
    tmp_path, monkeypatch, engines, module
):
    """data/state.json (flows/runs/checkpoints.py) and the step manifest are JSON written through
    a temp file: a full disk there leaves no temp file, names it, and step 1 still loads."""
    import importlib

    root, run_dir = tmp_path / "ckpt", tmp_path / "run"
    save_run_checkpoint(root, 1, engines, run_state(run_dir, 4), KEEP_ALL)

    def dump(*args, **kwargs):
        raise OSError(errno.ENOSPC, ENOSPC_TEXT)  # as a write finds the disk full: no name

    monkeypatch.setattr(importlib.import_module(module).json, "dump", dump)
    with pytest.raises(OSError, match=ENOSPC_TEXT) as failed:
        save_run_checkpoint(root, 2, engines, run_state(run_dir, 8), KEEP_ALL)
    monkeypatch.undo()
    assert os.path.basename(failed.value.filename).startswith(".tmp-")
    assert read_latest_step(root) == 1 and hidden_entries(root) == []
    assert load_run_checkpoint(root, 1, engines)["loader"] == {"position": 4}


# --- the one line --------------------------------------------------------------------------------


def make_run(tmp_path: Path, with_checkpoint: bool) -> Path:
    """A run directory (config.json, run_info.json) whose checkpoints are in ``tmp_path/ckpt``."""
    run = tmp_path / "run"
    store = RunStore(run)
    store.save_config({"trainer": {"default_local_dir": "ckpt"}})
    info = {"mlflow_run_id": None, "mlflow_tracking_uri": None, "mlflow_experiment": None}
    store.save_run_info({**info, "working_dir": str(tmp_path)})
    if with_checkpoint:
        checkpoint_module.write_latest_step(tmp_path / "ckpt", 2)
    return run


def test_the_cli_says_one_line_with_the_file_the_room_and_how_to_resume(tmp_path, capsys):
    run = make_run(tmp_path, with_checkpoint=True)
    written = f"{run}/step_3/.rollout.tmp-0123456789ab/tensors.safetensors"
    full = OSError(errno.ENOSPC, ENOSPC_TEXT, written)
    try:  # as it comes out of the flow: wrapped by whatever was running
        try:
            raise full
        except OSError as err:
            raise RuntimeError("stage rollout failed") from err
    except RuntimeError as wrapped:
        exit_ = fail_in_one_line(wrapped, verbose=False)
    assert isinstance(exit_, typer.Exit) and exit_.exit_code == 1
    (line,) = capsys.readouterr().err.splitlines()
    device, mount = mount_of(tmp_path)
    room = rf"\(\d[\d.]* [KMGT]?i?B free on {re.escape(device)}, mounted at {re.escape(mount)}\)"
    assert re.fullmatch(
        rf"error: no space left on device writing {re.escape(written)} {room}; free space, "
        rf"then continue with `ppoflow resume {re.escape(str(run))}`",
        line,
    ), line


@pytest.mark.parametrize(
    ("code", "says", "remedy"),
    [
        (errno.ENOSPC, "no space left on device", "free space"),
        (errno.EDQUOT, "disk quota exceeded", "free space or raise the quota"),
        (errno.EFBIG, "file too large (over the file-size limit", "raise the limit or free space"),
    ],
)
def test_each_kind_of_full_disk_is_explained(tmp_path, code, says, remedy):
    run = make_run(tmp_path, with_checkpoint=True)
    line = explain(OSError(code, os.strerror(code), f"{run}/step_1/journal.json"))
    assert line.startswith(f"{says}") and f"; {remedy}, then continue with" in line


def test_a_run_without_a_checkpoint_is_told_to_train_again(tmp_path):
    run = make_run(tmp_path, with_checkpoint=False)
    line = explain_disk_full(OSError(errno.ENOSPC, ENOSPC_TEXT, f"{run}/step_1/input/x"))
    assert line.endswith("then train again: the run has no checkpoint to resume from yet")
    first_checkpoint = OSError(errno.ENOSPC, ENOSPC_TEXT, f"{tmp_path}/ckpt/global_step_1/x.pt")
    assert explain_disk_full(first_checkpoint).endswith("no checkpoint to resume from yet")


def test_a_path_outside_any_run_and_a_nameless_error_still_get_one_line(tmp_path):
    line = explain(OSError(errno.ENOSPC, ENOSPC_TEXT, str(tmp_path / "elsewhere" / "f")))
    assert f"writing {tmp_path}/elsewhere/f (" in line
    assert line.endswith(
        "continue with `ppoflow resume RUN_DIR` (the run directory ppoflow train printed)"
    )
    assert explain(OSError(errno.ENOSPC, ENOSPC_TEXT)).startswith("no space left on device; free")


def test_other_os_errors_are_not_explained_as_a_full_disk(tmp_path):
    assert explain(FileNotFoundError(errno.ENOENT, "No such file", str(tmp_path))) is None
    assert explain(PermissionError(errno.EACCES, "Permission denied", "/x")) is None


def test_human_bytes_and_the_mount_of_the_root():
    assert human_bytes(12 * 2**20 + 1) == "12 MiB"
    device, mount = mount_of(Path("/"))
    assert mount == "/" and device


def test_the_state_file_records_the_run_that_the_line_names(tmp_path, engines):
    """The checkpoint case reads the run from the newest checkpoint's data/state.json."""
    root, run_dir = tmp_path / "ckpt", tmp_path / "run"
    save_run_checkpoint(root, 1, engines, run_state(run_dir, 4), KEEP_ALL)
    state = json.loads((root / "global_step_1" / "data" / "state.json").read_text())
    assert state["run"]["run_dir"] == str(run_dir)
    line = explain(OSError(errno.ENOSPC, ENOSPC_TEXT, f"{root}/global_step_2/.actor.partial/x"))
    assert line.endswith(f"continue with `ppoflow resume {run_dir}`")


# --- a real limit, end to end (slow) -------------------------------------------------------------

REPO = Path(__file__).resolve().parents[2]
FSIZE_HOOK = Path(__file__).resolve().parent / "fsize_limit"  # sitecustomize.py: the limit
#: the demo model's DeepSpeed model-state file is 3.8 MiB; MLflow's SQLite file, the largest
#: other file the trainer process writes, about 1 MiB
FSIZE_LIMIT = 2 * 2**20
RUN_TIMEOUT_S = 300


def child_env(home: Path, **extra: str) -> dict[str, str]:
    """The session's hermetic environment with this run's own Prefect home and MLflow store."""
    return {
        **os.environ,
        "PREFECT_HOME": str(home / "prefect-home"),
        "PREFECT_RESULTS_LOCAL_STORAGE_PATH": str(home / "prefect-results"),
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "120",
        "MLFLOW_TRACKING_URI": f"sqlite:///{home}/mlflow.db",
        "HF_HUB_OFFLINE": "1",
        "OMP_NUM_THREADS": "1",
        **extra,
    }


def run_cli(args: list[str], home: Path, **env: str) -> subprocess.CompletedProcess:
    """``python -m flows.cli ARGS`` in ``home``, its own session, to its end."""
    return subprocess.run(
        [sys.executable, "-m", "flows.cli", *args],
        cwd=home,
        env=child_env(home, **env),
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        start_new_session=True,
    )


def file_size_limit_works(tmp_path: Path) -> str | None:
    """None when a child process's RLIMIT_FSIZE makes a write past it fail with EFBIG; else why
    not (the test is skipped then)."""
    if not hasattr(resource, "RLIMIT_FSIZE"):
        return "resource.RLIMIT_FSIZE is not available on this platform"
    probe = (
        "import errno, resource\n"
        "resource.setrlimit(resource.RLIMIT_FSIZE, (4096, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))\n"
        "try:\n"
        f"    with open({str(tmp_path / 'probe')!r}, 'wb') as probe:\n"
        "        probe.write(bytes(8192))\n"
        "except OSError as err:\n"
        "    raise SystemExit(0 if err.errno == errno.EFBIG else 3)\n"
        "raise SystemExit(4)\n"
    )
    status = subprocess.run([sys.executable, "-c", probe], capture_output=True).returncode
    return None if status == 0 else f"a write past RLIMIT_FSIZE did not fail with EFBIG ({status})"


@pytest.mark.slow
def test_a_run_out_of_room_mid_run_says_so_and_resumes(
    tmp_path, make_demo_inputs, tiny_run_overrides
):
    """``ppoflow train`` (2 steps, a checkpoint after each) whose file-size limit drops to 2 MiB
    when the step-2 checkpoint starts (tests/flows/fsize_limit): exit 1 with the one line naming
    the DeepSpeed file, the step-1 checkpoint intact and nothing half-written; then, without
    the limit, ``ppoflow resume RUN`` runs step 2 and every journal is done."""
    reason = file_size_limit_works(tmp_path)
    if reason is not None:
        pytest.skip(reason)
    demo = make_demo_inputs(tmp_path / "demo")
    home, run, checkpoints = tmp_path / "home", tmp_path / "run", tmp_path / "home" / "ckpt"
    home.mkdir()
    overrides = tiny_run_overrides(
        demo, home, 2, "trainer.save_freq=1", "trainer.val_before_train=false",
        f"trainer.default_local_dir={checkpoints}",
    )  # fmt: skip
    limit = {
        "PYTHONPATH": os.pathsep.join(
            filter(None, [str(FSIZE_HOOK), os.environ.get("PYTHONPATH")])
        ),
        "PPOFLOW_FSIZE_AFTER": str(checkpoints / "global_step_2"),
        "PPOFLOW_FSIZE_LIMIT": str(FSIZE_LIMIT),
    }
    train = ["train", str(REPO / "configs" / "demo-cpu.yaml"), *overrides, "--run-dir", str(run)]
    failed = run_cli(train, home, **limit)
    output = failed.stdout + failed.stderr
    assert failed.returncode == 1, output[-3000:]
    last = failed.stderr.strip().splitlines()[-1]
    written = checkpoints / "global_step_2" / ".actor.partial" / "state"
    assert re.fullmatch(
        rf"error: file too large \(over the file-size limit `ulimit -f`, or the file system's "
        rf"largest file\) writing {re.escape(str(written))}/mp_rank_00_model_states\.pt "
        rf"\([^)]+ free on [^)]+, mounted at [^)]+\); raise the limit or free space, then "
        rf"continue with `ppoflow resume {re.escape(str(run))}`",
        last,
    ), output[-3000:]
    assert read_latest_step(checkpoints) == 1
    assert hidden_entries(checkpoints) == []
    assert hidden_entries(run) == [".lock"]  # the run lock's file, not a write left over
    verify_checkpoint(checkpoints, 1)

    resumed = run_cli(["resume", str(run)], home)  # the limit is gone: room again
    assert resumed.returncode == 0, (resumed.stdout + resumed.stderr)[-3000:]
    assert resumed.stdout.strip().splitlines()[-1] == str(run)
    store = RunStore(run)
    assert store.steps() == [1, 2]
    assert [store.read_journal(step).status for step in (1, 2)] == ["done", "done"]
    assert read_latest_step(checkpoints) == 2 and verify_checkpoint(checkpoints, 2).step == 2
