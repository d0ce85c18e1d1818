"""The tool sandbox: each tool call of an agent rollout in a fresh, supervised process.

Built on the reward scorer pool (:class:`stages.reward.pool.ScorerPool`), whose supervision it
reuses: a zygote imports the tool classes once at start-up (under ``startup_timeout_s``) and
forks workers from itself (about a millisecond each); every call runs
:func:`stages.agent.tool_worker.run_tool_call` in a worker with

- a time bound, ``timeout_s`` per call: past it the worker is killed (SIGKILL) and replaced; the
  call's status is ``timeout``;
- a memory bound, ``memory_mb`` of address space beyond the fork (``RLIMIT_AS``): an allocation
  past it raises ``MemoryError`` in the tool, that call's ``error``;
- no network (unless ``allow_network``): a network namespace of its own, or an audit hook where
  namespaces are refused (:attr:`ToolSandbox.network_isolation` says which);
- its stdout and stderr passed to this process's under ``output_bytes`` per :meth:`run`;
- a fresh process per call (``calls_per_worker=1``): nothing of one call (module globals,
  threads, a corrupted interpreter) reaches the next;
- plain JSON on the wire, nothing pickled: a response text over
  :data:`~stages.agent.tool_worker.MAX_TEXT_CHARS`, or a result over the wire's bound (4 MiB,
  metrics included), is that call's ``invalid``, and a worker that dies (``os._exit``, a
  segfault) is that call's ``error``.

A call whose arguments are not JSON, or not a JSON object, or that names an unknown tool, is
answered here without a process. Every failure becomes the tool turn's text in verl's wording,
``Error when executing tool: <why>`` (verl's ``ToolAgentLoop._call_tool``: ``str(exception)``,
so an unknown tool reads ``Error when executing tool: 'name'`` as verl's ``KeyError`` does), with
no reward; :attr:`ToolResult.message` keeps the diagnostic for the logs.

Example:
    >>> spec = ToolSpec(
    ...     name="lookup",
    ...     class_name="stages.agent.tools.lookup.LookupTool",
    ...     config={"type": "native", "table": {"paris": "France"}},
    ...     schema={"type": "function", "function": {"name": "lookup"}},
    ... )
    >>> with ToolSandbox([spec], num_workers=1, timeout_s=10.0) as sandbox:
    ...     calls = [ToolCall("lookup", '{"key": "paris"}'), ToolCall("nope", "{}")]
    ...     [(r.status, r.text) for r in sandbox.run(calls)]
    [('ok', 'France'), ('unknown_tool', "Error when executing tool: 'nope'")]
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import tempfile
import time
import weakref
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stages.agent.tool_config import ToolSpec
from stages.agent.tool_worker import ERROR_PREFIX
from stages.reward.custom import ScorerRef
from stages.reward.pool import ScorerPool
from stages.reward.worker import ERROR, INVALID, OK, TIMEOUT, Outcome
from stages.reward.zygote import ScorerStartupError

STATUSES = ("ok", "error", "timeout", "invalid", "unknown_tool", "bad_arguments")
DEFAULT_TIMEOUT_S = 30.0
DEFAULT_MEMORY_MB = 1024
DEFAULT_OUTPUT_BYTES = 1 << 20
DEFAULT_STARTUP_TIMEOUT_S = 60.0
_ENTRY = '''"""The tool sandbox's zygote entry, written by stages.agent.sandbox: the tool classes of
{origin} are imported once here, so every worker forked from the zygote holds them."""

import json

from stages.agent.tool_config import ToolSpec, check_tool_classes
from stages.agent.tool_worker import remember_classes, run_tool_call  # noqa: F401 (the entry)

remember_classes(check_tool_classes(ToolSpec(**spec) for spec in json.loads({specs!r})))
'''


class ToolStartupError(RuntimeError):
    """The sandbox could not start: a tool class is missing or broken, or its import hung
    (one line naming the tool's config item)."""


@dataclass(frozen=True)
class ToolCall:
    """One call the model wrote.

    name: the tool's name (the schema's ``function.name``).
    arguments: the arguments' JSON text as the model wrote it (verl's ``FunctionCall.arguments``).
    create_kwargs: the sample's ``tools_kwargs[name]["create_kwargs"]`` ({} when absent), given
        to the tool's ``create``; plain data.
    """

    name: str
    arguments: str
    create_kwargs: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.arguments, str):
            raise TypeError(
                f"ToolCall.arguments is a {type(self.arguments).__name__}; expected the JSON "
                "text the model wrote (a str)"
            )
        if not isinstance(self.create_kwargs, dict):
            raise TypeError(
                f"ToolCall.create_kwargs is a {type(self.create_kwargs).__name__}; expected a dict"
            )


