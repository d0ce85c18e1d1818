"""Kill points: SIGKILL a ``ppoflow`` process group at a named point of the training, the Nth
time the point is reached (tests/flows/test_kill_matrix.py).

Put this directory on ``PYTHONPATH``, start ``ppoflow train`` as the leader of a new process
group (``start_new_session=True``) and set ``PPOFLOW_TEST_KILL_AT=<point>:<n>``. When the
training reaches ``<point>`` for the ``n``-th time (1-based), one JSON line (point, n, pid,
thread, what was being done, and ``group``: the pid, parent pid and command line of each live
process of the group) is appended to ``PPOFLOW_TEST_KILL_LOG`` and fsync'ed, and the whole
group gets SIGKILL: the trainer, its reward workers and whatever else it started, at once, as a
``kill -9`` of the group would. Nothing is timed: the point is a function call.

Points (``<stage>`` is a stage name of flows/step_flow.py, e.g. ``rollout``, ``update_actor``):

=========================  ===================================================================
``<stage>.start``          ``flows.stage_task.run_stage`` is entered for the stage (before the
                           cache lookup)
``<stage>.computed``       the stage's function returned and its delta passed the check, before
                           ``save_artifact`` writes anything (``flows.stage_task.save_artifact``)
``<stage>.write``          the artifact's temp folder ``step_<k>/.<stage>.tmp-*`` holds every
                           file, manifest included, before the rename
                           (``dataproto.artifact_store.Store.commit``)
``checkpoint.actor``       ``save_engine_checkpoint`` returned for the actor (its folder is in
``checkpoint.critic``      place), resp. the critic
``checkpoint.state``       ``data/state.json`` is written (``flows.runs.checkpoints._write_json``)
``checkpoint.manifest``    the step's manifest is written (``write_step_manifest``)
``checkpoint.tracker``     ``latest_checkpointed_iteration.txt`` is written (``write_latest_step``)
``checkpoint.saved``       ``save_run_checkpoint`` returned (old steps pruned)
``publish.start``          the publishing thread enters ``MLflowProcessSink.log_metrics`` (the
                           step's metrics are not sent to the MLflow process yet)
``publish.sent``           the publishing thread's ``MLflowProcessSink.log_metrics`` returned (the
                           step's metrics are in the store, its Prefect report is not)
``agent.round``            the multi-turn agent loop starts a generation round
                           (``stages.agent.loop._generation_round``), in a training rollout or a
                           validation; the detail names which, its step, and the round
``agent.tools``            a tool round runs its calls on the sandbox
                           (``stages.agent.sandbox.ToolSandbox.run``); same detail
``dapo.round``             a generation round of dynamic sampling starts, before it draws its
                           prompts (``flows.gen_rounds._run_round``); the detail names the step
                           and the round
``reward.sent``            a reward scorer pool has sent the first task lists of a
                           ``ScorerPool.map`` call to its workers (the call's first
                           ``_dispatch`` returned; the tool sandbox's pool is not counted); the
                           detail names the stage and step entered last
``replica.sync``           a rollout replica (``stages.engines.rollout_replica``) is about to
                           take a weight sync (on the main thread or the lane's)
``replica.synced``         the replica's sync returned (it holds the new weights)
=========================  ===================================================================

A point of the main thread first waits for the publishing thread to finish the step it is
sending (``flows.sinks.publisher.Publisher``), so what MLflow holds at the kill does not depend on
thread timing: every step submitted before the kill is in the store. The ``publish.*`` points
are the kills with a step's metrics unsent or just sent; there the main thread is wherever it got
to (the publisher runs beside the next step).

The functions are wrapped right after their module is first imported (a ``sys.meta_path`` hook),
before any other module binds them with ``from … import``, so every caller gets the wrapper.
Only the group leader is armed: the reward workers, which inherit the environment, never kill.
A malformed ``PPOFLOW_TEST_KILL_AT`` stops the process at start-up with a message.

**A fault in a side process instead** (tests/flows/test_fault_grid.py): with
``PPOFLOW_TEST_FAULT=<target>:<signal>`` (``signal``: ``SIGKILL`` or ``SIGSTOP``) the point
does not kill the group. It sends ``signal`` to the target's processes, waits until the signal
took effect (each one gone, a zombie, or stopped; at most :data:`EFFECT_BOUND_S`), and the
training goes on. Targets, found from ``/proc`` among the trainer's descendants:

=====================  ============================================================================
``reward``             each reward scorer pool's zygote (``stages.reward.pool.ScorerPool``, as
                       recorded when made; not the tool sandbox's) and its forked workers
``sandbox``            the tool sandbox's zygote (``stages.agent.sandbox.ToolSandbox``) and its
                       workers
``mlflow``             the MLflow process (``flows.sinks.mlflow_process``, a child of the trainer)
``prefect-server``     Prefect's temporary server (a child of the trainer in a session of its own,
                       so never in the group)
``main``               the trainer alone (``SIGKILL`` only), after the log line
=====================  ============================================================================

The log line, written once the signal took effect (``main``: before the kill), then also has
``fault`` (the target), ``signal``, ``targets`` (pid, parent pid, command line and role of each
process signalled), ``took_effect`` (whether each was seen gone or stopped in time; None for
``main``) and ``descendants`` (each process under the trainer at the fault, with its role). A
target with no process is a line with ``targets: []`` (the test fails on it).
"""

