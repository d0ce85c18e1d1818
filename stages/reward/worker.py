"""What one scoring call produced, and the body of a scorer worker process.

Imports only the standard library (and :mod:`stages.reward.wire`, which does too): a worker is
forked from the scorer's fork server (``stages.reward.zygote``), which imported this module, the
scorer and nothing else.

Protocol on the worker's socket, frames of plain JSON (:mod:`stages.reward.wire`; nothing is
pickled either way). Driver → worker: ``{"tasks": [[task_id, sample], ...]}`` to score in
order (each sample a kwargs dict as plain data), or ``{"exit": true}``. Worker → driver:
``{"results": [[task_id, status, score, message, extras], ...], "retire": bool}``, in task
order. The worker checks each result before it leaves (:func:`encode_result`): a finite number,
or a dict with a finite ``score`` whose extras are plain data under names that are not batch
keys; anything else is that sample's ``invalid`` outcome with a message naming the type, so a
scorer's object never reaches the driver, which rebuilds plain data only
(:func:`decode_result`). A ``MemoryError`` (the worker's memory limit, ``reward.worker_memory_mb``)
is that sample's ``error``, and the worker leaves (``"retire": true``) for a fresh one; so does a
worker that has served ``calls_per_worker`` calls (:class:`WorkerLimits`; the tool sandbox,
``stages.agent.sandbox``, gives every call a fresh process that way).

Sync and ``async def`` scorers run the same way: a call that returns an awaitable is run to
completion on the worker's own event loop, so the driver's per-sample timeout (which kills the
worker) bounds an async scorer that blocks exactly as it bounds a sync one.
"""

from __future__ import annotations

import contextlib
import inspect
import math
import mmap
import numbers
import signal
import socket
import sys
import time
import traceback
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from stages.reward.wire import (
    MAX_MESSAGE_CHARS,
    MAX_RESULT_BYTES,
    SUPPORTED,
    TAGS,
    NotPlain,
    dumps,
    from_plain,
    loads,
    recv_frame,
    send_frame,
    to_plain,
)

OK, ERROR, TIMEOUT, INVALID = "ok", "error", "timeout", "invalid"
FLUSH_S = 0.01  # a worker sends finished results at least this often while it is busy
MEMORY_KEY = "reward.worker_memory_mb"


@dataclass
class Outcome:
    """The result of scoring one sample.

    status: ``ok``, ``error`` (raised / worker died), ``timeout`` or ``invalid`` (not a finite
        number, a dict without a finite ``score``, extras the artifact cannot store).
    score: the finite score when ``ok`` (the caller substitutes its error score otherwise).
    extras: per-sample extra infos: every key of a dict result (``score`` included, as in verl),
        or ``{"acc": score}`` for a scalar result.
    message: why it failed (empty when ``ok``); for a raise, the exception's type, message and
        the innermost frame (file, line, function).
    """

    status: str
    score: float = 0.0
    extras: dict[str, Any] = field(default_factory=dict)
    message: str = ""


class ProgressSlot:
    """A worker's ``(task_id, started_at)`` pair in 16 bytes of memory shared with the driver.

    The worker writes ``started_at`` (``time.monotonic``, system-wide) then ``task_id`` before a
    task and resets ``task_id`` to -1 after it; :meth:`read` reads ``task_id`` twice around
    ``started_at``, so a pair torn by a concurrent write is reported as "look again" (None).
    """

    SIZE = 16

    def __init__(self, buffer: mmap.mmap) -> None:
        self._buffer = buffer
        self._slot = memoryview(buffer).cast("d")
        self._slot[0] = -1.0

    def start(self, task_id: int) -> None:
        self._slot[1] = time.monotonic()
        self._slot[0] = float(task_id)

    def clear(self) -> None:
        self._slot[0] = -1.0

    def read(self) -> tuple[int, float] | None:
        """(task id, start time) of the running task, or None between tasks / mid-write."""
        task, since, again = self._slot[0], self._slot[1], self._slot[0]
        return None if task < 0 or task != again else (int(task), since)

    def close(self) -> None:
        self._slot.release()
        self._buffer.close()