@dataclass(frozen=True)
class ToolResult:
    """What one call gave.

    text: the tool turn's text (on failure ``Error when executing tool: <why>``).
    reward: the step reward the tool returned; None when it returned none or the call failed.
    status: ``ok``, ``error`` (the tool raised, returned something that is not a response, or
        its process died), ``timeout``, ``invalid`` (a result the boundary refuses: a text over
        ``MAX_TEXT_CHARS``, over 4 MiB in all, or metrics that are not plain data),
        ``unknown_tool`` or ``bad_arguments``.
    seconds: the call's time in its process; for a timeout the bound; for a result lost with its
        process or refused at the boundary, the whole :meth:`ToolSandbox.run`'s; 0 for calls
        answered without a process.
    message: the diagnostic for the logs ("" when ok): exception type, message and frame.
    metrics: the tool's metrics (plain data; {} unless ok).
    """

    text: str
    reward: float | None
    status: str
    seconds: float
    message: str = ""
    metrics: dict[str, Any] = field(default_factory=dict)


class ToolSandbox:
    """Runs tool calls of the tools ``specs`` in supervised processes (module docstring).

    Args:
        specs: the tools (:func:`stages.agent.tool_config.load_tool_config`); names unique. With
            none, no process starts and every call is ``unknown_tool`` (verl's loop without a
            tool config).
        num_workers: processes that run calls at the same time.
        timeout_s: bound on one call (create + execute + release), in seconds.
        memory_mb: address space a call may add to its process, in MiB.
        output_bytes: the tools' stdout and stderr passed on per :meth:`run`, in bytes.
        allow_network: let tools reach the network (default: no network).
        startup_timeout_s: bound on importing the tool classes at start, in seconds.

    Raises:
        ValueError: duplicate names, or a bound out of range.
        ToolStartupError: a tool class cannot be imported, lacks a method, or its import hung.
    """

    def __init__(
        self,
        specs: Iterable[ToolSpec],
        *,
        num_workers: int = 4,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        memory_mb: int = DEFAULT_MEMORY_MB,
        output_bytes: int = DEFAULT_OUTPUT_BYTES,
        allow_network: bool = False,
        startup_timeout_s: float = DEFAULT_STARTUP_TIMEOUT_S,
    ) -> None:
        self.specs = _by_name(specs)
        if not timeout_s > 0:
            raise ValueError(f"tool sandbox timeout_s must be > 0 s, got {timeout_s}")
        self.timeout_s = timeout_s
        self.memory_mb = memory_mb
        self.counts: Counter[str] = Counter()  # calls answered, by status
        self.seconds_total = 0.0  # sum of ToolResult.seconds
        self._closed = False
        self._dir = Path(tempfile.mkdtemp(prefix="ppoflow-tools-"))
        self._cleanup = weakref.finalize(self, shutil.rmtree, self._dir, ignore_errors=True)
        self._pool: ScorerPool | None = None  # none without tools: every call is unknown_tool
        if not self.specs:
            return
        try:
            self._pool = ScorerPool(
                ScorerRef(name="run_tool_call", path=str(self._write_entry())),
                num_workers,
                startup_timeout_s=startup_timeout_s,
                memory_mb=memory_mb,
                output_bytes=output_bytes,
                no_network=not allow_network,
                calls_per_worker=1,
            )
        except ScorerStartupError as exc:
            self._cleanup()
            raise ToolStartupError(_startup_message(exc, self.specs, startup_timeout_s)) from None
        except BaseException:
            self._cleanup()
            raise

    def _write_entry(self) -> Path:
        """The zygote's entry module (``_ENTRY``), with the specs as JSON, in a private dir."""
        specs = [dataclasses.asdict(spec) for spec in self.specs.values()]
        try:
            text = json.dumps(specs)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"tool specs must hold plain data (JSON): {exc}") from None
        origins = sorted({spec.origin.rsplit(": ", 1)[0] for spec in self.specs.values()})
        entry = self._dir / "tool_sandbox_entry.py"
        entry.write_text(_ENTRY.format(origin=", ".join(origins) or "the sandbox", specs=text))
        return entry

    # --- calls ---
    def run(self, calls: Sequence[ToolCall]) -> list[ToolResult]:
        """Run every call, concurrently on the workers; the i-th result answers ``calls[i]``.

        Never raises for a tool's failure (that is the call's result). Raises ``RuntimeError``
        after :meth:`close`, and :class:`stages.reward.zygote.ScorerProcessError` if the sandbox's zygote died twice in
        this run (killed from outside) or could not be restarted.
        """
        if self._closed:
            raise RuntimeError("ToolSandbox.run called after close()")
        started = time.monotonic()
        results: list[ToolResult | None] = [None] * len(calls)
        samples: list[dict[str, Any]] = []
        sent: list[int] = []
        for index, call in enumerate(calls):
            answer = self._prepare(call)
            if isinstance(answer, ToolResult):
                results[index] = answer
            else:
                samples.append(answer)
                sent.append(index)
        outcomes = self._pool.map(samples, self.timeout_s) if self._pool and samples else []
        elapsed = time.monotonic() - started
        for index, outcome in zip(sent, outcomes):
            results[index] = self._result(outcome, elapsed)
        for result in results:
            self.counts[result.status] += 1
            self.seconds_total += result.seconds
        return results  # type: ignore[return-value]

    def _prepare(self, call: ToolCall) -> dict[str, Any] | ToolResult:
        """The call's sample for a worker, or its answer when it needs no process (verl's order:
        the arguments are parsed first, then the tool is looked up)."""
        try:
            parameters = json.loads(call.arguments)
        except json.JSONDecodeError as exc:
            return _answered("bad_arguments", str(exc), f"arguments are not JSON: {exc}")
        spec = self.specs.get(call.name)
        if spec is None:
            known = sorted(self.specs)
            return _answered("unknown_tool", repr(call.name), f"no tool {call.name!r}: {known}")
        if not isinstance(parameters, dict):
            why = f"the arguments must be a JSON object, got {type(parameters).__name__}"
            return _answered("bad_arguments", why, why)
        return {
            "class_name": spec.class_name,
            "config": spec.config,
            "schema": spec.schema,
            "parameters": parameters,
            "create_kwargs": call.create_kwargs,
        }

    def _result(self, outcome: Outcome, elapsed: float) -> ToolResult:
        if outcome.status == TIMEOUT:
            why = f"timed out after {self.timeout_s:g} s"
            return ToolResult(ERROR_PREFIX + why, None, "timeout", self.timeout_s, outcome.message)
        if outcome.status in (ERROR, INVALID):
            status = "error" if outcome.status == ERROR else "invalid"
            return ToolResult(
                ERROR_PREFIX + outcome.message, None, status, elapsed, outcome.message
            )
        assert outcome.status == OK, outcome.status
        out = outcome.extras
        if out["status"] != "ok":
            error = out["error"]
            if out["error_type"] == "MemoryError":
                error = f"out of memory (the tool sandbox allows {self.memory_mb} MiB per call)"
            message = out["detail"]
            return ToolResult(ERROR_PREFIX + error, None, out["status"], out["seconds"], message)
        reward = out["score"] if out["has_reward"] else None
        return ToolResult(out["text"], reward, "ok", out["seconds"], "", out["metrics"])

    # --- state ---
    @property
    def network_isolation(self) -> str | None:
        """``"namespace"`` or ``"audit-hook"`` (how the network is cut); None with
        ``allow_network``, or without tools (no process runs)."""
        return None if self._pool is None else self._pool.network_isolation

    @property
    def restarts(self) -> int:
        """Workers replaced so far (one per call: each call gets a fresh process)."""
        return 0 if self._pool is None else self._pool.restarts

    @property
    def output_dropped_total(self) -> int:
        """Bytes of tool stdout / stderr dropped past ``output_bytes`` over the sandbox's life."""
        return 0 if self._pool is None else self._pool.output_dropped_total

    @property
    def worker_pids(self) -> list[int]:
        return [] if self._pool is None else self._pool.worker_pids

    def close(self) -> None:
        """Stop every worker and the zygote; remove the entry file (idempotent)."""
        self._closed = True
        if self._pool is not None:
            self._pool.close()
        self._cleanup()

    @property
    def closed(self) -> bool:
        return self._closed

    def __enter__(self) -> ToolSandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _by_name(specs: Iterable[ToolSpec]) -> dict[str, ToolSpec]:
    by_name: dict[str, ToolSpec] = {}
    for spec in specs:
        if spec.name in by_name:
            raise ValueError(f"two tools are named {spec.name!r}; tool names must be unique")
        by_name[spec.name] = spec
    return by_name


def _answered(status: str, why: str, message: str) -> ToolResult:
    return ToolResult(ERROR_PREFIX + why, None, status, 0.0, message)


def _startup_message(exc: ScorerStartupError, specs: dict[str, ToolSpec], timeout_s: float) -> str:
    """One line for a failed start: the tool config's own error, or the hang / the death."""
    text = str(exc)
    loaded = " could not be loaded: "
    if loaded in text:
        detail = text.split(loaded, 1)[1]
        return detail.removeprefix("ValueError: ")
    tools = ", ".join(f"{s.name} ({s.class_name})" for s in specs.values())
    if "did not finish importing" in text:
        return (
            f"tool sandbox: importing the tool classes of {tools} did not finish within "
            f"{timeout_s:g} s (startup_timeout_s); a tool module's import hangs or is slower"
        )
    return f"tool sandbox for {tools} could not start: {text}"


__all__ = [
    "STATUSES",
    "ToolCall",
    "ToolResult",
    "ToolSandbox",
    "ToolStartupError",
]
