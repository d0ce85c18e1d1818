"""A training whose Prefect temporary server dies or stops answering stops with one line, and
resumes (flows/process/server_guard.py; issue 36).

A tiny ``ppoflow train`` (the executable: it starts the temporary server ahead) runs with a
checkpoint every step until its first checkpoint is written; then the server — only the server —
is killed (SIGKILL) or stopped (SIGSTOP). The training must end by itself with exit status 1 and
exactly one line on stderr naming Prefect's temporary server, what happened to it and the
``ppoflow resume RUN`` command, leave no process behind (a stopped server is killed, not left
stopped), and the run must resume to its end in the same MLflow run.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from mlflow.tracking import MlflowClient

from flows.process.server_guard import TIMEOUT_VAR
from flows.runs.store import RunStore
from stages.engines.checkpoint import read_latest_step

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "configs" / "demo-cpu.yaml"
START_TIMEOUT_S = 600  # the start on a busy 2-core machine, the server's database created
STOP_TIMEOUT_S = 120  # the training's own end after the loss: bounded, not timed
GONE_S = 10.0
POLL_S = 0.05


def child_env(home: Path, **extra: str) -> dict[str, str]:
    """The session's hermetic environment with the run's own Prefect home and MLflow store, and
    no Prefect server configured, so the executable starts its temporary server."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("PREFECT_API_URL", "PPOFLOW_TEMPORARY_PREFECT_API_URL", TIMEOUT_VAR)
    }
    env.update(
        PREFECT_HOME=str(home / "prefect-home"),
        PREFECT_RESULTS_LOCAL_STORAGE_PATH=str(home / "prefect-results"),
        MLFLOW_TRACKING_URI=f"sqlite:///{home}/mlflow.db",
        OMP_NUM_THREADS="1",
        **extra,
    )
    return env


def ppoflow(args: list[str], home: Path, name: str, **env: str) -> subprocess.Popen:
    """``ppoflow ARGS`` in its own session, stdout and stderr in ``home/<name>.out|.err``."""
    with open(home / f"{name}.out", "wb") as out, open(home / f"{name}.err", "wb") as err:
        return subprocess.Popen(
            [sys.executable, "-m", "flows", *args], cwd=home, env=child_env(home, **env),
            stdout=out, stderr=err, start_new_session=True,
        )  # fmt: skip


def text(home: Path, name: str) -> str:
    return (home / name).read_text(errors="replace")


def alive(process: psutil.Process) -> bool:
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def the_server(descendants: list[psutil.Process]) -> psutil.Process:
    (server,) = [
        p for p in descendants if "flows.process.prefect_server:create_app" in " ".join(p.cmdline())
    ]
    return server


def lose_the_server_mid_run(
    home: Path, run: Path, overrides: list[str], how: signal.Signals, **env: str
) -> tuple[subprocess.Popen, psutil.Process, list[psutil.Process]]:
    """Train until the first checkpoint, then send ``how`` to the temporary server alone; wait
    for the training to end. Returns the training, the server and every descendant."""
    trainer = ppoflow(
        ["train", str(CONFIG), *overrides, "--run-dir", str(run)], home, "train", **env
    )
    descendants: list[psutil.Process] = []
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while read_latest_step(home / "checkpoints") is None:
            assert trainer.poll() is None, text(home, "train.err")[-3000:]
            assert time.monotonic() < deadline, "no checkpoint in time"
            time.sleep(POLL_S)
        descendants = psutil.Process(trainer.pid).children(recursive=True)
        server = the_server(descendants)
        server.send_signal(how)
        try:
            trainer.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the training went on {STOP_TIMEOUT_S} s after its server got {how.name}")
        deadline = time.monotonic() + GONE_S
        while any(map(alive, descendants)) and time.monotonic() < deadline:
            time.sleep(POLL_S)
        assert [p.pid for p in descendants if alive(p)] == [], "processes were left behind"
        return trainer, server, descendants
    finally:
        if trainer.poll() is None:
            trainer.kill()
            trainer.wait()
        for process in descendants:
            if alive(process):
                process.send_signal(signal.SIGCONT)
                process.kill()


def mlflow_run(home: Path):
    client = MlflowClient(tracking_uri=f"sqlite:///{home}/mlflow.db")
    (run,) = client.search_runs([e.experiment_id for e in client.search_experiments()])
    return run


@pytest.fixture
def tiny(tmp_path, make_demo_inputs, tiny_run_overrides):
    """(home, run dir, the overrides of a 400-step run with a checkpoint every step)."""
    demo = make_demo_inputs(tmp_path / "demo")
    home = tmp_path / "home"
    home.mkdir()
    overrides = tiny_run_overrides(
        demo, home, 400, "trainer.val_before_train=false", "trainer.save_freq=1"
    )  # checkpoints in home/checkpoints
    return home, tmp_path / "run", overrides


def test_a_killed_server_stops_the_run_in_one_line_and_the_run_resumes(tiny):
    home, run, overrides = tiny
    trainer, server, _ = lose_the_server_mid_run(home, run, overrides, signal.SIGKILL)
    assert trainer.returncode == 1, text(home, "train.err")
    kept = read_latest_step(home / "checkpoints")
    assert text(home, "train.err").splitlines() == [
        f"error: Prefect's temporary server (pid {server.pid}) exited with status -9 (killed by "
        f"SIGKILL) during the run; the run stopped: the checkpoint of step {kept} is kept; "
        f"continue with `ppoflow resume {run}`"
    ]
    stopped = mlflow_run(home)
    assert stopped.info.status == "FAILED"  # the run's own end ran: its MLflow run is closed

    resume = ppoflow(
        ["resume", str(run), f"trainer.total_training_steps={kept + 1}"], home, "resume"
    )
    try:
        assert resume.wait(timeout=START_TIMEOUT_S) == 0, text(home, "resume.err")[-3000:]
    finally:
        if resume.poll() is None:
            resume.kill()
            resume.wait()
    assert text(home, "resume.out").splitlines()[-1] == str(run)
    assert RunStore(run).read_journal(kept + 1).status == "done"
    resumed = mlflow_run(home)
    assert resumed.info.run_id == stopped.info.run_id and resumed.info.status == "FINISHED"


def test_a_stopped_server_is_waited_for_up_to_the_bound_then_killed_in_one_line(tiny):
    home, run, overrides = tiny
    trainer, server, _ = lose_the_server_mid_run(
        home, run, overrides, signal.SIGSTOP, **{TIMEOUT_VAR: "3"}
    )
    assert trainer.returncode == 1, text(home, "train.err")
    kept = read_latest_step(home / "checkpoints")
    assert text(home, "train.err").splitlines() == [
        f"error: Prefect's temporary server (pid {server.pid}) did not answer its health check "
        f"for 3 s ({TIMEOUT_VAR}) and was killed during the run; the run stopped: the checkpoint "
        f"of step {kept} is kept; continue with `ppoflow resume {run}` (on a loaded machine "
        f"export a larger {TIMEOUT_VAR})"
    ]
    assert not alive(server)  # killed, not left stopped