def _finite(value: Any) -> float | None:
    is_number = isinstance(value, numbers.Real) and not isinstance(value, str)
    return float(value) if is_number and math.isfinite(value) else None


def _describe(value: Any) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text[:80]}{'…' if len(text) > 80 else ''}"


def classify_result(value: Any) -> Outcome:
    """Turn a scorer's return value into an :class:`Outcome` (never raises).

    A finite real number (bool and numpy scalars included) is a score. NaN and ±inf are invalid:
    one inf reward makes its group's mean and std inf / NaN and so every advantage of the group.

    >>> classify_result(True)
    Outcome(status='ok', score=1.0, extras={'acc': 1.0}, message='')
    >>> classify_result({"score": 0.5, "pred": "7"}).extras
    {'score': 0.5, 'pred': '7'}
    >>> [classify_result(v).status for v in (float("nan"), float("inf"), "1.0", None)]
    ['invalid', 'invalid', 'invalid', 'invalid']
    """
    if isinstance(value, dict):
        if "score" not in value:
            keys = sorted(map(repr, value))
            return Outcome(INVALID, message=f"dict result has no 'score' key (keys: {keys})")
        score = _finite(value["score"])
        if score is None:
            return Outcome(INVALID, message=f"dict 'score' is {_describe(value['score'])}")
        return Outcome(OK, score, dict(value))
    score = _finite(value)
    if score is None:
        return Outcome(
            INVALID,
            message=f"returned {_describe(value)}; expected a finite number or a dict with 'score'",
        )
    return Outcome(OK, score, {"acc": score})


def describe_exception(exc: BaseException) -> str:
    """``raised <Type>: <message> (at <file>:<line> in <function>)``: the innermost frame outside
    this module (none for a call that failed before entering the scorer: a wrong signature).

    >>> try:
    ...     {}["k"]
    ... except KeyError as exc:
    ...     describe_exception(exc).split(" (at ")[0]
    "raised KeyError: 'k'"
    """
    here = describe_exception.__code__.co_filename  # this module, as tracebacks spell it
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename != here]
    where = (
        f" (at {frames[-1].filename}:{frames[-1].lineno} in {frames[-1].name})" if frames else ""
    )
    return f"raised {type(exc).__name__}: {exc}{where}"


class AwaitRunner:
    """Runs awaitables to completion on one event loop per worker process, made on first use."""

    def __init__(self) -> None:
        self._runner: Any = None

    def __call__(self, awaitable: Awaitable[Any]) -> Any:
        if self._runner is None:
            import asyncio

            self._runner = asyncio.Runner()
        return self._runner.run(_await(awaitable))


async def _await(awaitable: Awaitable[Any]) -> Any:
    return await awaitable


def call_scorer(
    fn: Callable[..., Any], kwargs: dict[str, Any], run_awaitable: Callable[[Any], Any]
) -> Outcome:
    """Run a scorer on one sample (awaiting its result when it returns an awaitable); an
    exception (a wrong signature's ``TypeError`` included) becomes an ``error`` outcome, except
    ``MemoryError``, which the worker handles (:func:`score_task`: it then leaves)."""
    try:
        value = fn(**kwargs)
        if inspect.isawaitable(value):
            value = run_awaitable(value)
    except MemoryError:
        raise
    except Exception as exc:
        return Outcome(ERROR, message=describe_exception(exc))
    return classify_result(value)


def _truncate(text: str) -> str:
    return text if len(text) <= MAX_MESSAGE_CHARS else text[: MAX_MESSAGE_CHARS - 1] + "…"


