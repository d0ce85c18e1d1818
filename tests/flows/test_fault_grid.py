"""The side-process fault grid (issue 36): kill -9 or SIGSTOP of each side process of a real
``ppoflow train``, at a stage boundary and mid-stage, and kill -9 of the trainer alone.

Side processes: the reward scorers' zygote and its forked worker (``reward``), the MLflow
process (``mlflow``), Prefect's temporary server (``prefect-server``) and the tool sandbox's
zygote and its worker (``sandbox``, in a multi-turn agent run). Every cell must end in one of
two ways, the one its :class:`Cell` names:

- the run goes on and finishes (exit 0), its output showing that the fault was met
  (:attr:`Cell.notice`), or
- the run stops (exit 1 with exactly one stderr line naming the process and
  ``ppoflow resume RUN``; or the trainer's own kill -9), and ``ppoflow resume RUN`` finishes it;

and then: the actor's weights at the last step equal the uninterrupted run's (the baseline of
the same config), bit for bit; its one MLflow run is FINISHED with every metric's every step
once, at the baseline's value (wall-time metrics excepted); and every process the run had at
the fault, and every process of its process groups, is gone within :data:`GONE_S` of the
trainer's exit (a process still stopped counts as left behind).

The run: the tiny model on the demo task (tests/conftest.py), GRPO, 4 steps, a checkpoint
after steps 2 and 4, validation at step 4; the faults come in step 3. The sandbox cells and the
trainer's kill run the tool agent loop (``multi_turn``, the ``lookup`` tool), with their own
baseline: the random tiny model writes no tool call (the test checks), so the sandbox stays
idle. Short deadlines make the stopped cells end fast: ``reward.timeout_s=3``,
``ppoflow.mlflow_call_timeout_s=5`` (every run, baselines included) and
``PPOFLOW_PREFECT_SERVER_TIMEOUT_S=6`` (the server's SIGSTOP cells).

The faults come from tests/flows/killpoints/sitecustomize.py: ``PPOFLOW_TEST_KILL_AT`` names
the moment (a function call, not a timer), ``PPOFLOW_TEST_FAULT=<target>:<signal>`` the target;
the hook signals the target's processes, waits until the signal took effect, logs them and every
process under the trainer, and the training goes on.

CI (``make test-slow``) runs :data:`REPRESENTATIVE`, one cell per side process;
``make test-fault-grid`` (``PPOFLOW_FAULT_GRID=all``) runs every cell. The runs go
:data:`JOBS` at a time (``PPOFLOW_FAULT_GRID_JOBS``, default 2) against the session's Prefect
server, except the cells with a temporary server of their own (the server's, the trainer's).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch
from mlflow.tracking import MlflowClient

from dataproto.artifact import load_artifact
from flows.process.server_guard import TIMEOUT_VAR
from flows.runs.identity import CACHE_HITS
from flows.runs.store import RunStore
from stages.engines.checkpoint import checkpoint_dir, read_latest_step
from stages.engines.safe_load import weights_only_load

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
KILLPOINTS = Path(__file__).resolve().parent / "killpoints"
PPOFLOW = (sys.executable, "-m", "flows")  # the executable: it starts its server ahead
STEPS, SAVE_FREQ, FAULT_STEP = 4, 2, 3
#: every run's overrides beside the tiny run's (tests/conftest.py): short deadlines, and each
#: step's metrics sent at once (not held for the next steps'), so that what the MLflow process
#: holds at each fault point is fixed (docs/reliability.md)
RUN_OVERRIDES = (
    f"trainer.save_freq={SAVE_FREQ}",
    "trainer.val_before_train=false",
    "reward.timeout_s=3",
    "ppoflow.mlflow_call_timeout_s=5",
    "ppoflow.mlflow_metrics_interval_s=0",
)
SERVER_TIMEOUT_S = 6
AGENT_TOOLS = "actor_rollout_ref.rollout.multi_turn.tool_config_path"
AGENT = (
    "data.max_response_length=24",
    "actor_rollout_ref.rollout.multi_turn.enable=true",
    "actor_rollout_ref.rollout.multi_turn.sandbox.num_workers=1",
)
GONE_S = 10.0  # how long the run's processes get to end after the trainer's exit
RUN_TIMEOUT_S = 600
JOBS = int(os.environ.get("PPOFLOW_FAULT_GRID_JOBS", "2"))
#: metrics that differ between any two runs: wall times, the stages a resume took from the
#: cache, and MLflow's system metrics (sampled on wall time: a longer run has more of them)
NOT_COMPARED = (
    "timing_s/",
    "timing_per_token_ms/",
    "perf/throughput",
    "perf/time_per_step",
    "reward/time_s",
    "reward/in_rollout_wait_s",
    "system/",
    CACHE_HITS,
)


@dataclass(frozen=True)
class Cell:
    """One fault: ``signal`` sent to ``target``'s processes at ``point`` (killpoints'
    ``<point>:<n>``, a moment of step 3). ``notice``: what the output of a run that goes on
    must say (``{pid}``: the target's first process); None: nothing shows."""

    target: str
    signal: str
    moment: str
    point: str
    notice: str | None = None

    @property
    def agent(self) -> bool:
        """Whether the cell runs the tool agent loop (and compares with its baseline)."""
        return self.target in ("sandbox", "main")

    @property
    def own_server(self) -> bool:
        """Whether the run starts a Prefect server of its own (not the session's)."""
        return self.target in ("prefect-server", "main")

    @property
    def stops(self) -> bool:
        """Whether the run stops, to be finished by ``ppoflow resume``."""
        return self.target in ("prefect-server", "main")

    @property
    def baseline(self) -> str:
        return "baseline-agent" if self.agent else "baseline"

    def __str__(self) -> str:
        return f"{self.target}-{self.signal}-{self.moment}"


ZYGOTE_EXITED = "(zygote pid {pid}) exited; starting it again"
ZYGOTE_STOPPED = "(zygote pid {pid}) is stopped (SIGSTOP); starting it again"
MLFLOW_KILLED = "(pid {pid}) ended with exit status -9 before answering log_metrics; a new one"
MLFLOW_STOPPED = "(pid {pid}) did not answer log_metrics within 5 s"
CELLS = [
    Cell("reward", "SIGKILL", "boundary", "reward.start:3", ZYGOTE_EXITED),
    Cell("reward", "SIGKILL", "mid-stage", "reward.sent:3", ZYGOTE_EXITED),
    Cell("reward", "SIGSTOP", "boundary", "reward.start:3", ZYGOTE_STOPPED),
    Cell("reward", "SIGSTOP", "mid-stage", "reward.sent:3", ZYGOTE_STOPPED),
    Cell("mlflow", "SIGKILL", "boundary", "reward.start:3", MLFLOW_KILLED),
    Cell("mlflow", "SIGKILL", "mid-stage", "publish.start:3", MLFLOW_KILLED),
    Cell("mlflow", "SIGSTOP", "boundary", "reward.start:3", MLFLOW_STOPPED),
    Cell("mlflow", "SIGSTOP", "mid-stage", "publish.start:3", MLFLOW_STOPPED),
    Cell("prefect-server", "SIGKILL", "boundary", "reward.start:3"),
    Cell("prefect-server", "SIGKILL", "mid-stage", "update_actor.computed:3"),
    Cell("prefect-server", "SIGSTOP", "boundary", "reward.start:3"),
    Cell("prefect-server", "SIGSTOP", "mid-stage", "update_actor.computed:3"),
    Cell("sandbox", "SIGKILL", "boundary", "rollout.start:3"),
    Cell("sandbox", "SIGKILL", "mid-stage", "agent.round:3"),
    Cell("sandbox", "SIGSTOP", "boundary", "rollout.start:3"),
    Cell("sandbox", "SIGSTOP", "mid-stage", "agent.round:3"),
    Cell("main", "SIGKILL", "mid-stage", "agent.round:3"),
]
#: the part CI runs (``make test-slow``): one cell per side process, the reward pool's stop and
#: the server's loss among them; ``make test-fault-grid`` runs all of CELLS
REPRESENTATIVE = (
    "reward-SIGSTOP-mid-stage",
    "mlflow-SIGKILL-mid-stage",
    "prefect-server-SIGKILL-boundary",
    "sandbox-SIGSTOP-boundary",
)
SELECTED = (
    CELLS
    if os.environ.get("PPOFLOW_FAULT_GRID") == "all"
    else [cell for cell in CELLS if str(cell) in REPRESENTATIVE]
)


# --- the runs ------------------------------------------------------------------------------------


@dataclass
class Run:
    """One ``ppoflow`` process: its exit status, its output files, and the pids of the run
    still live :data:`GONE_S` after its exit (then killed)."""

    status: int
    out: Path
    err: Path
    left: list[int] = field(default_factory=list)


@dataclass
class Case:
    """What a cell (or a baseline) left: its home, the hook's log line, its runs."""

    home: Path
    train: Run
    fault: dict = field(default_factory=dict)
    kept: int | None = None  # the checkpoint step the stopped run kept
    resume: Run | None = None

    @property
    def run(self) -> Path:
        return self.home / "run"


class Grid:
    """The baselines and the cells, run on a pool of :data:`JOBS` threads."""

    def __init__(self, root: Path, demo: Path, overrides, api_url: str, tools: Path, groups):
        self.root, self.demo, self.overrides = root, demo, overrides
        self.api_url, self.tools, self.groups = api_url, tools, groups
        self.pool = ThreadPoolExecutor(max_workers=JOBS, thread_name_prefix="fault-grid")
        self.futures: dict[str, Future] = {}
        self.started = time.monotonic()

    def start(self, cells: list[Cell]) -> None:
        for agent in sorted({cell.agent for cell in cells}):
            name = "baseline-agent" if agent else "baseline"
            self.futures[name] = self.pool.submit(self._baseline, name, agent)
        for cell in cells:
            self.futures[str(cell)] = self.pool.submit(self._case, cell)

    def result(self, name: str) -> Case:
        return self.futures[name].result()

    def close(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)
        print(f"\nfault grid: {len(self.futures)} runs in {time.monotonic() - self.started:.0f} s")

    def env(self, home: Path, cell: Cell | None = None, fault: bool = False) -> dict[str, str]:
        """The session's hermetic environment with this run's MLflow store, one CPU thread; the
        session's Prefect server, or none configured (the executable starts its own); with
        ``fault``, the hook armed for ``cell``."""
        env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{home}/mlflow.db"}
        env.update(HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1", PREFECT_HOME=str(self.root / "ph"))
        env["PREFECT_API_URL"] = self.api_url
        if cell is not None and cell.own_server:
            for name in ("PREFECT_API_URL", "PPOFLOW_TEMPORARY_PREFECT_API_URL"):
                env.pop(name, None)
            env["PREFECT_HOME"] = str(home / "prefect-home")  # the server's own database
        if cell is not None and cell.target == "prefect-server" and cell.signal == "SIGSTOP":
            env[TIMEOUT_VAR] = str(SERVER_TIMEOUT_S)
        if fault:
            python_path = [str(KILLPOINTS), os.environ.get("PYTHONPATH")]
            env.update(
                PYTHONPATH=os.pathsep.join(filter(None, python_path)),
                PPOFLOW_TEST_KILL_AT=cell.point,
                PPOFLOW_TEST_FAULT=f"{cell.target}:{cell.signal}",
                PPOFLOW_TEST_KILL_LOG=str(home / "fault.jsonl"),
            )
        return env

    def train_command(self, home: Path, agent: bool) -> list[str]:
        """``ppoflow train`` of the tiny run, into ``home``; the tool agent loop with ``agent``."""
        extra = (*AGENT, f"{AGENT_TOOLS}={self.tools}") if agent else ()
        overrides = self.overrides(self.demo, home, STEPS, *RUN_OVERRIDES, *extra)
        config = str(REPO / "configs" / "demo-cpu.yaml")
        return [*PPOFLOW, "train", config, *overrides, "--run-dir", f"{home}/run"]

    def _baseline(self, name: str, agent: bool) -> Case:
        home = self.root / name
        home.mkdir()
        run = self.run(self.train_command(home, agent), home, "train", self.env(home))
        assert run.status == 0, f"the {name} exited {run.status}:\n{self.groups.tail(run.err)}"
        return Case(home, run)

    def _case(self, cell: Cell) -> Case:
        home = self.root / str(cell)
        home.mkdir()
        env = self.env(home, cell, fault=True)
        log = home / "fault.jsonl"
        case = Case(home, self.run(self.train_command(home, cell.agent), home, "train", env))
        lines = log.read_text().splitlines() if log.exists() else []
        assert len(lines) == 1, (
            f"{cell}: {len(lines)} fault lines:\n{self.groups.tail(case.train.out)}"
        )
        case.fault = json.loads(lines[0])
        if case.train.status != 0:
            case.kept = read_latest_step(home / "checkpoints")
            resume = [*PPOFLOW, "resume", str(case.run)]
            case.resume = self.run(resume, home, "resume", self.env(home, cell))
        return case

    def run(self, command: list[str], home: Path, name: str, env: dict) -> Run:
        """Run ``command`` to its end as the leader of a new process group (stdout and stderr in
        ``home/<name>.out|.err``); then give every process of the run (:func:`run_processes`)
        :data:`GONE_S` to end, note those left and kill them (SIGCONT, SIGKILL)."""
        out, err, mark = home / f"{name}.out", home / f"{name}.err", str(home / name)
        with open(out, "wb") as stdout, open(err, "wb") as stderr:
            process = subprocess.Popen(
                command, cwd=home, env={**env, RUN_MARK: mark}, stdout=stdout, stderr=stderr,
                start_new_session=True,
            )  # fmt: skip
        try:
            status = process.wait(timeout=RUN_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            status = None
            process.kill()
            process.wait()
        deadline = time.monotonic() + GONE_S
        while (left := run_processes(mark)) and time.monotonic() < deadline:
            time.sleep(0.05)
        for pid in left:
            for sig in (signal.SIGCONT, signal.SIGKILL):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)
        self.groups.wait_until_gone(process.pid)
        assert status is not None, f"{name} ran over {RUN_TIMEOUT_S} s:\n{self.groups.tail(out)}"
        return Run(status, out, err, left)


#: the variable that marks every process of one run (each inherits it, whatever its session)
RUN_MARK = "PPOFLOW_FAULT_GRID_RUN"


def run_processes(mark: str) -> list[int]:
    """Live processes whose environment holds ``RUN_MARK=mark``: the run's trainer and every
    process it started, in its process group or not (Prefect's server has a session of its own)."""
    needle = f"{RUN_MARK}={mark}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and needle in (entry / "environ").read_bytes().split(b"\0"):
                found.append(int(entry.name))
        except OSError:  # ended while we looked, or not ours to read
            continue
    return sorted(found)


@pytest.fixture(scope="module")
def grid(
    request, tmp_path_factory, make_demo_inputs, tiny_run_overrides, prefect_harness,
    write_lookup_tool_config, process_groups,
):  # fmt: skip
    """The runs, started at the first test: the baselines and the cells of every selected test
    of this module."""
    from prefect.settings import PREFECT_API_URL

    root = tmp_path_factory.mktemp("fault-grid")
    demo = make_demo_inputs(root / "demo")
    tools = write_lookup_tool_config(root / "tools.yaml")
    runs = Grid(root, demo, tiny_run_overrides, PREFECT_API_URL.value(), tools, process_groups)
    this_file = Path(__file__).resolve()
    runs.start(
        [
            item.callspec.params["cell"]
            for item in request.session.items
            if Path(item.path).resolve() == this_file and hasattr(item, "callspec")
        ]
    )
    yield runs
    runs.close()


# --- what the runs left --------------------------------------------------------------------------


def actor_weights(home: Path) -> dict[str, torch.Tensor]:
    """The actor's parameters in the step-STEPS DeepSpeed checkpoint (ZeRO 0, one rank)."""
    states = checkpoint_dir(home / "checkpoints", STEPS, "actor") / "state"
    return weights_only_load(states / "mp_rank_00_model_states.pt", map_location="cpu")["module"]


def metric_history(home: Path) -> dict[str, list[tuple[int, float]]]:
    """metric → [(step, value)] of the one MLflow run in ``home/mlflow.db`` (FINISHED), the
    metrics of :data:`NOT_COMPARED` left out."""
    client = MlflowClient(tracking_uri=f"sqlite:///{home}/mlflow.db")
    (run,) = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert run.info.status == "FINISHED", run.info.status
    return {
        name: sorted((p.step, p.value) for p in client.get_metric_history(run.info.run_id, name))
        for name in run.data.metrics
        if not name.startswith(NOT_COMPARED)
    }


def same(a: float, b: float) -> bool:
    """Equal floats, NaN equal to NaN."""
    return a == b or (math.isnan(a) and math.isnan(b))


def first_pid(fault: dict) -> int:
    """The pid of the signalled process that is the trainer's child (a zygote, the MLflow
    process, the server; the trainer itself for ``main``)."""
    return next(
        t["pid"] for t in fault["targets"] if t["ppid"] == fault["pid"] or t["role"] == "main"
    )


def tool_calls(home: Path, step: int) -> int:
    """Tool calls that ran in ``step``'s rollout (its ``tool_call_counts`` column)."""
    rollout = load_artifact(RunStore(str(home / "run")).artifact_path(step, "rollout"))
    return int(sum(rollout.non_tensor_batch["tool_call_counts"]))


def server_line(cell: Cell, case: Case) -> str:
    """The one stderr line of a run stopped by its Prefect server's loss (server_guard.py)."""
    if cell.signal == "SIGKILL":
        what, advice = "exited with status -9 (killed by SIGKILL)", ""
    else:
        what = f"did not answer its health check for {SERVER_TIMEOUT_S} s ({TIMEOUT_VAR})"
        what, advice = (
            f"{what} and was killed",
            f" (on a loaded machine export a larger {TIMEOUT_VAR})",
        )
    return (
        f"error: Prefect's temporary server (pid {first_pid(case.fault)}) {what} during the run; "
        f"the run stopped: the checkpoint of step {case.kept} is kept; "
        f"continue with `ppoflow resume {case.run}`{advice}"
    )


def check_fault_landed(cell: Cell, fault: dict) -> None:
    """The hook's line: the cell's point in step 3, the target's processes signalled, the
    signal seen to take effect."""
    point, _, n = cell.point.rpartition(":")
    assert (fault["point"], fault["n"], fault["signal"]) == (point, int(n), cell.signal), fault
    assert any(f"step{sep}{FAULT_STEP}" in fault["detail"] for sep in " _"), fault["detail"]
    roles = [target["role"] for target in fault["targets"]]
    assert roles and set(roles) == {cell.target}, (roles, fault["descendants"])
    if cell.target in ("reward", "sandbox"):
        assert len(roles) >= 2, fault["targets"]  # the zygote and its worker
    if cell.target != "main":
        assert fault["took_effect"], fault


def check_outcome(cell: Cell, case: Case, tail) -> None:
    """Exit 0 with the cell's notice; or the one line (the trainer's kill: none) and a resume
    that exits 0."""
    out = case.train.out.read_text(errors="replace")
    err = case.train.err.read_text(errors="replace")
    if not cell.stops:
        assert case.train.status == 0, f"exit {case.train.status}:\n{tail(case.train.err)}"
        if cell.notice:
            assert cell.notice.format(pid=first_pid(case.fault)) in out + err, tail(case.train.out)
        return
    if cell.target == "main":
        assert case.train.status == -signal.SIGKILL, tail(case.train.err)
        roles = {member["role"] for member in case.fault["descendants"]}
        assert roles >= {"reward", "sandbox", "mlflow", "prefect-server"}, roles
    else:
        assert case.train.status == 1, tail(case.train.err)
        assert err.splitlines() == [server_line(cell, case)]
    assert case.resume is not None and case.resume.status == 0, tail(case.resume.err)
    assert case.resume.out.read_text().splitlines()[-1] == str(case.run)


# --- the test ------------------------------------------------------------------------------------


@pytest.mark.parametrize("cell", SELECTED, ids=str)
def test_a_side_process_fault_ends_as_the_uninterrupted_run(grid, cell, process_groups):
    case, baseline = grid.result(str(cell)), grid.result(cell.baseline)
    check_fault_landed(cell, case.fault)
    check_outcome(cell, case, process_groups.tail)
    for run in filter(None, (case.train, case.resume)):
        assert run.left == [], f"left {GONE_S:g} s after {run.out.stem}'s exit: {run.left}"
    if cell.target == "sandbox":  # idle: the random tiny model writes no tool call
        assert [tool_calls(case.home, step) for step in (FAULT_STEP, STEPS)] == [0, 0]

    expected, got = actor_weights(baseline.home), actor_weights(case.home)
    assert expected.keys() == got.keys()
    for name, tensor in expected.items():
        assert torch.equal(got[name], tensor), name

    want, have = metric_history(baseline.home), metric_history(case.home)
    assert have.keys() == want.keys()
    for name, points in have.items():
        steps = [step for step, _ in points]
        assert steps == sorted(set(steps)), f"{name}: steps {steps} (a step logged twice)"
        assert len(points) == len(want[name]), (name, points, want[name])
        for (step, value), (want_step, want_value) in zip(points, want[name], strict=True):
            assert step == want_step and same(value, want_value), (name, step, value, want_value)
