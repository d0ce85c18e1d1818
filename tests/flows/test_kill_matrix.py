"""kill -9 at every point resumes identically (issue 18): the kill matrix.

One uninterrupted ``ppoflow train`` (the baseline, shared by every case) and, per kill point, a
fresh ``ppoflow train`` SIGKILLed (its whole process group) at that point, then
``ppoflow resume RUN_DIR`` in place, in the same MLflow store. The run: the tiny model on the demo
task (tests/conftest.py, 4 prompts × n 2, 8 response tokens), PPO with a critic
(``adv_estimator=gae``), a KL penalty in the reward (fixed controller) and a KL loss against the
reference, so every stage runs: rollout, balance, reward, old_log_prob, ref_log_prob, values,
advantage, update_critic, update_actor. 4 steps, a checkpoint after steps 2 and 4, validation at
step 4.

The kills come from tests/flows/killpoints/sitecustomize.py (on the killed run's
``PYTHONPATH``, ``PPOFLOW_TEST_KILL_AT=<point>:<n>``): a wrapped function kills the group the
n-th time the point is reached, so no case depends on timing. The points: each stage's start,
after its compute before its artifact is saved, and in its artifact write (temp folder complete,
before the rename; the background writer's thread, while the step goes on), in step 3; the checkpoint of step 4 after the actor's files, the critic's,
``data/state.json``, the step manifest, the tracker, and after ``save_run_checkpoint`` returned;
the tracker of step 2; the publishing thread about to send step 2's metrics to MLflow, and having
sent step 3's.

After the resume every case must have: the baseline's actor and critic weights at step 4, bit for
bit, in a checkpoint that passes its full check; in its one MLflow run (FINISHED), every metric's
every step exactly once with the baseline's value (timings, which measure wall time, and
``ppoflow/cache_hits``, which counts the stages the resume took from the killed run's cache,
excepted); every step's journal ``done``; no temp file of an interrupted write in the run or
checkpoint folders (those the kill left were seen before the resume); the resume starting from
the checkpoint the point implies; no process of either process group running.

CI (``make test-slow``) runs :data:`REPRESENTATIVE`, 6 of the 36 cases; ``make test-kill-matrix``
(``PPOFLOW_KILL_MATRIX=all``) runs them all.

Time: each process spends most of its ~15 s in start-up, so the cases run two at a time
(``PPOFLOW_KILL_MATRIX_JOBS``, default 2: one per core of a 2-core machine) against the session's
Prefect server (tests/flows/conftest.py ``prefect_harness``) instead of a temporary server per
process. The module fixture starts the baseline and every selected case when the first test
asks, and each test waits for its own case.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import sys
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from mlflow.tracking import MlflowClient

from flows.runs.artifact_writer import THREAD_NAME as WRITER_THREAD
from flows.runs.identity import CACHE_HITS
from flows.runs.store import RunStore
from flows.sinks.mlflow_logger import STEP_METRIC
from stages.engines.checkpoint import checkpoint_dir, read_latest_step
from stages.engines.checkpoint_manifest import verify_checkpoint
from stages.engines.safe_load import weights_only_load

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
KILLPOINTS = Path(__file__).resolve().parent / "killpoints"
STEPS, SAVE_FREQ = 4, 2
#: each step's metrics sent at once (not held for the next steps'), so that what MLflow holds at
#: each kill point is fixed (:attr:`Kill.logged_steps`); test_resume_after_kill.py kills a run
#: with the default hold
RUN_OVERRIDES = (
    f"trainer.save_freq={SAVE_FREQ}",
    "trainer.val_before_train=false",
    "ppoflow.mlflow_metrics_interval_s=0",
    "algorithm.adv_estimator=gae",
    "algorithm.use_kl_in_reward=true",
    "actor_rollout_ref.actor.use_kl_loss=true",
)
STAGES = (
    "rollout",
    "balance",
    "reward",
    "old_log_prob",
    "ref_log_prob",
    "values",
    "advantage",
    "update_critic",
    "update_actor",
)
ROLES = ("actor", "critic")
JOBS = int(os.environ.get("PPOFLOW_KILL_MATRIX_JOBS", "2"))
#: metrics that differ between any two runs: wall times, and the stages taken from the cache
NOT_COMPARED = (
    "timing_s/",
    "timing_per_token_ms/",
    "perf/throughput",
    "perf/time_per_step",
    "reward/time_s",
    "system/",  # MLflow's system metrics: sampled every 10 s of wall time
    CACHE_HITS,
)
#: names that only a write cut short leaves (artifacts, JSON records, engine checkpoints, tracker)
TEMP_MARKS = (".tmp-", ".partial", ".old")


@dataclass(frozen=True)
class Kill:
    """A kill point of killpoints/sitecustomize.py, the n-th time it is reached, which falls in
    ``step``; the resume must start from the checkpoint of step ``resumes_from``."""

    point: str
    n: int
    step: int
    resumes_from: int

    @property
    def spec(self) -> str:
        return f"{self.point}:{self.n}"

    @property
    def logged_steps(self) -> list[int]:
        """The steps in MLflow at the kill: those before ``step`` (a main-thread point waits for
        the publisher, killpoints/sitecustomize.py), and ``step`` itself once ``publish.sent``."""
        return list(range(1, self.step + (self.point == "publish.sent")))

    def __str__(self) -> str:
        return f"{self.point}@step{self.step}"


KILLS = [
    *(
        Kill(f"{stage}.{phase}", 3, 3, 2)
        for stage in STAGES
        for phase in ("start", "computed", "write")
    ),
    *(Kill(f"checkpoint.{phase}", 2, 4, 2) for phase in ("actor", "critic", "state", "manifest")),
    Kill("checkpoint.tracker", 1, 2, 2),
    Kill("checkpoint.tracker", 2, 4, 4),
    Kill("checkpoint.saved", 2, 4, 4),
    Kill("publish.start", 2, 2, 2),
    Kill("publish.sent", 3, 3, 2),
]
#: the part CI runs (``make test-slow``): a kill before a stage starts, after it computed and
#: while it writes (on generation, scoring and the actor's update), the checkpoint's last file
#: and its tracker, and the publisher after it sent a step; ``make test-kill-matrix`` runs all
#: of KILLS (``PPOFLOW_KILL_MATRIX=all``), as a session that changes resume or checkpoints should
REPRESENTATIVE = (
    "rollout.start@step3",
    "reward.computed@step3",
    "update_actor.write@step3",
    "checkpoint.manifest@step4",
    "checkpoint.tracker@step2",
    "publish.sent@step3",
)
SELECTED = (
    KILLS
    if os.environ.get("PPOFLOW_KILL_MATRIX") == "all"
    else [kill for kill in KILLS if str(kill) in REPRESENTATIVE]
)


# --- the runs ------------------------------------------------------------------------------------


@dataclass
class Outcome:
    """What a killed-and-resumed case (or the baseline) left: its folders, the kill log line,
    the temp files the kill left, the two process groups, the seconds it took."""

    home: Path
    killed_at: dict | None = None
    logged_steps: list[int] | None = None  # in MLflow at the kill
    leftovers: tuple[str, ...] = ()
    groups: tuple[int, ...] = ()
    wall_s: float = 0.0

    @property
    def run(self) -> Path:
        return self.home / "run"

    @property
    def checkpoints(self) -> Path:
        return self.home / "checkpoints"


def temp_files(*folders: Path) -> list[str]:
    """Paths under ``folders`` whose name marks an unfinished write (:data:`TEMP_MARKS`)."""
    return sorted(
        str(path)
        for folder in folders
        for path in folder.rglob("*")
        if any(mark in path.name for mark in TEMP_MARKS)
    )


class Matrix:
    """The baseline and the cases, run on a pool of :data:`JOBS` threads (module docstring)."""

    def __init__(
        self, root: Path, demo: Path, tiny_run_overrides, prefect_api_url: str, process_groups
    ) -> None:
        self.root, self.demo, self.overrides = root, demo, tiny_run_overrides
        self.api_url = prefect_api_url
        self.groups = process_groups
        self.empty_store = root / "empty-mlflow.db"
        MlflowClient(tracking_uri=f"sqlite:///{self.empty_store}").search_experiments()
        self.pool = ThreadPoolExecutor(max_workers=JOBS, thread_name_prefix="kill-matrix")
        self.futures: dict[str, Future] = {}
        self.started = time.monotonic()

    def start(self, kills: list[Kill]) -> None:
        self.futures["baseline"] = self.pool.submit(self._baseline)
        for kill in kills:
            self.futures[str(kill)] = self.pool.submit(self._case, kill)

    def result(self, name: str) -> Outcome:
        return self.futures[name].result()

    def close(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)
        done = [
            f.result()
            for f in self.futures.values()
            if f.done() and not f.cancelled() and not f.exception()
        ]
        print(
            f"\nkill matrix: {len(done)} of {len(self.futures)} runs done in "
            f"{time.monotonic() - self.started:.0f} s ({JOBS} at a time); "
            + ", ".join(f"{o.home.name} {o.wall_s:.0f} s" for o in done)
        )

    def env(self, home: Path, **extra: str) -> dict[str, str]:
        """The session's hermetic environment (tests/conftest.py) with this run's own MLflow
        store, the session's Prefect server and one Prefect home for every run (the first
        client registers Prefect's block types, ~2 s, and notes it there), one CPU thread and no
        network."""
        return {
            **os.environ,
            "PREFECT_HOME": str(self.root / "prefect-home"),
            "PREFECT_API_URL": self.api_url,
            "MLFLOW_TRACKING_URI": f"sqlite:///{home}/mlflow.db",
            "HF_HUB_OFFLINE": "1",
            "OMP_NUM_THREADS": "1",
            **extra,
        }

    def train_command(self, home: Path) -> list[str]:
        config = REPO / "configs" / "demo-cpu.yaml"
        overrides = self.overrides(self.demo, home, STEPS, *RUN_OVERRIDES)
        command = [sys.executable, "-m", "flows.cli", "train", str(config), *overrides]
        return [*command, "--run-dir", str(home / "run")]

    def _baseline(self) -> Outcome:
        start, home = time.monotonic(), self.root / "baseline"
        home.mkdir()
        log = home / "train.log"
        status, group = self.groups.run_group(self.train_command(home), home, self.env(home), log)
        assert status == 0, f"the baseline exited {status}:\n{self.groups.tail(log)}"
        return Outcome(home, groups=(group,), wall_s=time.monotonic() - start)

    def _case(self, kill: Kill) -> Outcome:
        start, home = time.monotonic(), self.root / str(kill).replace("@", "-")
        home.mkdir()
        shutil.copyfile(self.empty_store, home / "mlflow.db")  # its tables made once (~2 s)
        outcome = Outcome(home)
        outcome.killed_at, killed = self._killed_run(kill, home)
        outcome.leftovers = tuple(temp_files(outcome.run, outcome.checkpoints))
        outcome.logged_steps = logged_steps(home)
        log = home / "resume.log"
        resume = [sys.executable, "-m", "flows.cli", "resume", str(outcome.run)]
        status, resumed = self.groups.run_group(resume, home, self.env(home), log)
        assert status == 0, f"ppoflow resume exited {status}:\n{self.groups.tail(log)}"
        outcome.groups, outcome.wall_s = (killed, resumed), time.monotonic() - start
        return outcome

    def _killed_run(self, kill: Kill, home: Path) -> tuple[dict, int]:
        """Train until the kill point; the kill log's line and the process group."""
        log, kill_log = home / "train.log", home / "kill.jsonl"
        env = self.env(
            home,
            PYTHONPATH=os.pathsep.join(
                filter(None, [str(KILLPOINTS), os.environ.get("PYTHONPATH")])
            ),
            PPOFLOW_TEST_KILL_AT=kill.spec,
            PPOFLOW_TEST_KILL_LOG=str(kill_log),
        )
        status, group = self.groups.run_group(self.train_command(home), home, env, log)
        assert status == -signal.SIGKILL, (
            f"ppoflow train exited {status}, not by its kill at {kill.spec}:\n"
            f"{self.groups.tail(log)}"
        )
        (line,) = [json.loads(text) for text in kill_log.read_text().splitlines()]
        return line, group


