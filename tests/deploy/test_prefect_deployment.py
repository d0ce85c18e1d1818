"""The `demo` deployment of prefect.yaml, run for real: a local Prefect server and a process
worker, both started by this test on 127.0.0.1 and stopped at the end.

The commands are the ones docs/deployment.md gives (section 11, "Without Docker: the `demo`
deployment on a local Prefect server"), run with the venv's `prefect` from the repo root:

    prefect server start --host 127.0.0.1 --port PORT
    prefect work-pool create ppoflow-process --type process
    prefect --no-prompt deploy --name demo
    prefect deployment run 'ppo-train/demo' --param run_dir=… --param overrides=[…]
    prefect worker start --pool ppoflow-process --run-once

The worker starts in a scratch directory, not the repo, so the run finding its entrypoint proves
the deployment's pull step. The training run is tiny (1 step, 4 prompts × 2 samples, 8 tokens).

Every subprocess gets this test's environment with every ``PREFECT_*`` variable of the test
session removed (tests/conftest.py points PREFECT_HOME at the session's store, and the
session-wide ``prefect_harness`` server must not be used) and replaced by the test's own.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from flows.run_store import RunStore

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
PREFECT = [sys.executable, "-m", "prefect"]
POOL = "ppoflow-process"
TERMINAL = {"COMPLETED", "FAILED", "CRASHED", "CANCELLED"}
SERVER_START_S = 180  # the server's first start migrates its database and copies the UI
COMMAND_S = 300  # one CLI command (`deploy` imports the flow: torch, transformers, DeepSpeed)
RUN_S = 600  # the flow run, worker start-up included


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def prefect_env(home: Path, api_url: str) -> dict[str, str]:
    """This process's environment without its Prefect settings, plus a Prefect of our own."""
    env = {name: value for name, value in os.environ.items() if not name.startswith("PREFECT_")}
    env.update(
        PREFECT_HOME=str(home / "prefect-home"),
        PREFECT_API_URL=api_url,
        PREFECT_API_DATABASE_CONNECTION_URL=f"sqlite+aiosqlite:///{home / 'prefect.db'}",
        PREFECT_SERVER_ANALYTICS_ENABLED="false",
        PREFECT_CLI_PROMPT="false",
        PREFECT_CLI_COLORS="false",
        PREFECT_CLI_WRAP_LINES="false",
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
    )
    return env


def api_get(url: str) -> dict | None:
    """GET a JSON document; None while the server does not answer."""
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return json.loads(response.read())
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return None


def api_post(url: str, body: dict) -> list | dict:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())