from __future__ import annotations

import contextlib
import functools
import importlib.abc
import json
import os
import signal
import sys
import threading
import time
import weakref
from collections import Counter
from collections.abc import Callable
from typing import Any

_SPEC = os.environ.get("PPOFLOW_TEST_KILL_AT", "")
_LOG = os.environ.get("PPOFLOW_TEST_KILL_LOG")
_FAULT_SPEC = os.environ.get("PPOFLOW_TEST_FAULT", "")
CHECKPOINT_POINTS = ("actor", "critic", "state", "manifest", "tracker", "saved")
PUBLISH_POINTS = ("start", "sent")
STAGE_POINTS = ("start", "computed", "write")
AGENT_POINTS = ("round", "tools")
DAPO_POINTS = ("round",)
REWARD_POOL_POINTS = ("sent",)
REPLICA_POINTS = ("sync", "synced")
FAULT_TARGETS = ("reward", "sandbox", "mlflow", "prefect-server", "main")
FAULT_SIGNALS = ("SIGKILL", "SIGSTOP")
EFFECT_BOUND_S = 10.0  # how long a fault waits for its signal to take effect
_reached: Counter[str] = Counter()
_publishers: list[Any] = []
_agent_rollouts: list[str] = []  # "rollout step 3" / "validation step 4" while one runs
_pools: list[weakref.ref] = []  # every ScorerPool made (reward pools and the sandbox's)
_sandboxes: list[weakref.ref] = []  # every ToolSandbox made
_stage_now = ["before the first stage"]  # the stage and step run_stage entered last


def parse(spec: str) -> tuple[str, int]:
    """``"<point>:<n>"`` → (point, n); SystemExit naming the problem when it is not one."""
    point, _, count = spec.rpartition(":")
    area, _, phase = point.partition(".")
    known = (
        (area == "checkpoint" and phase in CHECKPOINT_POINTS)
        or (area == "publish" and phase in PUBLISH_POINTS)
        or (area == "agent" and phase in AGENT_POINTS)
        or (area == "dapo" and phase in DAPO_POINTS)
        or (area == "reward" and phase in REWARD_POOL_POINTS)
        or (area == "replica" and phase in REPLICA_POINTS)
        or (
            area not in ("checkpoint", "publish", "agent", "dapo", "replica")
            and bool(area)
            and phase in STAGE_POINTS
        )
    )
    if not known or not count.isdigit() or int(count) < 1:
        raise SystemExit(
            f"PPOFLOW_TEST_KILL_AT={spec!r}: expected <point>:<n> with n ≥ 1 and point one of "
            f"<stage>.{{{','.join(STAGE_POINTS)}}}, checkpoint.{{{','.join(CHECKPOINT_POINTS)}}}, "
            f"publish.{{{','.join(PUBLISH_POINTS)}}}, agent.{{{','.join(AGENT_POINTS)}}}, "
            f"dapo.{{{','.join(DAPO_POINTS)}}}, reward.{{{','.join(REWARD_POOL_POINTS)}}}, "
            f"replica.{{{','.join(REPLICA_POINTS)}}}"
        )
    return point, int(count)