def _plain_extras(extras: dict[Any, Any], reserved: frozenset[str]) -> tuple[Any, str | None]:
    """(the extras as plain data, None), or (None, why not): every name a non-empty str that is
    not a batch key (``reserved``), every value plain data (:mod:`stages.reward.wire`: what the
    artifact stores, ``stages.reward.accounting``).

    >>> _plain_extras({"score": 1.0, "pred": ["7", (1, 2.5)]}, frozenset())[1] is None
    True
    >>> _plain_extras({"score": 1.0, "info": {"a": [{1, 2}]}}, frozenset())[1].split(",")[0]
    "extra 'info'['a'][0] is a builtins.set"
    """
    for name in extras:
        if type(name) is not str or not name:
            return None, f"extra name {name!r} is not a non-empty str"
        if name in reserved:
            return None, f"extra {name!r} has the name of a batch key of its own; rename it"
    try:
        return to_plain(extras), None
    except NotPlain as err:
        name, where = err.path[0][1:-1], "".join(err.path[1:])  # path[0] is ['<name>']
        return None, (
            f"extra {name}{where} is a {err.type_name}, which the artifact cannot store and "
            "which could not be sent back: a result could not be read back in the driver unless "
            f"it is plain data ({SUPPORTED})"
        )


def encode_result(task_id: int, outcome: Outcome, reserved: frozenset[str] = frozenset()) -> bytes:
    """One result as the worker sends it: ``[task_id, status, score, message, extras]`` in plain
    JSON. Extras that are not plain data, or a result over ``MAX_RESULT_BYTES``, make the sample
    ``invalid`` with a message naming the type (or the size): none of the scorer's objects leaves
    the worker. ``MemoryError`` propagates (the worker then leaves).
    """
    if outcome.status == OK:
        try:
            extras, why = _plain_extras(outcome.extras, reserved)
            if why is None:
                data = dumps([task_id, OK, outcome.score, "", extras])
                if len(data) <= MAX_RESULT_BYTES:
                    return data
                why = (
                    f"the result is {len(data)} bytes of plain data, over the "
                    f"{MAX_RESULT_BYTES}-byte bound on one sample's result"
                )
        except MemoryError:
            raise
        except Exception as exc:  # an int too long for str(), a structure nested too deep, …
            why = f"the result could not be sent back ({type(exc).__name__}: {exc})"
        outcome = Outcome(INVALID, message=why)
    return dumps([task_id, outcome.status, 0.0, _truncate(outcome.message), {}])


def decode_result(entry: Any) -> tuple[int, Outcome]:
    """The driver's reading of one :func:`encode_result` entry (already parsed JSON).

    Nothing of it is executed: the extras are rebuilt by :func:`stages.reward.wire.from_plain`.
    Raises ``ValueError`` when the entry is not one :func:`encode_result` writes.
    """
    if type(entry) is not list or len(entry) != 5:
        raise ValueError("a result is not [task_id, status, score, message, extras]")
    task_id, status, score, message, extras = entry
    if type(task_id) is not int or status not in (OK, ERROR, INVALID) or type(message) is not str:
        raise ValueError("a result has a malformed task id, status or message")
    if status != OK:
        return task_id, Outcome(status, message=message)
    if type(score) not in (int, float) or not math.isfinite(score):
        raise ValueError(f"an ok result has the score {score!r}")
    if type(extras) is not dict:
        raise ValueError("a result's extras are not a JSON object")
    decoded = from_plain(extras)  # a JSON object's names are str, unless it is a tag
    tagged = len(extras) == 1 and not extras.keys().isdisjoint(TAGS)
    if type(decoded) is not dict or (tagged and not all(type(k) is str for k in decoded)):
        raise ValueError("a result's extras are not a dict with str names")
    return task_id, Outcome(OK, float(score), decoded, "")


@dataclass(frozen=True)
class WorkerLimits:
    """What the driver tells every worker (through the zygote's start-up message).

    reserved_names: extra names that are batch keys (``stages.reward.accounting``).
    memory_mb: the address space a worker may add to what it had when forked (MiB; None: no
        bound), set as ``RLIMIT_AS`` by the zygote; named in the message of a ``MemoryError``.
    no_network: the worker gets no network (the zygote moves it into a network namespace of
        its own, or refuses socket use by an audit hook where namespaces are not allowed).
    calls_per_worker: a worker leaves (``"retire": true``) after this many calls, so a fresh
        fork serves the next ones (1: a process per call); None: it serves until it fails.
    """

    reserved_names: frozenset[str] = frozenset()
    memory_mb: int | None = None
    no_network: bool = False
    calls_per_worker: int | None = None


