"""Start-up bounds reach the libraries before they read their settings (flows/process/service_waits.py),
a bound that is hit is one line naming its setting, and a training starts on a loaded machine."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import typer

from flows.cli.train import fail_in_one_line
from flows.process.service_waits import PREFECT_STARTUP

REPO = Path(__file__).resolve().parents[2]
READ_TIMEOUT = (
    "from flows.process.own_process import prepare_own_process; prepare_own_process(); "
    "from prefect.settings import get_current_settings; "
    "print(get_current_settings().server.ephemeral.startup_timeout_seconds)"
)


def prefect_sees(env: dict[str, str]) -> str:
    done = subprocess.run(
        [sys.executable, "-c", READ_TIMEOUT], env=env, cwd=REPO, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_prefect_reads_ppoflows_startup_bound_and_the_users_own():
    env = {k: v for k, v in os.environ.items() if k != PREFECT_STARTUP}
    assert prefect_sees(env) == "120"  # Prefect's own default is 20
    assert prefect_sees({**env, PREFECT_STARTUP: "45"}) == "45"


def test_a_prefect_startup_timeout_is_one_line_naming_the_setting(capsys):
    err = RuntimeError(
        "Timed out while attempting to connect to ephemeral Prefect API server. "
        "stdout: lots\nof\nserver output"
    )
    exit_ = fail_in_one_line(err, verbose=False)
    assert isinstance(exit_, typer.Exit) and exit_.exit_code == 1
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("error: Prefect's temporary server did not answer within ")
    assert PREFECT_STARTUP in line and "PREFECT_API_URL" in line


@pytest.mark.slow
def test_training_starts_while_other_processes_load_every_core(
    tmp_path, make_demo_inputs, tiny_run_overrides
):
    demo = make_demo_inputs(tmp_path / "demo")
    hogs = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"])
        for _ in range(os.cpu_count() or 1)
    ]
    try:
        env = {k: v for k, v in os.environ.items() if k != PREFECT_STARTUP}
        env.update(PREFECT_HOME=str(tmp_path / "prefect-home"), OMP_NUM_THREADS="1")
        command = [
            sys.executable, "-m", "flows", "train", str(REPO / "configs" / "demo-cpu.yaml"),
            *tiny_run_overrides(demo, tmp_path, 2), "--run-dir", str(tmp_path / "run"),
        ]  # fmt: skip
        done = subprocess.run(
            command, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=900
        )
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    assert done.stdout.splitlines()[-1] == str(tmp_path / "run")
    assert "(started ahead)" in done.stdout  # the `ppoflow` executable's path: flows/cli/entry.py