def parse_fault(spec: str) -> tuple[str, signal.Signals]:
    """``"<target>:<signal>"`` → (target, signal); SystemExit naming the problem when it is not
    one (``main`` takes SIGKILL only)."""
    target, _, name = spec.partition(":")
    if (
        target not in FAULT_TARGETS
        or name not in FAULT_SIGNALS
        or (target, name)
        == (
            "main",
            "SIGSTOP",
        )
    ):
        raise SystemExit(
            f"PPOFLOW_TEST_FAULT={spec!r}: expected <target>:<signal> with target one of "
            f"{', '.join(FAULT_TARGETS)} and signal one of {', '.join(FAULT_SIGNALS)} "
            "(main: SIGKILL only)"
        )
    return target, getattr(signal, name)


def _drain_publishers() -> None:
    """Wait for the publishing thread's current step (main-thread points; module docstring)."""
    for publisher in _publishers:
        pending = publisher._pending
        if pending is not None:
            pending.exception(timeout=300)  # done, failed or not: the store is as it will be


def _group_members(pgid: int) -> list[dict[str, Any]]:
    """pid, parent pid and command line of each live process of group ``pgid`` (from /proc)."""
    return [
        {"pid": pid, "ppid": ppid, "argv": argv}
        for pid, (ppid, state, group, argv) in _processes().items()
        if group == pgid and state not in ("Z", "X")
    ]


def reached(point: str, detail: str) -> None:
    """Count ``point``; at the chosen count, record it and SIGKILL the process group."""
    if point != _TARGET or os.getpid() != os.getpgid(0):  # the group leader only
        return
    _reached[point] += 1
    if _reached[point] != _COUNT:
        return
    thread = threading.current_thread().name
    if not point.startswith("publish."):
        _drain_publishers()
    line = {
        "point": point,
        "n": _COUNT,
        "pid": os.getpid(),
        "thread": thread,
        "detail": detail,
        "group": _group_members(os.getpgid(0)),
    }
    if _FAULT_SPEC:
        inject_fault(line)
        return
    _write_log(line)
    os.killpg(os.getpgid(0), signal.SIGKILL)


