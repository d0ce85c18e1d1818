"""Resume after a real ``kill -9`` (issue 7, test 5): same weights and metrics as no interruption.

Three ``ppoflow train`` processes on the tiny model and the demo task (4 prompts × n 2, 8
response tokens), 4 steps, a checkpoint every 2 steps, final validation at step 4:

- uninterrupted: steps 1–4 in one process;
- killed: a fresh run, SIGKILLed (the whole process group: the CLI, Prefect's temporary server,
  any worker) as soon as ``latest_checkpointed_iteration.txt`` says 2, i.e. somewhere in steps
  3–4, before the step-4 checkpoint;
- resumed: ``trainer.resume_mode=auto`` on the killed run's checkpoint folder runs steps 3–4.

The resumed run must end with the uninterrupted run's actor weights (bit for bit) and log the same
metrics for steps 3 and 4 (timings excepted). It logs to its own MLflow store, so the checkpoint's
MLflow run (in the killed process's store) is not continued: a new run starts, with steps 1–2
replayed from the killed run's journals and checkpoint, so it too holds steps 1–4 as the
uninterrupted run does (tests/flows/test_mlflow_server.py continues the same run in one store). Each process has its own Prefect home (its
temporary server's database), MLflow SQLite file, run directory and working directory, all under
``tmp_path``; no process of any of the three groups may be left running.
"""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch
from mlflow.tracking import MlflowClient

from dataproto.artifact import load_artifact
from flows.runs.store import RunStore
from stages.engines.checkpoint import checkpoint_dir, read_latest_step

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
STEPS = 4
SAVE_FREQ = 2  # checkpoints after steps 2 and 4: the kill lands in the two steps between
KILLED_AFTER = 2
RUN_TIMEOUT_S = 900  # a run is ~30 s of start-up and a few seconds of steps on a quiet machine
POLL_S = 0.05
#: metrics that measure wall time, so differ between any two runs
TIME_DEPENDENT = (
    "timing_s/",
    "timing_per_token_ms/",
    "perf/throughput",
    "perf/time_per_step",
    "reward/time_s",
    "system/",  # MLflow's system metrics: sampled every 10 s of wall time
)


# --- processes -----------------------------------------------------------------------------------


def train_command(
    tiny_run_overrides, demo: Path, home: Path, checkpoints: Path, *extra: str
) -> list[str]:
    """``ppoflow train`` of the tiny run (tests/conftest.py) for STEPS steps, a checkpoint every
    SAVE_FREQ steps in ``checkpoints``: run directory under ``home/runs``, MLflow in
    ``home/mlflow.db``."""
    return [
        sys.executable,
        "-m",
        "flows.cli",
        "train",
        str(REPO / "configs" / "demo-cpu.yaml"),
        *tiny_run_overrides(
            demo,
            home,
            STEPS,
            f"trainer.save_freq={SAVE_FREQ}",
            "trainer.val_before_train=false",
            f"trainer.default_local_dir={checkpoints}",
            f"ppoflow.artifact_dir={home}/runs",
            *extra,
        ),
    ]


def child_env(home: Path) -> dict[str, str]:
    """The test session's hermetic environment (tests/conftest.py), with this process's own
    Prefect home and MLflow store, one CPU thread and no network."""
    return {
        **os.environ,
        "PREFECT_HOME": str(home / "prefect-home"),
        "PREFECT_RESULTS_LOCAL_STORAGE_PATH": str(home / "prefect-results"),
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        # the temporary server's first start creates its database: over the default 20 s on a
        # busy 2-core machine
        "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "120",
        "MLFLOW_TRACKING_URI": f"sqlite:///{home}/mlflow.db",
        "HF_HUB_OFFLINE": "1",
        "OMP_NUM_THREADS": "1",
    }


