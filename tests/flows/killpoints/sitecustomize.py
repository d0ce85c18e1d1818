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
"""

from __future__ import annotations

import functools
import importlib.abc
import json
import os
import signal
import sys
import threading
from collections import Counter
from collections.abc import Callable
from typing import Any

_SPEC = os.environ.get("PPOFLOW_TEST_KILL_AT", "")
_LOG = os.environ.get("PPOFLOW_TEST_KILL_LOG")
CHECKPOINT_POINTS = ("actor", "critic", "state", "manifest", "tracker", "saved")
PUBLISH_POINTS = ("start", "sent")
STAGE_POINTS = ("start", "computed", "write")
AGENT_POINTS = ("round", "tools")
DAPO_POINTS = ("round",)
_reached: Counter[str] = Counter()
_publishers: list[Any] = []
_agent_rollouts: list[str] = []  # "rollout step 3" / "validation step 4" while one runs


def parse(spec: str) -> tuple[str, int]:
    """``"<point>:<n>"`` → (point, n); SystemExit naming the problem when it is not one."""
    point, _, count = spec.rpartition(":")
    area, _, phase = point.partition(".")
    known = (
        (area == "checkpoint" and phase in CHECKPOINT_POINTS)
        or (area == "publish" and phase in PUBLISH_POINTS)
        or (area == "agent" and phase in AGENT_POINTS)
        or (area == "dapo" and phase in DAPO_POINTS)
        or (
            area not in ("checkpoint", "publish", "agent", "dapo")
            and bool(area)
            and phase in STAGE_POINTS
        )
    )
    if not known or not count.isdigit() or int(count) < 1:
        raise SystemExit(
            f"PPOFLOW_TEST_KILL_AT={spec!r}: expected <point>:<n> with n ≥ 1 and point one of "
            f"<stage>.{{{','.join(STAGE_POINTS)}}}, checkpoint.{{{','.join(CHECKPOINT_POINTS)}}}, "
            f"publish.{{{','.join(PUBLISH_POINTS)}}}, agent.{{{','.join(AGENT_POINTS)}}}, "
            f"dapo.{{{','.join(DAPO_POINTS)}}}"
        )
    return point, int(count)


def _drain_publishers() -> None:
    """Wait for the publishing thread's current step (main-thread points; module docstring)."""
    for publisher in _publishers:
        pending = publisher._pending
        if pending is not None:
            pending.exception(timeout=300)  # done, failed or not: the store is as it will be


def _group_members(pgid: int) -> list[dict[str, Any]]:
    """pid, parent pid and command line of each live process of group ``pgid`` (from /proc)."""
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat_file:
                stat = stat_file.read()
            with open(f"/proc/{entry}/cmdline", "rb") as cmd_file:
                argv = cmd_file.read().decode(errors="replace").split("\0")
        except OSError:  # the process ended while we looked
            continue
        state, ppid, group = stat[stat.rindex(")") + 2 :].split()[:3]
        if int(group) == pgid and state not in ("Z", "X"):
            members.append({"pid": int(entry), "ppid": int(ppid), "argv": argv[:-1]})
    return members


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
    if _LOG:
        handle = os.open(_LOG, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            os.write(handle, (json.dumps(line) + "\n").encode())
            os.fsync(handle)
        finally:
            os.close(handle)
    os.killpg(os.getpgid(0), signal.SIGKILL)


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


def _patch_stage_task(module: Any) -> None:
    module.run_stage = _before(
        module.run_stage,
        lambda stage, _batch, _ctx, _store, step, **_k: (f"{stage.name}.start", f"step {step}"),
    )
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


def _patch_sandbox(module: Any) -> None:
    module.ToolSandbox.run = _before(
        module.ToolSandbox.run,
        lambda _box, calls: ("agent.tools", f"{_agent_rollout_name()}: {len(calls)} calls"),
    )


def _patch_gen_rounds(module: Any) -> None:
    module._run_round = _before(  # generate_rounds reads the module's global at each call
        module._run_round,
        lambda _run, step, gen_round, _options: ("dapo.round", f"step {step}: round {gen_round}"),
    )


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
    sys.meta_path.insert(0, PatchAfterImport())