def _write_log(line: dict[str, Any]) -> None:
    """Append ``line`` to the kill log as one JSON line, fsync'ed (no log: nothing)."""
    if not _LOG:
        return
    handle = os.open(_LOG, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(handle, (json.dumps(line) + "\n").encode())
        os.fsync(handle)
    finally:
        os.close(handle)


# --- faults of side processes (PPOFLOW_TEST_FAULT) -----------------------------------------------


def _processes() -> dict[int, tuple[int, str, int, list[str]]]:
    """pid → (parent pid, state letter, process group, command line) of every process (from
    /proc)."""
    table = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat_file:
                stat = stat_file.read()
            with open(f"/proc/{entry}/cmdline", "rb") as cmd_file:
                argv = cmd_file.read().decode(errors="replace").split("\0")[:-1]
        except OSError:  # the process ended while we looked
            continue
        state, ppid, group = stat[stat.rindex(")") + 2 :].split()[:3]
        table[int(entry)] = (int(ppid), state, int(group), argv)
    return table


def _zygotes(sandbox: bool) -> set[int]:
    """The zygote pids of the live scorer pools: the tool sandboxes' or the others' (reward)."""
    of_sandboxes = {id(box._pool) for ref in _sandboxes if (box := ref()) is not None}
    pids = set()
    for ref in _pools:
        pool = ref()
        if pool is None or (id(pool) in of_sandboxes) != sandbox:
            continue
        if pool.zygote_pid is not None:
            pids.add(pool.zygote_pid)
    return pids


def _role(pid: int, argv: list[str], reward: set[int], sandbox: set[int]) -> str:
    """Which side process a child of the trainer is (module docstring's targets)."""
    command = " ".join(argv)
    if pid in reward:
        return "reward"
    if pid in sandbox:
        return "sandbox"
    if "flows.sinks.mlflow_process import serve" in command:
        return "mlflow"
    if "flows.process.prefect_server:create_app" in command:
        return "prefect-server"
    return "other"


def descendants() -> list[dict[str, Any]]:
    """Each live process under this one: pid, parent pid, command line and role (the role of
    the trainer's child it descends from)."""
    table = _processes()
    reward, sandbox = _zygotes(sandbox=False), _zygotes(sandbox=True)
    found: list[dict[str, Any]] = []
    parents = {os.getpid(): None}  # pid → the role its descendants get (None: the trainer)
    while True:
        new = [
            (pid, ppid, argv)
            for pid, (ppid, state, _group, argv) in sorted(table.items())
            if ppid in parents and pid not in parents and state not in ("Z", "X")
        ]
        if not new:
            return found
        for pid, ppid, argv in new:
            role = parents[ppid] or _role(pid, argv, reward, sandbox)
            parents[pid] = role
            found.append({"pid": pid, "ppid": ppid, "argv": argv, "role": role})


def _state(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat") as stat_file:
            stat = stat_file.read()
    except OSError:
        return None
    return stat[stat.rindex(")") + 2]


def _took_effect(pids: list[int], sig: signal.Signals) -> bool:
    """Whether every pid is gone or a zombie (SIGKILL), or stopped or gone (SIGSTOP)."""
    done = ("Z", "X") if sig == signal.SIGKILL else ("T", "Z", "X")
    return all(_state(pid) in (None, *done) for pid in pids)


def inject_fault(line: dict[str, Any]) -> None:
    """Send the fault's signal to its target's processes, wait for it to take effect, log the
    line (module docstring), and return: the training goes on. ``main``: the line is logged
    first, then the trainer is killed."""
    target, sig = _FAULT
    side = descendants()
    line |= {"fault": target, "signal": sig.name, "descendants": side}
    if target == "main":
        me = {"pid": os.getpid(), "ppid": os.getppid(), "argv": sys.argv, "role": "main"}
        _write_log(line | {"targets": [me], "took_effect": None})
        os.kill(os.getpid(), signal.SIGKILL)
    targets = [member for member in side if member["role"] == target]
    pids = [member["pid"] for member in targets]
    # the server guard's signal (flows/process/server_guard.py SIGNAL) waits until the line is
    # written: a lost server's ServerLost is then raised here, after the hook, not inside it
    held = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGURG})
    try:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + EFFECT_BOUND_S
        while not (took_effect := _took_effect(pids, sig)) and time.monotonic() < deadline:
            time.sleep(0.01)
        _write_log(line | {"targets": targets, "took_effect": took_effect})
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)


# --- the wrapped functions -----------------------------------------------------------------------


def _before(fn: Callable, point_of: Callable[..., tuple[str, str] | None]) -> Callable:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        found = point_of(*args, **kwargs)
        if found is not None:
            reached(*found)
        return fn(*args, **kwargs)

    return wrapper


def _after(fn: Callable, point_of: Callable[..., tuple[str, str] | None]) -> Callable:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        result = fn(*args, **kwargs)
        found = point_of(*args, **kwargs)
        if found is not None:
            reached(*found)
        return result

    return wrapper