@contextmanager
def process_group(command: list[str], home: Path, groups) -> Iterator[subprocess.Popen]:
    """Start ``command`` as the leader of a new process group (cwd ``home``, output in
    ``home/output.log``); on the way out SIGKILL whatever of the group still runs. ``groups``:
    the ``process_groups`` fixture (tests/flows/conftest.py)."""
    home.mkdir(parents=True, exist_ok=True)
    with open(home / "output.log", "wb") as log:
        process = subprocess.Popen(
            command,
            cwd=home,
            env=child_env(home),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        yield process
    finally:
        if groups.live_members(process.pid):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        groups.wait_until_gone(process.pid)


def output_tail(home: Path, lines: int = 30) -> str:
    return "\n".join((home / "output.log").read_text(errors="replace").splitlines()[-lines:])


def train_to_end(command: list[str], home: Path, groups) -> None:
    """Run ``command`` to its end; it must exit 0 and leave no process behind."""
    with process_group(command, home, groups) as process:
        try:
            status = process.wait(timeout=RUN_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            pytest.fail(f"ppoflow train ran over {RUN_TIMEOUT_S} s:\n{output_tail(home)}")
        assert status == 0, f"ppoflow train exited {status}:\n{output_tail(home)}"
        assert groups.wait_until_gone(process.pid) == [], "ppoflow train left processes running"


def train_until_killed(command: list[str], home: Path, checkpoints: Path, groups) -> None:
    """Run ``command`` until the checkpoint of step KILLED_AFTER is complete (its tracker
    written), then SIGKILL the whole process group."""
    with process_group(command, home, groups) as process:
        deadline = time.monotonic() + RUN_TIMEOUT_S
        while read_latest_step(checkpoints) != KILLED_AFTER:
            if process.poll() is not None:
                pytest.fail(
                    f"ppoflow train exited ({process.returncode}) before it was killed; latest "
                    f"checkpoint {read_latest_step(checkpoints)}:\n{output_tail(home)}"
                )
            if time.monotonic() > deadline:
                pytest.fail(f"no step-{KILLED_AFTER} checkpoint in {RUN_TIMEOUT_S} s")
            time.sleep(POLL_S)
        os.killpg(process.pid, signal.SIGKILL)
        assert process.wait() == -signal.SIGKILL
        assert groups.wait_until_gone(process.pid) == [], (
            "processes survived SIGKILL of their group"
        )


# --- what the runs left --------------------------------------------------------------------------


def actor_weights(checkpoints: Path, step: int) -> dict[str, torch.Tensor]:
    """The actor's parameters in the DeepSpeed checkpoint of ``step`` (ZeRO 0, one rank)."""
    states = checkpoint_dir(checkpoints, step, "actor") / "state" / "mp_rank_00_model_states.pt"
    return torch.load(states, map_location="cpu", weights_only=False)["module"]


def logged_metrics(home: Path) -> dict[int, dict[str, float]]:
    """step → {metric: value} of the one MLflow run in ``home/mlflow.db``, timings left out."""
    client = MlflowClient(tracking_uri=f"sqlite:///{home}/mlflow.db")
    experiments = [e.experiment_id for e in client.search_experiments()]
    (run,) = client.search_runs(experiments)
    assert run.info.status == "FINISHED"
    by_step: dict[int, dict[str, float]] = {}
    for name in run.data.metrics:
        if name.startswith(TIME_DEPENDENT):
            continue
        for point in client.get_metric_history(run.info.run_id, name):
            by_step.setdefault(point.step, {})[name] = point.value
    return by_step


def run_dir(home: Path) -> RunStore:
    (root,) = (home / "runs").iterdir()
    return RunStore(root)


# --- the test ------------------------------------------------------------------------------------


def test_killed_and_resumed_run_ends_like_an_uninterrupted_one(
    tmp_path, make_demo_inputs, tiny_run_overrides, process_groups
):
    demo_inputs = make_demo_inputs(tmp_path / "demo")
    whole, killed, resumed = tmp_path / "whole", tmp_path / "killed", tmp_path / "resumed"
    command = functools.partial(train_command, tiny_run_overrides, demo_inputs)
    train_to_end(command(whole, whole / "checkpoints"), whole, process_groups)

    checkpoints = killed / "checkpoints"
    train_until_killed(command(killed, checkpoints), killed, checkpoints, process_groups)
    assert read_latest_step(checkpoints) == KILLED_AFTER, "the kill came after the next checkpoint"
    assert not checkpoint_dir(checkpoints, STEPS, "actor").exists()

    resume = command(resumed, checkpoints, "trainer.resume_mode=auto")
    train_to_end(resume, resumed, process_groups)

    expected = actor_weights(whole / "checkpoints", STEPS)
    got = actor_weights(checkpoints, STEPS)
    assert expected.keys() == got.keys()
    for name, tensor in expected.items():
        assert torch.equal(got[name], tensor), name
    before = actor_weights(whole / "checkpoints", KILLED_AFTER)
    assert any(not torch.equal(before[name], expected[name]) for name in expected), (
        "steps 3–4 did not change the weights, so equal weights would prove nothing"
    )

    want, have = logged_metrics(whole), logged_metrics(resumed)
    assert sorted(have) == list(range(1, STEPS + 1))  # steps 1–2 replayed into the new run
    for step in have:
        assert have[step].keys() == want[step].keys(), step
        for name, value in want[step].items():
            assert have[step][name] == pytest.approx(value, rel=1e-6, abs=1e-7), (step, name)
    assert any(name.startswith("val-core/") for name in have[STEPS])

    for step in range(KILLED_AFTER + 1, STEPS + 1):
        responses = [
            load_artifact(store.artifact_path(step, "rollout")).batch["responses"]
            for store in (run_dir(whole), run_dir(resumed))
        ]
        assert torch.equal(*responses), step


def test_sigterm_ends_the_run_cleanly_and_resume_continues_it(
    tmp_path, make_demo_inputs, tiny_run_overrides, process_groups
):
    """SIGTERM to ``ppoflow train`` (the process, not its group): exit 143 with the line that
    says how to resume, no process of the run left (Prefect's temporary server included), the
    MLflow run ended KILLED; ``ppoflow resume`` then trains on from the checkpoint."""
    demo_inputs = make_demo_inputs(tmp_path / "demo")
    home, checkpoints, run = tmp_path / "stopped", tmp_path / "stopped" / "ckpt", tmp_path / "run"
    many = "trainer.total_training_steps=400"  # still training when the signal comes
    command = [
        *train_command(tiny_run_overrides, demo_inputs, home, checkpoints, many),
        "--run-dir",
        str(run),
    ]
    command[2] = "flows"  # the `ppoflow` executable: its temporary server must stop with it
    with process_group(command, home, process_groups) as process:
        deadline = time.monotonic() + RUN_TIMEOUT_S
        while read_latest_step(checkpoints) is None:
            assert process.poll() is None, output_tail(home)
            assert time.monotonic() < deadline, "no checkpoint in time"
            time.sleep(POLL_S)
        os.kill(process.pid, signal.SIGTERM)
        assert process.wait(timeout=120) == 128 + signal.SIGTERM, output_tail(home)
        assert process_groups.wait_until_gone(process.pid) == [], (
            "the stopped run left processes running"
        )
    kept = read_latest_step(checkpoints)
    last = output_tail(home, 1)
    assert last == (
        f"stopped by SIGTERM: the checkpoint of step {kept} is kept; "
        f"continue with `ppoflow resume {run}`"
    ), output_tail(home)
    client = MlflowClient(tracking_uri=f"sqlite:///{home}/mlflow.db")
    (stopped,) = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert stopped.info.status == "KILLED"

    resume = [sys.executable, "-m", "flows", "resume", str(run),
              f"trainer.total_training_steps={kept + 1}"]  # fmt: skip
    train_to_end(resume, home, process_groups)
    resumed_output = (home / "output.log").read_text(errors="replace")
    assert "(started ahead)" in resumed_output  # the `ppoflow` executable's path
    assert "| INFO    |" not in resumed_output, output_tail(home)  # no Prefect log lines
    assert RunStore(run).read_journal(kept + 1).status == "done"
    (resumed,) = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert resumed.info.run_id == stopped.info.run_id and resumed.info.status == "FINISHED"
