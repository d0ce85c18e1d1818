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
the deployment's pull step. The training run is tiny (2 steps of 4 prompts × 2 samples of 8
tokens, validation at step 2). What the UI shows is read back from the server's API: every
step's stage task runs (``<stage>-step<k>``) in the training flow run, with no flow run per step
(flows/step_flow.py says why), one keyed markdown report per step (with the validation score at
step 2 and the run directory), the progress and validation lines in the flow run's logs, and
ppoflow's first log line seconds after the run began. The test prints the times from
`prefect deployment run` to the first log lines (docs/deployment.md records them).

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
from datetime import datetime
from pathlib import Path

import psutil
import pytest

from flows.runs.store import RunStore
from flows.sinks.step_report import report_key

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
PREFECT = [sys.executable, "-m", "prefect"]
POOL = "ppoflow-process"
TERMINAL = {"COMPLETED", "FAILED", "CRASHED", "CANCELLED"}
SERVER_START_S = 180  # the server's first start migrates its database and copies the UI
COMMAND_S = 300  # one CLI command (`deploy` imports the flow: torch, transformers, DeepSpeed)
RUN_S = 600  # the flow run, worker start-up included
STEPS = 2
FIRST_LINE = "ppoflow: loading config"
#: at most this long from the flow run's "Beginning flow run" line to ppoflow's first line
FIRST_LINE_S = 10


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
    """Two steps of 4 prompts × 2 samples of 8 tokens, validation at the last step only, no
    checkpoint; the scorer and the reward workers in verl's legacy spellings (``custom_reward_function.path``,
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
        f"trainer.total_training_steps={STEPS}",
        "trainer.val_before_train=false",
        f"trainer.test_freq={STEPS}",
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


def api_filter(api_url: str, what: str, body: dict) -> list[dict]:
    """``POST /<what>/filter`` (flow_runs, task_runs, artifacts, logs) → the matching records."""
    return api_post(f"{api_url}/{what}/filter", body)


def flow_run_logs(api_url: str, *flow_run_ids: str, tasks: bool = False) -> list[dict]:
    """The flow runs' log records, oldest first: their own lines, or with ``tasks`` only their
    task runs' lines (a subflow run's lines belong to the subflow run, not to its parent)."""
    logs = api_filter(
        api_url,
        "logs",
        {"logs": {"flow_run_id": {"any_": list(flow_run_ids)}}, "sort": "TIMESTAMP_ASC"},
    )
    return [log for log in logs if (log["task_run_id"] is not None) == tasks]


def seconds_after(start: float, log: dict) -> float:
    """Seconds from the Unix time ``start`` to a log record's timestamp."""
    return datetime.fromisoformat(log["timestamp"]).timestamp() - start


def first(logs: list[dict], prefix: str) -> dict:
    found = [log for log in logs if log["message"].startswith(prefix)]
    assert found, f"no log line starting {prefix!r} in {[log['message'] for log in logs]}"
    return found[0]


def child_runs(api_url: str, flow_run_id: str) -> list[dict]:
    """The flow run's child flow runs (subflow runs)."""
    body = {"flow_runs": {"parent_flow_run_id": {"any_": [flow_run_id]}}}
    return api_filter(api_url, "flow_runs", body)


def task_run_names(api_url: str, flow_run_id: str, expected: set[str]) -> set[str]:
    """Names of a flow run's task runs, once they include ``expected`` or after 30 s (the
    server records task runs from their events, a little after they ran)."""
    body = {"task_runs": {"flow_run_id": {"any_": [flow_run_id]}}}
    deadline = time.monotonic() + 30
    while True:
        names = {task["name"] for task in api_filter(api_url, "task_runs", body)}
        if expected <= names or time.monotonic() > deadline:
            return names
        time.sleep(1)