def _memory_message(exc: MemoryError, limits: WorkerLimits) -> str:
    text = describe_exception(exc)
    if limits.memory_mb is not None:
        text += (
            f"; the worker reached its memory limit ({MEMORY_KEY} = {limits.memory_mb} MiB above "
            "the scorer's import)"
        )
    return text + "; the worker is replaced"


def score_task(
    fn: Callable[..., Any],
    task_id: int,
    sample: Any,
    run_awaitable: Callable[[Any], Any],
    limits: WorkerLimits,
) -> tuple[bytes, bool]:
    """Decode one sample, score it, encode the result; returns (result, retire).

    ``retire`` is True after a ``MemoryError`` (from the scorer or from encoding its result): the
    sample is an ``error`` and the worker leaves, so a fresh one takes its place.
    """
    message = None
    try:
        try:
            kwargs = from_plain(sample)
        except MemoryError:
            raise
        except Exception as exc:
            outcome = Outcome(ERROR, message=f"sample could not be decoded in the worker: {exc!r}")
        else:
            outcome = call_scorer(fn, kwargs, run_awaitable)
        return encode_result(task_id, outcome, limits.reserved_names), False
    except MemoryError as exc:
        message = _memory_message(exc, limits)
        exc.__traceback__ = None  # drop the scorer's frames (and what they hold) now
    return encode_result(task_id, Outcome(ERROR, message=message)), True


class _Results:
    """Encoded results waiting to be sent as one frame (at most ``MAX_RESULT_BYTES`` of them)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.parts: list[bytes] = []
        self.size = 0
        self.last_send = time.monotonic()

    def add(self, part: bytes) -> None:
        if self.parts and self.size + len(part) > MAX_RESULT_BYTES:
            self.send()
        self.parts.append(part)
        self.size += len(part)

    def send(self, *, retire: bool = False) -> None:
        _flush_output()  # what the scorer printed reaches the driver before its results
        if self.parts or retire:
            body = b'{"results":[' + b",".join(self.parts) + b'],"retire":'
            send_frame(self.sock, body + (b"true}" if retire else b"false}"))
        self.parts, self.size, self.last_send = [], 0, time.monotonic()


def _flush_output() -> None:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()


def worker_main(
    sock: socket.socket, fn: Callable[..., Any], progress: ProgressSlot, limits: WorkerLimits
) -> None:
    """Worker process body: serve task lists with the (already imported) scorer ``fn`` until
    told to exit or the driver's end closes.

    ``progress`` is written before each task and cleared after its result is encoded, so the
    driver knows which task runs and since when without a message per task (and its timeout
    covers the encoding too). Results are sent in frames at the end of each task list, or every
    ``FLUSH_S`` seconds while a long list runs. After a ``MemoryError``, or after
    ``limits.calls_per_worker`` calls, the worker sends what it has with ``"retire": true`` and
    exits.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the driver's; it stops us
    run_awaitable = AwaitRunner()
    calls_left = limits.calls_per_worker
    while True:
        try:
            payload = recv_frame(sock)
        except OSError:
            return
        if payload is None:
            return
        request = loads(payload)
        if "tasks" not in request:
            return
        results = _Results(sock)
        for task_id, sample in request["tasks"]:
            progress.start(task_id)
            part, retire = score_task(fn, task_id, sample, run_awaitable, limits)
            progress.clear()
            results.add(part)
            if calls_left is not None:
                calls_left -= 1
                retire = retire or calls_left <= 0
            if retire:
                results.send(retire=True)
                return
            if time.monotonic() - results.last_send >= FLUSH_S:
                results.send()
        results.send()