def start(args: Sequence[str], env: dict[str, str], cwd: Path, log: Path) -> subprocess.Popen:
    """A background command in its own process group, stdout and stderr to ``log``."""
    with log.open("wb") as sink:
        return subprocess.Popen(
            list(args), cwd=cwd, env=env, stdout=sink, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip


def send(sig: signal.Signals, pid: int, members: Sequence[psutil.Process]) -> None:
    """``sig`` to process group ``pid`` and to each of ``members``, wherever they still live."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, sig)
    for member in members:
        with contextlib.suppress(psutil.NoSuchProcess):
            member.send_signal(sig)


def stop(process: subprocess.Popen) -> None:
    """Stop a background command, its process group and every descendant (a flow run may sit
    in a session of its own): SIGTERM, then SIGKILL what is left after 20 s."""
    try:
        family = [psutil.Process(process.pid), *psutil.Process(process.pid).children(True)]
    except psutil.NoSuchProcess:  # already reaped
        family = []
    send(signal.SIGTERM, process.pid, family)
    _, alive = psutil.wait_procs(family, timeout=20)
    send(signal.SIGKILL, process.pid, alive)
    process.wait(timeout=20)


def tail(log: Path, chars: int = 6000) -> str:
    return log.read_text(errors="replace")[-chars:] if log.exists() else "(no log)"


def prefect(*args: str, env: dict[str, str], cwd: Path = REPO) -> str:
    """Run a `prefect` CLI command to completion; its output, or a failure naming it."""
    done = subprocess.run(
        [*PREFECT, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=COMMAND_S
    )
    output = done.stdout + done.stderr
    if done.returncode != 0:
        pytest.fail(f"`prefect {' '.join(args)}` exited with {done.returncode}:\n{output[-6000:]}")
    return output


@dataclass
class LocalServer:
    """A Prefect server subprocess: its API URL, the environment of its clients, its log."""

    api_url: str
    env: dict[str, str]
    process: subprocess.Popen
    log: Path

    def wait_healthy(self) -> None:
        deadline = time.monotonic() + SERVER_START_S
        while api_get(f"{self.api_url}/health") is not True:
            if self.process.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"the Prefect server did not become healthy:\n{tail(self.log)}")
            time.sleep(1)


@pytest.fixture
def prefect_server(tmp_path: Path) -> Iterator[LocalServer]:
    """A Prefect server starting on a free loopback port, database in tmp_path (the test calls
    ``wait_healthy`` once it needs it, so the start-up overlaps the test's own set-up)."""
    port = free_port()
    api_url = f"http://127.0.0.1:{port}/api"
    env = prefect_env(tmp_path, api_url)
    log = tmp_path / "server.log"
    process = start(
        [*PREFECT, "server", "start", "--host", "127.0.0.1", "--port", str(port)],
        env, tmp_path, log,
    )  # fmt: skip
    try:
        yield LocalServer(api_url, env, process, log)
    finally:
        stop(process)


def tiny_overrides(demo: Path, tmp_path: Path) -> list[str]:
    """One step of 4 prompts × 2 samples of 8 tokens, no validation or checkpoint; the scorer
    and the reward workers in verl's legacy spellings (``custom_reward_function.path``,
    ``reward_model.num_workers``), as a verl user's deployment parameters would give them.

    File lists are given as single paths (``data.train_files=/a/train.parquet``): the
    `prefect deployment run` CLI prints the parameters as rich markup, and ``[/a/…]`` reads as a
    closing tag there (Prefect 3.9 then fails after creating the run)."""
    return [
        f"data.train_files={demo}/data/train.parquet",
        f"data.val_files={demo}/data/val.parquet",
        f"actor_rollout_ref.model.path={demo}/model",
        "data.train_batch_size=4",
        "data.max_response_length=8",
        "actor_rollout_ref.rollout.n=2",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
        "trainer.total_training_steps=1",
        "trainer.val_before_train=false",
        "trainer.test_freq=0",
        "trainer.save_freq=0",
        f"trainer.default_local_dir={tmp_path}/checkpoints",
        f"ppoflow.mlflow_tracking_uri=sqlite:///{tmp_path}/mlflow.db",
        f"custom_reward_function.path={write_scorer(tmp_path)}",
        "reward_model.num_workers=1",
    ]


def write_scorer(tmp_path: Path) -> Path:
    """A custom scorer: the response's length in characters, over 100."""
    path = tmp_path / "length_score.py"
    path.write_text(
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kw):\n"
        "    return len(solution_str) / 100\n",
        encoding="utf-8",
    )
    return path


def wait_for_end(api_url: str, flow_run_id: str, worker: subprocess.Popen, log: Path) -> dict:
    """Poll the flow run until its state is terminal; fail if the worker (``--run-once``) has
    exited without ending it or the run outlasts RUN_S."""
    deadline = time.monotonic() + RUN_S
    while True:
        worker_done = worker.poll() is not None  # before the read: a run it ran has ended
        run = api_get(f"{api_url}/flow_runs/{flow_run_id}")
        state = (run or {}).get("state") or {}
        if state.get("type") in TERMINAL:
            return run
        if worker_done:
            pytest.fail(
                f"the worker exited ({worker.returncode}) with flow run {flow_run_id} "
                f"{state.get('type')}:\n{tail(log)}"
            )
        if time.monotonic() > deadline:
            pytest.fail(f"flow run {flow_run_id} still {state.get('type')}:\n{tail(log)}")
        time.sleep(2)


def test_demo_deployment_runs_on_a_process_worker(
    prefect_server: LocalServer, tmp_path: Path, make_demo_inputs
):
    demo_inputs = make_demo_inputs(tmp_path / "demo")
    prefect_server.wait_healthy()
    api_url, env = prefect_server.api_url, prefect_server.env
    run_dir = tmp_path / "run"
    prefect("work-pool", "create", POOL, "--type", "process", env=env)
    deployed = prefect("--no-prompt", "deploy", "--name", "demo", env=env)
    assert "ppo-train/demo" in deployed

    created = prefect(
        "deployment", "run", "ppo-train/demo",
        "--param", f"run_dir={run_dir}",
        "--param", f"overrides={json.dumps(tiny_overrides(demo_inputs, tmp_path))}",
        env=env,
    )  # fmt: skip
    match = re.search(r"UUID: ([0-9a-f-]{36})", created)
    assert match, f"no flow run id in the output of `prefect deployment run`:\n{created}"
    flow_run_id = match.group(1)

    scratch = tmp_path / "worker-cwd"
    scratch.mkdir()
    log = tmp_path / "worker.log"
    worker = start([*PREFECT, "worker", "start", "--pool", POOL, "--run-once"], env, scratch, log)
    try:
        run = wait_for_end(api_url, flow_run_id, worker, log)
    finally:
        stop(worker)

    assert run["state"]["type"] == "COMPLETED", f"{run['state']}\n{tail(log)}"
    assert run["parameters"]["config"] == "demo-cpu"  # the deployment's default
    journal = RunStore(run_dir).read_journal(1)
    assert journal.status == "done"
    reward = RunStore(run_dir).load_config()["reward"]  # the legacy spellings were read
    assert reward["custom_reward_function"]["path"] == str(tmp_path / "length_score.py")
    assert reward["num_workers"] == 1
    assert journal.record("update_actor").status == "ran"
    reports = api_post(
        f"{api_url}/artifacts/filter", {"artifacts": {"flow_run_id": {"any_": [flow_run_id]}}}
    )
    assert len(reports) == 1, reports  # the step report of the one step
    assert (
        reports[0]["data"].startswith("### Step 1")
        and "| update_actor | ran |" in reports[0]["data"]
    )