def _stage_start(stage: Any, _batch: Any, _ctx: Any, _store: Any, step: int, **_k: Any):
    _stage_now[0] = f"{stage.name} step {step}"
    return f"{stage.name}.start", f"step {step}"


def _patch_stage_task(module: Any) -> None:
    module.run_stage = _before(module.run_stage, _stage_start)
    module.save_artifact = _before(
        module.save_artifact, lambda _data, path, **k: (f"{k['stage']}.computed", str(path))
    )


def _commit_point(store: Any, *_args: Any, **_kwargs: Any) -> tuple[str, str] | None:
    parent, name = os.path.split(store.root)
    if not os.path.basename(parent).startswith("step_"):
        return None
    return f"{name}.write", store.root


def _patch_artifact_store(module: Any) -> None:
    module.Store.commit = _before(module.Store.commit, _commit_point)


def _patch_engine_checkpoint(module: Any) -> None:
    module.save_engine_checkpoint = _after(
        module.save_engine_checkpoint,
        lambda _engine, directory, client_state=None, **_options: (
            f"checkpoint.{(client_state or {}).get('role')}",
            str(directory),
        ),
    )


def _patch_checkpoints(module: Any) -> None:
    module._write_json = _after(
        module._write_json, lambda path, _data: ("checkpoint.state", str(path))
    )
    module.write_step_manifest = _after(
        module.write_step_manifest,
        lambda _root, step, _roles: ("checkpoint.manifest", f"step {step}"),
    )
    module.write_latest_step = _after(
        module.write_latest_step, lambda _root, step: ("checkpoint.tracker", f"step {step}")
    )
    module.save_run_checkpoint = _after(
        module.save_run_checkpoint, lambda _root, step, *_a: ("checkpoint.saved", f"step {step}")
    )


def _on_publisher_thread(phase: str) -> Callable[..., tuple[str, str] | None]:
    def point_of(_logger: Any, _metrics: Any, step: int) -> tuple[str, str] | None:
        if not threading.current_thread().name.startswith("ppoflow-publish"):
            return None
        return f"publish.{phase}", f"step {step}"

    return point_of


def _patch_mlflow_sink(module: Any) -> None:
    log_metrics = module.MLflowProcessSink.log_metrics
    log_metrics = _before(log_metrics, _on_publisher_thread("start"))
    module.MLflowProcessSink.log_metrics = _after(log_metrics, _on_publisher_thread("sent"))


