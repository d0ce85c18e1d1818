"""Toy stages for the orchestration tests, and one Prefect test harness for the whole session.

The toy step (x is the input tensor, uid the input group ids):

    produce   y = x + toy.offset                       config: toy.offset
    double    z = toy.factor * y                        config: toy.factor
    score     s = w * z, w = engines["model"].weight    reads weights
    critic    v = z (disabled unless toy.use_critic)
    total     total = Σ_row s (non-tensor); metric toy/total_mean = mean(total)

Every stage function counts its calls in ``calls`` so a test can prove a cache hit did no work.

Also ``process_groups``: the process-group helpers of the slow tests that run ``ppoflow`` in
subprocesses and kill them (test_kill_matrix.py, test_agent_kill_resume.py, ...).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch
from pydantic import BaseModel

from dataproto import DataProto
from stages.stage import Stage, StageContext, non_tensor, tensor


class ToyConfig(BaseModel):
    offset: float = 1.0
    factor: float = 2.0
    use_critic: bool = False


class ToyRunConfig(BaseModel):
    toy: ToyConfig = ToyConfig()


@dataclass
class ToyModel:
    weight: float


def uses_critic(config: ToyRunConfig) -> bool:
    return config.toy.use_critic


def make_stages(calls: Counter) -> list[Stage]:
    def produce(batch: DataProto, ctx: StageContext) -> DataProto:
        calls["produce"] += 1
        return DataProto.from_dict({"y": batch.batch["x"] + ctx.config.toy.offset})

    def double(batch: DataProto, ctx: StageContext) -> DataProto:
        calls["double"] += 1
        return DataProto.from_dict({"z": batch.batch["y"] * ctx.config.toy.factor})

    def score(batch: DataProto, ctx: StageContext) -> DataProto:
        calls["score"] += 1
        return DataProto.from_dict({"s": batch.batch["z"] * ctx.engines["model"].weight})

    def critic(batch: DataProto, ctx: StageContext) -> DataProto:
        calls["critic"] += 1
        return DataProto.from_dict({"v": batch.batch["z"].clone()})

    def total(batch: DataProto, ctx: StageContext) -> DataProto:
        calls["total"] += 1
        sums = batch.batch["s"].sum(dim=-1)
        ctx.metrics["toy/total_mean"] = float(sums.mean())
        return DataProto.from_dict(non_tensors={"total": sums.numpy().astype(np.float64)})

    return [
        Stage("produce", 1, (tensor("x"),), (tensor("y"),), produce, config_keys=("toy.offset",)),
        Stage("double", 1, (tensor("y"),), (tensor("z"),), double, config_keys=("toy.factor",)),
        Stage("score", 1, (tensor("z"),), (tensor("s"),), score, reads_weights=True),
        Stage("critic", 1, (tensor("z"),), (tensor("v"),), critic, when=uses_critic),
        Stage("total", 1, (tensor("s"), non_tensor("uid")), (non_tensor("total"),), total),
    ]


@pytest.fixture
def calls() -> Counter:
    return Counter()


@pytest.fixture
def toy_stages(calls: Counter) -> list[Stage]:
    return make_stages(calls)


@pytest.fixture
def make_config():
    """``make_config(factor=3.0)`` → a ToyRunConfig with those ``toy`` fields."""
    return lambda **toy: ToyRunConfig(toy=ToyConfig(**toy))


@pytest.fixture
def toy_batch() -> DataProto:
    x = torch.arange(12, dtype=torch.float32).reshape(4, 3)
    return DataProto.from_dict({"x": x}, {"uid": np.array(["a", "a", "b", "b"], dtype=object)})


@pytest.fixture
def toy_ctx() -> StageContext:
    return StageContext(config=ToyRunConfig(), engines={"model": ToyModel(weight=0.5)})


@pytest.fixture(scope="session")
def prefect_harness():
    """One temporary Prefect server and database for every test that runs real flows (~10 s).

    Flow-run heartbeats are off: their thread sleeps in 1 s steps and is joined when a flow run
    ends, which adds about 0.9 s to every flow run (Prefect 3.9).
    """
    from prefect.settings import PREFECT_FLOWS_HEARTBEAT_FREQUENCY, temporary_settings
    from prefect.testing.utilities import prefect_test_harness

    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")  # no telemetry calls
    with (
        prefect_test_harness(server_startup_timeout=120),
        temporary_settings(updates={PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}),
    ):
        yield


# --- process groups of the slow subprocess tests --------------------------------------------------


class ProcessGroups:
    """Run commands as the leaders of new process groups and watch the groups (from /proc).

    ``run_timeout_s``: how long :meth:`run_group` lets a command run; ``poll_s``: how often
    :meth:`wait_until_gone` looks.
    """

    def __init__(self, run_timeout_s: float = 600, poll_s: float = 0.05) -> None:
        self.run_timeout_s, self.poll_s = run_timeout_s, poll_s

    @staticmethod
    def is_live(pid: int) -> bool:
        """Whether ``pid`` runs and is not a zombie (read from /proc)."""
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return False
        return stat[stat.rindex(")") + 2] not in "ZX"

    @staticmethod
    def live_members(pgid: int) -> list[int]:
        """Pids of the processes of group ``pgid`` that are not zombies (read from /proc)."""
        members = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                stat = (entry / "stat").read_text()
            except OSError:  # the process ended while we looked
                continue
            state, _ppid, group = stat[stat.rindex(")") + 2 :].split()[:3]
            if int(group) == pgid and state not in ("Z", "X"):
                members.append(int(entry.name))
        return members

    def wait_until_gone(self, pgid: int, timeout_s: float = 30.0) -> list[int]:
        """Wait for group ``pgid`` to have no live process; the pids still live at the timeout."""
        deadline = time.monotonic() + timeout_s
        while (left := self.live_members(pgid)) and time.monotonic() < deadline:
            time.sleep(self.poll_s)
        return left

    @staticmethod
    def tail(log: Path, lines: int = 30) -> str:
        """The last ``lines`` lines of ``log``."""
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])

    def run_group(
        self, command: list[str], cwd: Path, env: dict[str, str], log: Path
    ) -> tuple[int, int]:
        """Run ``command`` as the leader of a new process group to its end, its output in
        ``log``: (exit status, group id). No process of the group may be left running; whatever
        is left at a failure is SIGKILLed."""
        with open(log, "wb") as out:
            process = subprocess.Popen(
                command,
                cwd=cwd,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        try:
            status = process.wait(timeout=self.run_timeout_s)
            left = self.wait_until_gone(process.pid)
            assert left == [], (
                f"{command[3]} (exit {status}) left processes {left}:\n{self.tail(log)}"
            )
            return status, process.pid
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"{command[3]} ran over {self.run_timeout_s} s:\n{self.tail(log)}"
            ) from None
        finally:
            if self.live_members(process.pid):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            self.wait_until_gone(process.pid)


@pytest.fixture(scope="session")
def process_groups() -> ProcessGroups:
    """:class:`ProcessGroups` with a 600 s limit on a run (session scope: it holds no state,
    and module fixtures such as test_kill_matrix.py's ``matrix`` use it)."""
    return ProcessGroups(run_timeout_s=600)


class ScheduleRuns:
    """The tiny demo training (tests/conftest.py) with a rollout schedule, in this process:
    :meth:`train` one run, :meth:`overlapped_and_serial` the same run with the replica's jobs
    on their own thread and with each job run at once (``flows.rollout_ahead.InlineLane``: the
    same schedule with no overlap), :meth:`actor_weights` a run's actor at its last step."""

    def __init__(self, steps: int, overrides, *schedule: str) -> None:
        self.steps, self.overrides, self.schedule = steps, overrides, schedule

    def train(self, root: Path, demo: Path, name: str, *extra: str):
        """(the train flow's result, the run's output directory ``root/name``)."""
        from flows.train import train

        out = root / name
        overrides = self.overrides(
            demo, out, self.steps, *self.schedule, "trainer.logger=[console]", *extra
        )
        config = Path(__file__).resolve().parents[2] / "configs" / "demo-cpu.yaml"
        return train(config, overrides, str(out / "run")), out

    def overlapped_and_serial(self, root: Path, demo: Path, *extra: str):
        from flows.rollout_ahead import InlineLane

        overlapped = self.train(root, demo, "overlapped", *extra)
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr("flows.rollout_ahead.Lane", InlineLane)
            serial = self.train(root, demo, "serial", *extra)
        return overlapped, serial

    def assert_same_weights(self, two_runs) -> None:
        """The overlapped run of :meth:`overlapped_and_serial` ended with the serial run's actor
        weights, bit for bit."""
        (_, overlapped), (_, serial) = two_runs
        expected, got = self.actor_weights(serial), self.actor_weights(overlapped)
        assert expected.keys() == got.keys()
        for name, weights in expected.items():
            assert torch.equal(got[name], weights), name

    def actor_weights(self, out: Path) -> dict[str, torch.Tensor]:
        from stages.engines.checkpoint import checkpoint_dir
        from stages.engines.safe_load import weights_only_load

        states = checkpoint_dir(out / "checkpoints", self.steps, "actor") / "state"
        model = states / "mp_rank_00_model_states.pt"
        return weights_only_load(model, map_location="cpu")["module"]


@pytest.fixture(scope="session")
def schedule_runs(tiny_run_overrides):
    """``f(steps, *schedule overrides) -> ScheduleRuns``."""
    return lambda steps, *schedule: ScheduleRuns(steps, tiny_run_overrides, *schedule)