def wait_for_end(api_url: str, flow_run_id: str, worker: subprocess.Popen, log: Path) -> dict:
    """Poll the flow run until its state is terminal, then wait for the worker (``--run-once``)
    to exit by itself: the flow run's process sets the final state before it exits, and sends
    its last log lines on its way out (a worker stopped at once kills it mid-send, and a short
    run's progress lines never reach the server). Fail if the worker exited without ending the
    run, or the run outlasts RUN_S."""
    deadline = time.monotonic() + RUN_S
    while True:
        worker_done = worker.poll() is not None  # before the read: a run it ran has ended
        run = api_get(f"{api_url}/flow_runs/{flow_run_id}")
        state = (run or {}).get("state") or {}
        if state.get("type") in TERMINAL:
            try:
                worker.wait(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pytest.fail(f"the worker did not exit after flow run {flow_run_id}:\n{tail(log)}")
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

    requested = time.time()
    overrides = tiny_overrides(demo_inputs, tmp_path)
    created = prefect(
        "deployment", "run", "ppo-train/demo",
        "--param", f"run_dir={run_dir}",
        "--param", f"overrides={json.dumps(overrides)}",
        env=env,
    )  # fmt: skip
    match = re.search(r"UUID: ([0-9a-f-]{36})", created)
    assert match, f"no flow run id in the output of `prefect deployment run`:\n{created}"
    flow_run_id = match.group(1)

    scratch = tmp_path / "worker-cwd"
    scratch.mkdir()
    log = tmp_path / "worker.log"
    worker_started = time.time()
    worker = start([*PREFECT, "worker", "start", "--pool", POOL, "--run-once"], env, scratch, log)
    try:
        run = wait_for_end(api_url, flow_run_id, worker, log)
    finally:
        stop(worker)

    assert run["state"]["type"] == "COMPLETED", f"{run['state']}\n{tail(log)}"
    assert run["parameters"]["config"] == "demo-cpu"  # the deployment's default
    for step in range(1, STEPS + 1):
        journal = RunStore(run_dir).read_journal(step)
        assert journal.status == "done" and journal.record("update_actor").status == "ran"
    reward = RunStore(run_dir).load_config()["reward"]  # the legacy spellings were read
    assert reward["custom_reward_function"]["path"] == str(tmp_path / "length_score.py")
    assert reward["num_workers"] == 1
    assert_step_tasks(api_url, flow_run_id)
    assert_step_reports(api_url, flow_run_id, str(run_dir))
    logs = flow_run_logs(api_url, flow_run_id)
    assert_progress_logged(logs)
    assert (
        first(logs, FIRST_LINE)["message"] == f"{FIRST_LINE} demo-cpu + {len(overrides)} overrides"
    )
    first_task_line = flow_run_logs(api_url, flow_run_id, tasks=True)[0]
    report_first_lines(logs, first_task_line, requested, worker_started)


def assert_step_tasks(api_url: str, flow_run_id: str) -> None:
    """Every step's stage task runs, named by step, in the training flow run; no subflow runs."""
    stages = ("rollout", "reward", "old_log_prob", "advantage", "update_actor")
    expected = {f"{stage}-step{k}" for stage in stages for k in range(1, STEPS + 1)}
    names = task_run_names(api_url, flow_run_id, expected)
    assert expected <= names, names
    assert child_runs(api_url, flow_run_id) == []


def assert_step_reports(api_url: str, flow_run_id: str, run_dir: str) -> None:
    """One keyed markdown report per step in the training flow run; the last one validated."""
    reports = api_filter(
        api_url, "artifacts", {"artifacts": {"flow_run_id": {"any_": [flow_run_id]}}}
    )
    tag = flow_run_id.replace("-", "")[:8]
    by_key = {report["key"]: report for report in reports}
    expected = [report_key("grpo-tiny", tag, k) for k in range(1, STEPS + 1)]
    assert sorted(by_key) == sorted(expected), reports
    assert len(reports) == STEPS
    for k in range(1, STEPS + 1):
        data = by_key[report_key("grpo-tiny", tag, k)]["data"]
        assert data.startswith(f"### Step {k}") and "| update_actor | ran |" in data
        assert f"- run directory: `{run_dir}`" in data
        assert ("- validation score: **" in data) == (k == STEPS), data


def assert_progress_logged(logs: list[dict]) -> None:
    """The progress line of every step and the validation line, in the flow run's logs."""
    messages = [log["message"] for log in logs]
    for k in range(1, STEPS + 1):
        assert any(m.startswith(f"step {k}/{STEPS} │ score ") for m in messages), messages
    assert any(m.startswith(f"validation @ step {STEPS}: score ") for m in messages), messages
    assert any(m.startswith("ppoflow train: wall time") for m in messages), messages


def report_first_lines(
    logs: list[dict], first_task_line: dict, requested: float, worker_started: float
) -> None:
    """ppoflow's first line comes within FIRST_LINE_S of the run's start; print the times.

    ``first_task_line`` is the first stage task's "Finished in state" line: before the flow
    logged lines of its own, the first thing after Prefect's start-up lines that a run showed."""
    began = first(logs, "Beginning flow run")
    pulled = first(logs, "Running 1 deployment pull step")
    ours = first(logs, FIRST_LINE)
    since_begin = seconds_after(0, ours) - seconds_after(0, began)
    assert since_begin < FIRST_LINE_S, since_begin
    print(
        "\nfirst log lines, seconds after `prefect deployment run`: "
        f"worker started {worker_started - requested:.1f}, "
        f"first line ({logs[0]['message'][:40]!r}) {seconds_after(requested, logs[0]):.1f}, "
        f"pull step {seconds_after(requested, pulled):.1f}, "
        f"'Beginning flow run' {seconds_after(requested, began):.1f}, "
        f"{FIRST_LINE!r} {seconds_after(requested, ours):.1f}, "
        f"first stage task line {seconds_after(requested, first_task_line):.1f} "
        f"(flow module import ≈ pull step → Beginning: "
        f"{seconds_after(0, began) - seconds_after(0, pulled):.1f} s)"
    )
    ours = ("ppoflow", "step ", "validation ")
    print("\n".join(log["message"] for log in logs if log["message"].startswith(ours)))
