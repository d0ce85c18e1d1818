"""No process that a training starts outlives it, however the training process dies (issue 36).

A SIGKILL of the training process alone — what the OOM killer does — runs none of its handlers:
each process it started must notice by itself. A tiny ``ppoflow train`` (the executable, so
Prefect's temporary server and the MLflow process are started ahead as for a user) runs until
its first step is journaled; the test collects every descendant of the training process, checks
that the ones this guarantee is about are among them (Prefect's temporary server, the MLflow
process, the reward scorers' zygote and its worker), SIGKILLs the training process only, and
requires every descendant to be gone soon after: the server through its lifeline pipe
(flows/process/lifeline.py), the MLflow process at the end of its request pipe
(flows/sinks/mlflow_process.py), the zygote at the end of its socket and its workers with it
(stages/reward/zygote.py).
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

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 600  # the start on a busy 2-core machine, the server's database created
GONE_S = 10.0  # how long the descendants get to notice that the training process is gone
POLL_S = 0.05


def child_env(home: Path) -> dict[str, str]:
    """The session's hermetic environment (tests/conftest.py) with the run's own Prefect home
    and no Prefect server configured, so the executable starts its temporary server."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("PREFECT_API_URL", "PPOFLOW_TEMPORARY_PREFECT_API_URL")
    }
    env.update(
        PREFECT_HOME=str(home / "prefect-home"),
        PREFECT_RESULTS_LOCAL_STORAGE_PATH=str(home / "prefect-results"),
        MLFLOW_TRACKING_URI=f"sqlite:///{home}/mlflow.db",
        OMP_NUM_THREADS="1",
    )
    return env


def role(process: psutil.Process) -> str | None:
    """Which of the run's side processes ``process`` is, from its command line."""
    try:
        command = " ".join(process.cmdline())
    except psutil.Error:
        return None
    if "uvicorn" in command and "flows.process.prefect_server:create_app" in command:
        return "prefect-server"
    if "flows.sinks.mlflow_process" in command:
        return "mlflow"
    if "stages.reward.zygote" in command:
        return "reward"  # the zygote and its forked workers share the boot line
    return None


def alive(process: psutil.Process) -> bool:
    """Running and not a zombie (a zombie has exited; its parent, now init, reaps it)."""
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_a_sigkill_of_the_training_process_leaves_no_process_behind(
    tmp_path, make_demo_inputs, tiny_run_overrides
):
    demo = make_demo_inputs(tmp_path / "demo")
    home, run = tmp_path / "home", tmp_path / "run"
    home.mkdir()
    overrides = tiny_run_overrides(demo, home, 400, "trainer.val_before_train=false")
    # 400 steps: still training when the kill comes
    command = [sys.executable, "-m", "flows", "train", str(REPO / "configs" / "demo-cpu.yaml"),
               *overrides, "--run-dir", str(run)]  # fmt: skip
    with open(home / "output.log", "wb") as output:
        trainer = subprocess.Popen(
            command, cwd=home, env=child_env(home), stdout=output, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
    descendants: list[psutil.Process] = []
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not (run / "step_1" / "journal.json").exists():
            assert trainer.poll() is None, (home / "output.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "no step journaled in time"
            time.sleep(POLL_S)
        descendants = psutil.Process(trainer.pid).children(recursive=True)
        roles = sorted(filter(None, map(role, descendants)))
        assert roles.count("prefect-server") == 1 and roles.count("mlflow") == 1, roles
        assert roles.count("reward") >= 2, roles  # the zygote and at least one worker

        os.kill(trainer.pid, signal.SIGKILL)  # the training process only, not its group
        assert trainer.wait() == -signal.SIGKILL

        deadline = time.monotonic() + GONE_S
        while any(map(alive, descendants)) and time.monotonic() < deadline:
            time.sleep(POLL_S)
        left = [f"{p.pid} ({role(p) or p.name()})" for p in descendants if alive(p)]
        assert left == [], f"outlived the training process by {GONE_S:g} s: {left}"
    finally:
        if trainer.poll() is None:
            trainer.kill()
            trainer.wait()
        for process in descendants:
            if alive(process):
                process.kill()