def _patch_publisher(module: Any) -> None:
    init = module.Publisher.__init__

    @functools.wraps(init)
    def recording_init(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        _publishers.append(self)

    module.Publisher.__init__ = recording_init


def _in_agent_rollout(fn: Callable) -> Callable:
    """``agent_rollout`` noting, while it runs, which rollout it is (the agent points' detail)."""

    @functools.wraps(fn)
    def wrapper(batch: Any, prompts: Any, ctx: Any, validate: bool = False) -> Any:
        _agent_rollouts.append(f"{'validation' if validate else 'rollout'} step {ctx.step}")
        try:
            return fn(batch, prompts, ctx, validate)
        finally:
            _agent_rollouts.pop()

    return wrapper


def _agent_rollout_name() -> str:
    return _agent_rollouts[-1] if _agent_rollouts else "outside agent_rollout"


def _patch_agent_rollout(module: Any) -> None:
    module.agent_rollout = _in_agent_rollout(module.agent_rollout)


def _patch_agent_loop(module: Any) -> None:
    module._generation_round = _before(  # run_agent_loop reads the module's global at each call
        module._generation_round,
        lambda live, *_a: (
            "agent.round",
            f"{_agent_rollout_name()}: round {live[0].assistant_turns + 1}, {len(live)} live",
        ),
    )


def _recording_init(cls: type, made: list[weakref.ref]) -> None:
    """``cls.__init__`` noting each instance made in ``made`` (weakly)."""
    init = cls.__init__

    @functools.wraps(init)
    def recording_init(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        made.append(weakref.ref(self))

    cls.__init__ = recording_init


def _patch_sandbox(module: Any) -> None:
    module.ToolSandbox.run = _before(
        module.ToolSandbox.run,
        lambda _box, calls: ("agent.tools", f"{_agent_rollout_name()}: {len(calls)} calls"),
    )
    _recording_init(module.ToolSandbox, _sandboxes)


def _patch_reward_pool(module: Any) -> None:
    """Record each pool; reach ``reward.sent`` at the first ``_dispatch`` of a reward pool's
    ``map`` call, once it returned (the task lists are on the workers' sockets)."""
    _recording_init(module.ScorerPool, _pools)
    map_calls, dispatch = module.ScorerPool.map, module.ScorerPool._dispatch
    first_dispatch: set[int] = set()  # ids of the pools in a map call that has not dispatched

    @functools.wraps(map_calls)
    def marking_map(pool: Any, *args: Any, **kwargs: Any) -> Any:
        first_dispatch.add(id(pool))
        try:
            return map_calls(pool, *args, **kwargs)
        finally:
            first_dispatch.discard(id(pool))

    @functools.wraps(dispatch)
    def reaching_dispatch(pool: Any, pending: Any, calls: Any, *args: Any) -> Any:
        done = dispatch(pool, pending, calls, *args)
        if id(pool) in first_dispatch:
            first_dispatch.discard(id(pool))
            if pool.zygote_pid not in _zygotes(sandbox=True):
                sent = len(calls) - len(pending)
                reached("reward.sent", f"{_stage_now[0]}: {sent} of {len(calls)} samples sent")
        return done

    module.ScorerPool.map, module.ScorerPool._dispatch = marking_map, reaching_dispatch


def _patch_gen_rounds(module: Any) -> None:
    module._run_round = _before(  # generate_rounds reads the module's global at each call
        module._run_round,
        lambda _run, step, gen_round, _options: ("dapo.round", f"step {step}: round {gen_round}"),
    )


def _patch_replicas(module: Any) -> None:
    cls = module.ProcessReplica  # every backend's replica
    sync = _before(cls.sync, lambda replica, _weights: ("replica.sync", type(replica).__name__))
    cls.sync = _after(sync, lambda replica, _weights: ("replica.synced", type(replica).__name__))


PATCHES: dict[str, Callable[[Any], None]] = {
    "flows.gen_rounds": _patch_gen_rounds,
    "flows.stage_task": _patch_stage_task,
    "dataproto.artifact_store": _patch_artifact_store,
    "stages.engines.checkpoint": _patch_engine_checkpoint,
    "flows.runs.checkpoints": _patch_checkpoints,
    "flows.sinks.mlflow_process": _patch_mlflow_sink,
    "flows.sinks.publisher": _patch_publisher,
    "stages.agent.rollout": _patch_agent_rollout,
    "stages.agent.loop": _patch_agent_loop,
    "stages.agent.sandbox": _patch_sandbox,
    "stages.reward.pool": _patch_reward_pool,
    "stages.engines.rollout_replica": _patch_replicas,
}


class PatchAfterImport(importlib.abc.MetaPathFinder):
    """Finds a module of :data:`PATCHES` with the other finders, then patches it once it ran."""

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name not in PATCHES:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                break
        else:
            return None
        run_module = spec.loader.exec_module

        def exec_module(module: Any) -> None:
            run_module(module)
            if module.__name__ == name:  # a loader shared with other modules patches only this
                PATCHES[name](module)

        spec.loader.exec_module = exec_module
        return spec


if _SPEC:
    _TARGET, _COUNT = parse(_SPEC)
    if _FAULT_SPEC:
        _FAULT = parse_fault(_FAULT_SPEC)
    sys.meta_path.insert(0, PatchAfterImport())
