"""A training that fails or is stopped says so in one line: Prefect's own records of the failure
("Task run 'advantage-step1' - Finished in state Failed(…)", "Crash detected!") go to the run's
log file, not the terminal (flows/process/startup.py ``prefect_records_to``; issue 36).

Each test runs a tiny ``ppoflow train`` (the executable, with Prefect's temporary server started
ahead, as a user runs it) with stdout and stderr apart, and compares the whole of stderr.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from stages.engines.checkpoint import read_latest_step

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "configs" / "demo-cpu.yaml"
RUN_TIMEOUT_S = 600
POLL_S = 0.05
#: a plugin whose advantage estimator fails: a stage failure with no output of ppoflow's own
#: before it (a failing reward file logs a warning per sample first)
PLUGIN, ESTIMATOR = "ppoflow_failing_plugin", "fails_on_purpose"
PLUGIN_SOURCE = f'''
from stages.algos.advantages import register_adv_est


@register_adv_est("{ESTIMATOR}", group_based=True)
def fails(token_level_rewards, response_mask, *, index=None, config=None, **kwargs):
    raise RuntimeError("this estimator fails on purpose")
'''


def ppoflow(args: list[str], home: Path, pythonpath: Path | None = None) -> subprocess.Popen:
    """``ppoflow ARGS`` with no Prefect server configured (so the executable starts its
    temporary one), its own Prefect home and MLflow store; stdout and stderr in
    ``home/out.log`` and ``home/err.log``."""
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
    if pythonpath is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(pythonpath), env.get("PYTHONPATH")]))
    with open(home / "out.log", "wb") as out, open(home / "err.log", "wb") as err:
        return subprocess.Popen(
            [sys.executable, "-m", "flows", *args], cwd=home, env=env, stdout=out, stderr=err,
            start_new_session=True,
        )  # fmt: skip


def finish(process: subprocess.Popen) -> int:
    try:
        return process.wait(timeout=RUN_TIMEOUT_S)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def stderr_lines(home: Path) -> list[str]:
    return (home / "err.log").read_text(errors="replace").splitlines()


def test_a_failing_stage_is_one_line_and_prefects_record_is_in_the_runs_log(
    tmp_path, make_demo_inputs, tiny_run_overrides
):
    demo = make_demo_inputs(tmp_path / "demo")
    home, run, plugins = tmp_path / "home", tmp_path / "run", tmp_path / "plugins"
    home.mkdir()
    plugins.mkdir()
    (plugins / f"{PLUGIN}.py").write_text(PLUGIN_SOURCE, encoding="utf-8")
    overrides = tiny_run_overrides(
        demo, home, 2, "trainer.val_before_train=false", f"ppoflow.plugins=[{PLUGIN}]",
        f"algorithm.adv_estimator={ESTIMATOR}",
    )  # fmt: skip
    trainer = ppoflow(["train", str(CONFIG), *overrides, "--run-dir", str(run)], home, plugins)
    assert finish(trainer) == 1
    assert stderr_lines(home) == ["error: RuntimeError: this estimator fails on purpose"]
    log = (run / "ppoflow.log").read_text(errors="replace")
    assert "Task run 'advantage-step1' - Finished in state Failed(" in log
    assert "this estimator fails on purpose" in log
    assert "Task run" not in (home / "out.log").read_text(errors="replace")


def test_a_sigterm_prints_exactly_the_stop_line(tmp_path, make_demo_inputs, tiny_run_overrides):
    demo = make_demo_inputs(tmp_path / "demo")
    home, run = tmp_path / "home", tmp_path / "run"
    home.mkdir()
    overrides = tiny_run_overrides(
        demo, home, 400, "trainer.val_before_train=false", "trainer.save_freq=1"
    )  # still training when the signal comes
    trainer = ppoflow(["train", str(CONFIG), *overrides, "--run-dir", str(run)], home)
    try:
        deadline = time.monotonic() + RUN_TIMEOUT_S
        while read_latest_step(home / "checkpoints") is None:
            assert trainer.poll() is None, "\n".join(stderr_lines(home)[-30:])
            assert time.monotonic() < deadline, "no checkpoint in time"
            time.sleep(POLL_S)
        trainer.send_signal(signal.SIGTERM)
        assert finish(trainer) == 128 + signal.SIGTERM
    finally:
        if trainer.poll() is None:
            os.killpg(trainer.pid, signal.SIGKILL)
            trainer.wait()
    kept = read_latest_step(home / "checkpoints")
    assert stderr_lines(home) == [
        f"stopped by SIGTERM: the checkpoint of step {kept} is kept; "
        f"continue with `ppoflow resume {run}`"
    ]