@pytest.fixture(scope="module")
def matrix(
    request, tmp_path_factory, make_demo_inputs, tiny_run_overrides, prefect_harness, process_groups
):
    """The runs, started at the first test: the baseline and the cases of every selected test
    of this module."""
    from prefect.settings import PREFECT_API_URL

    root = tmp_path_factory.mktemp("kill-matrix")
    demo = make_demo_inputs(root / "demo")
    runs = Matrix(root, demo, tiny_run_overrides, PREFECT_API_URL.value(), process_groups)
    this_file = Path(__file__).resolve()
    selected = [
        item.callspec.params["kill"]
        for item in request.session.items
        if Path(item.path).resolve() == this_file and hasattr(item, "callspec")
    ]
    runs.start(selected)
    yield runs
    runs.close()


# --- what the runs left --------------------------------------------------------------------------


def weights(checkpoints: Path, role: str) -> dict[str, torch.Tensor]:
    """The parameters of ``role`` in the step-STEPS DeepSpeed checkpoint (ZeRO 0, one rank)."""
    states = checkpoint_dir(checkpoints, STEPS, role) / "state" / "mp_rank_00_model_states.pt"
    return weights_only_load(states, map_location="cpu")["module"]


def metric_history(home: Path) -> dict[str, list[tuple[int, float]]]:
    """metric → [(step, value)] of the one MLflow run in ``home/mlflow.db`` (FINISHED), the
    metrics of :data:`NOT_COMPARED` left out."""
    client = MlflowClient(tracking_uri=f"sqlite:///{home}/mlflow.db")
    (run,) = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert run.info.status == "FINISHED", run.info.status
    return {
        name: sorted(
            (point.step, point.value) for point in client.get_metric_history(run.info.run_id, name)
        )
        for name in run.data.metrics
        if not name.startswith(NOT_COMPARED)
    }


