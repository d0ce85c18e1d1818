"""Training runs against a real MLflow tracking server on loopback (issue 17), read back with
MlflowClient:

- run A (in this process, 2 steps, validation at step 2) and run B (a ``ppoflow train`` process,
  4 steps, a checkpoint every 2) are two runs of one experiment (``trainer.project_name``);
- B is SIGKILLed (its whole process group) as soon as its step-2 checkpoint is complete — the
  moment a kill can lose the checkpointed step's metrics, which are published after the
  checkpoint — and continued with ``ppoflow resume``: it stays ONE MLflow run (the id in its
  run_info.json does not change), FINISHED, tagged ``ppoflow.resumed_from_step`` 2, whose every
  metric has each step exactly once;
- A carries the version / commit / run dir / config digest tags, a description with each
  metric's meaning, ``ppoflow/cache_hits`` per step and its validation generations as an MLflow
  table;
- a ``ppoflow rerun`` branch of A's step 2 is an MLflow run tagged with its parent (run dir, run
  id, ``mlflow.parentRunId``) holding the step's metrics and the diff table.

The server: ``mlflow server --backend-store-uri sqlite:///… --default-artifact-root …`` on a free
loopback port, one worker, telemetry off (``MLFLOW_DISABLE_TELEMETRY=true``, ``DO_NOT_TRACK=true``;
MLflow reads both), started as its own process group and stopped in a ``finally``. Everything
else lives under ``tmp_path``; no process may be left running.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient
from typer.testing import CliRunner

from flows.runs.identity import CACHE_HITS, config_digest
from flows.runs.store import RunStore
from flows.version import ppoflow_version
from stages.engines.checkpoint import read_latest_step

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "configs" / "demo-cpu.yaml"
QUIET = {"MLFLOW_DISABLE_TELEMETRY": "true", "DO_NOT_TRACK": "true"}
SERVER_START_S = 240  # the server's first start creates its database (~40 s on a busy machine)
RUN_TIMEOUT_S = 600
POLL_S = 0.05
KILLED_AFTER, STEPS = 2, 4


# --- processes -----------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def tail(path: Path, lines: int = 30) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


def stop_group(process: subprocess.Popen, grace_s: float = 20.0) -> None:
    """SIGTERM the process group led by ``process``, SIGKILL what is left after ``grace_s``."""
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        with suppress(subprocess.TimeoutExpired):
            process.wait(timeout=grace_s)
    with suppress(ProcessLookupError):  # workers of a leader that already exited
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()


@contextmanager
def mlflow_server(root: Path) -> Iterator[str]:
    """A tracking server with its SQLite store and artifacts under ``root``; yields its URL."""
    root.mkdir(parents=True, exist_ok=True)
    url = f"http://127.0.0.1:{free_port()}"
    command = [
        str(Path(sys.executable).parent / "mlflow"),
        "server",
        "--host", "127.0.0.1",
        "--port", url.rsplit(":", 1)[1],
        "--workers", "1",
        "--backend-store-uri", f"sqlite:///{root}/mlflow.db",
        "--default-artifact-root", str(root / "artifacts"),
    ]  # fmt: skip
    with open(root / "server.log", "wb") as log:
        server = subprocess.Popen(
            command,
            cwd=root,
            env={**os.environ, **QUIET},
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + SERVER_START_S
        while not healthy(url):
            if server.poll() is not None:
                pytest.fail(
                    f"mlflow server exited {server.returncode}:\n{tail(root / 'server.log')}"
                )
            if time.monotonic() > deadline:
                pytest.fail(f"mlflow server not healthy in {SERVER_START_S} s")
            time.sleep(0.5)
        yield url
    finally:
        stop_group(server)


def healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=2) as answer:
            return answer.status == 200
    except OSError:
        return False


def child_env(home: Path) -> dict[str, str]:
    """This session's hermetic environment with the process's own Prefect home."""
    return {
        **os.environ,
        **QUIET,
        "PREFECT_HOME": str(home / "prefect-home"),
        "PREFECT_RESULTS_LOCAL_STORAGE_PATH": str(home / "prefect-results"),
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "120",
        "HF_HUB_OFFLINE": "1",
        "OMP_NUM_THREADS": "1",
    }


@contextmanager
def ppoflow(args: list[str], home: Path) -> Iterator[subprocess.Popen]:
    """``ppoflow ARGS`` as a process group (cwd ``home``, output in ``home/<command>.log``);
    whatever of the group still runs at the end is killed."""
    home.mkdir(parents=True, exist_ok=True)
    with open(home / f"{args[0]}.log", "wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "flows.cli", *args],
            cwd=home,
            env=child_env(home),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        yield process
    finally:
        if process.poll() is None or process.returncode == -signal.SIGKILL:
            with suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def run_to_end(args: list[str], home: Path) -> str:
    """Run ``ppoflow ARGS`` to exit 0; its last output line."""
    with ppoflow(args, home) as process:
        try:
            status = process.wait(timeout=RUN_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            pytest.fail(f"ppoflow {args[0]} ran over {RUN_TIMEOUT_S} s")
        assert status == 0, f"ppoflow {args[0]} exited {status}:\n{tail(home / f'{args[0]}.log')}"
    return (home / f"{args[0]}.log").read_text().splitlines()[-1]


def train_until_killed(args: list[str], home: Path, checkpoints: Path) -> None:
    """Run ``ppoflow train`` until its step-KILLED_AFTER checkpoint is complete (the tracker
    written), then SIGKILL its process group."""
    with ppoflow(args, home) as process:
        deadline = time.monotonic() + RUN_TIMEOUT_S
        while read_latest_step(checkpoints) != KILLED_AFTER:
            if process.poll() is not None:
                pytest.fail(f"train exited {process.returncode}:\n{tail(home / 'train.log')}")
            if time.monotonic() > deadline:
                pytest.fail(f"no step-{KILLED_AFTER} checkpoint in {RUN_TIMEOUT_S} s")
            time.sleep(POLL_S)
        os.killpg(process.pid, signal.SIGKILL)
        assert process.wait() == -signal.SIGKILL


# --- reading the server back ---------------------------------------------------------------------


def steps_per_metric(client: MlflowClient, run_id: str) -> dict[str, list[int]]:
    """metric → the steps of its history, in order of logging."""
    run = client.get_run(run_id)
    return {
        name: [point.step for point in client.get_metric_history(run_id, name)]
        for name in run.data.metrics
    }


# --- the test ------------------------------------------------------------------------------------


@pytest.mark.usefixtures("prefect_harness")
def test_runs_resumes_and_branches_on_a_real_mlflow_server(
    tmp_path, make_demo_inputs, tiny_run_overrides, monkeypatch
):
    from flows.cli.app import app
    from flows.train import train

    for name, value in QUIET.items():
        monkeypatch.setenv(name, value)
    demo = make_demo_inputs(tmp_path / "demo", n_train=16, n_val=4)
    with mlflow_server(tmp_path / "server") as url:
        client = MlflowClient(url)
        common = (f"ppoflow.mlflow_tracking_uri={url}", "trainer.val_before_train=false")

        # run A, in this process: 2 steps, validation (2 generations) at step 2
        a_dir = tmp_path / "a" / "run"
        a_overrides = tiny_run_overrides(
            demo, tmp_path / "a", 2, *common, "trainer.save_freq=0", "trainer.log_val_generations=2"
        )
        a = train(CONFIG, a_overrides, str(a_dir))

        # run B: killed right after its step-2 checkpoint, then `ppoflow resume` in place
        b_home = tmp_path / "b"
        b_dir, checkpoints = b_home / "run", b_home / "checkpoints"
        b_overrides = tiny_run_overrides(demo, b_home, STEPS, *common, "trainer.save_freq=2")
        train_until_killed(
            ["train", str(CONFIG), *b_overrides, "--run-dir", str(b_dir)], b_home, checkpoints
        )
        b_id = RunStore(b_dir).load_run_info()["mlflow_run_id"]
        held_at_kill = {p.step for p in client.get_metric_history(b_id, "training/global_step")}
        assert held_at_kill <= {1, 2, 3}, held_at_kill
        assert run_to_end(["resume", str(b_dir)], b_home / "resume") == str(b_dir)

        # a re-run branch of A's step 2 (no model work: advantage only, another estimator)
        branch_dir = tmp_path / "a" / "branch"
        rerun = CliRunner().invoke(
            app,
            ["rerun", str(a_dir), "--step", "2", "--from", "advantage", "--to", "advantage",
             "algorithm.adv_estimator=rloo", "--run-dir", str(branch_dir)],
        )  # fmt: skip
        assert rerun.exit_code == 0, rerun.output
        assert rerun.output.splitlines()[-1] == str(branch_dir)

        # -- two runs (and the branch) in one experiment
        experiment = client.get_experiment_by_name("ppoflow-demo")
        runs = {r.info.run_id: r for r in client.search_runs([experiment.experiment_id])}
        info_b = RunStore(b_dir).load_run_info()
        branch_id = RunStore(branch_dir).load_run_info()["mlflow_run_id"]
        assert set(runs) == {a.mlflow_run_id, b_id, branch_id}
        assert info_b["mlflow_run_id"] == b_id and info_b["resumed_from_step"] == KILLED_AFTER

        # -- B: one run, FINISHED, every metric's every step exactly once
        run_b = runs[b_id]
        assert run_b.info.status == "FINISHED"
        assert run_b.data.tags["ppoflow.resumed_from_step"] == str(KILLED_AFTER)
        history = steps_per_metric(client, b_id)
        assert sorted(history["training/global_step"]) == list(range(1, STEPS + 1))
        repeated = {name: steps for name, steps in history.items() if len(steps) != len(set(steps))}
        assert repeated == {}, f"steps logged twice (held at the kill: {held_at_kill})"
        assert all(sorted(history[name]) == [1, 2, 3, 4] for name in ("actor/pg_loss", CACHE_HITS))
        assert run_b.data.tags["ppoflow.run_dir"] == str(b_dir)

        # -- A: tags, description, cache hits, the validation table
        run_a = runs[a.mlflow_run_id]
        tags = run_a.data.tags
        assert tags["ppoflow.version"] == ppoflow_version() and tags["ppoflow.commit"]
        assert tags["ppoflow.run_dir"] == str(a_dir)
        assert tags["ppoflow.config_digest"] == config_digest(RunStore(a_dir).load_config())
        assert "`critic/score/mean`" in tags["mlflow.note.content"].split("| metric |", 1)[1]
        assert [p.step for p in client.get_metric_history(a.mlflow_run_id, CACHE_HITS)] == [1, 2]
        tables = json.loads(tags["mlflow.loggedArtifacts"])
        assert sorted(t["path"] for t in tables) == [
            "train_generations/step_000001.json",  # ppoflow.log_train_generations: step 1 and
            "train_generations/step_000002.json",  # the last
            "val_generations/step_000002.json",
        ]
        assert {t["type"] for t in tables} == {"table"}
        local = client.download_artifacts(
            a.mlflow_run_id, "val_generations/step_000002.json", str(tmp_path / "downloaded")
        )
        table = json.loads(Path(local).read_text())
        assert len(table["data"]) == 2 and "output" in table["columns"]

        # -- the branch: nested under A, the step's metrics at step 2, the diff table
        branch = runs[branch_id]
        assert branch.data.tags["mlflow.parentRunId"] == a.mlflow_run_id
        assert branch.data.tags["ppoflow.parent_mlflow_run_id"] == a.mlflow_run_id
        assert branch.data.tags["ppoflow.parent_run_dir"] == str(a_dir)
        advantages = client.get_metric_history(branch_id, "critic/advantages/mean")
        assert [p.step for p in advantages] == [2]
        assert "metric_diff.json" in {item.path for item in client.list_artifacts(branch_id)}