def logged_steps(home: Path) -> list[int]:
    """The steps the one MLflow run in ``home/mlflow.db`` holds (its ``training/global_step``)."""
    client = MlflowClient(tracking_uri=f"sqlite:///{home}/mlflow.db")
    (run,) = client.search_runs([e.experiment_id for e in client.search_experiments()])
    return sorted(int(p.step) for p in client.get_metric_history(run.info.run_id, STEP_METRIC))


def same(a: float, b: float) -> bool:
    """Equal floats, NaN equal to NaN."""
    return a == b or (math.isnan(a) and math.isnan(b))


# --- the test ------------------------------------------------------------------------------------


@pytest.mark.parametrize("kill", SELECTED, ids=str)
def test_a_kill_at_any_point_resumes_to_the_uninterrupted_run(matrix, kill, process_groups):
    tail, live_members = process_groups.tail, process_groups.live_members
    case, baseline = matrix.result(str(kill)), matrix.result("baseline")
    killed_at = case.killed_at
    assert (killed_at["point"], killed_at["n"]) == (kill.point, kill.n), killed_at
    assert any(f"step{sep}{kill.step}" in killed_at["detail"] for sep in " _"), killed_at
    assert case.logged_steps == kill.logged_steps, "MLflow at the kill"
    resumed_from = f"resumed from {case.checkpoints}/global_step_{kill.resumes_from}"
    assert resumed_from in (case.home / "resume.log").read_text(), tail(case.home / "resume.log")
    if kill.point.endswith(".write"):  # the kill left the artifact's temp folder
        stage = kill.point.removesuffix(".write")
        assert any(f"/step_{kill.step}/.{stage}.tmp-" in path for path in case.leftovers)
        # …written by the background writer while the step went on (flows/runs/artifact_writer.py)
        assert killed_at["thread"].startswith(WRITER_THREAD), killed_at

    assert temp_files(case.run, case.checkpoints) == [], "a temp file of the killed run is left"
    for step in range(1, STEPS + 1):
        assert RunStore(str(case.run)).read_journal(step).status == "done", step
    for group in case.groups:
        assert live_members(group) == [], f"process group {group} still runs"

    assert read_latest_step(case.checkpoints) == STEPS
    verify_checkpoint(case.checkpoints, STEPS, verify="full")
    for role in ROLES:
        expected, got = weights(baseline.checkpoints, role), weights(case.checkpoints, role)
        assert expected.keys() == got.keys(), role
        for name, tensor in expected.items():
            assert torch.equal(got[name], tensor), (role, name)

    want, have = metric_history(baseline.home), metric_history(case.home)
    assert have.keys() == want.keys()
    for name, points in have.items():
        steps = [step for step, _ in points]
        assert steps == sorted(set(steps)), f"{name}: steps {steps} (a step logged twice)"
        assert len(points) == len(want[name]), (name, points, want[name])
        for (step, value), (want_step, want_value) in zip(points, want[name], strict=True):
            assert step == want_step and same(value, want_value), (name, step, value, want_value)
