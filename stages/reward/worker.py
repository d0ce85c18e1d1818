"""What one scoring call produced, and the body of a scorer worker process.

Imports only the standard library: a worker is forked from the scorer's fork server
(``stages.reward.zygote``), which imported this module, the scorer and nothing else.

Protocol on the worker's socket (driver → worker): a list of ``(task_id, pickled kwargs)`` to
score in order, or ``None`` to exit. Worker → driver: ``("results", [(task_id, pickled outcome),
...])`` batches, in task order. Each sample and each outcome is pickled on its own, so a sample
that cannot be unpickled in the worker, or an outcome that cannot be pickled here or unpickled in
the driver (:func:`read_outcome`), fails alone as ``invalid``.

Sync and ``async def`` scorers run the same way: a call that returns an awaitable is run to
completion on the worker's own event loop, so the driver's per-sample timeout (which kills the
worker) bounds an async scorer that blocks exactly as it bounds a sync one.
"""

from __future__ import annotations

import inspect
import math
import mmap
import numbers
import pickle
import signal
import time
import traceback
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

OK, ERROR, TIMEOUT, INVALID = "ok", "error", "timeout", "invalid"
FLUSH_S = 0.01  # a worker sends finished results at least this often while it is busy


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
    exception (a wrong signature's ``TypeError`` included) becomes an ``error`` outcome."""
    try:
        value = fn(**kwargs)
        if inspect.isawaitable(value):
            value = run_awaitable(value)
    except Exception as exc:
        return Outcome(ERROR, message=describe_exception(exc))
    return classify_result(value)


def _score_payload(fn: Any, payload: bytes, run_awaitable: Callable[[Any], Any]) -> Outcome:
    try:
        kwargs = pickle.loads(payload)
    except Exception as exc:  # e.g. an extra_info class the worker cannot import
        return Outcome(ERROR, message=f"sample could not be unpickled in the worker: {exc!r}")
    return call_scorer(fn, kwargs, run_awaitable)


def pack_outcome(outcome: Outcome) -> bytes:
    """The outcome pickled; one that cannot be pickled becomes an ``invalid`` outcome saying why."""
    try:
        return pickle.dumps(outcome)
    except Exception as exc:
        message = (
            f"the result could not be sent back ({type(exc).__name__}: {exc}); extras must be "
            "plain data (numbers, str, None, lists, tuples, dicts)"
        )
        return pickle.dumps(Outcome(INVALID, message=message))


def read_outcome(packed: bytes) -> Outcome:
    """Inverse of :func:`pack_outcome` in the driver; a result the driver cannot unpickle (an
    instance of a class defined in the scorer's file, …) becomes an ``invalid`` outcome."""
    try:
        outcome = pickle.loads(packed)
    except Exception as exc:
        message = (
            f"the result could not be read back in the driver ({type(exc).__name__}: {exc}); "
            "extras must be plain data (numbers, str, None, lists, tuples, dicts)"
        )
        return Outcome(INVALID, message=message)
    if not isinstance(outcome, Outcome):
        return Outcome(INVALID, message=f"worker answered {_describe(outcome)}, not an Outcome")
    return outcome


def worker_main(conn: Any, fn: Callable[..., Any], progress: ProgressSlot) -> None:
    """Worker process body: serve task lists with the (already imported) scorer ``fn`` until None.

    ``progress`` is written before each task and cleared after it, so the driver knows which task
    runs and since when without a message per task. Results are sent in batches at the end of
    each task list, or every ``FLUSH_S`` seconds while a long list runs.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the driver's; it stops us
    run_awaitable = AwaitRunner()
    while True:
        try:
            tasks = conn.recv()
        except (EOFError, OSError):
            return
        if tasks is None:
            return
        results: list[tuple[int, bytes]] = []
        last_send = time.monotonic()
        for task_id, payload in tasks:
            progress.start(task_id)
            outcome = _score_payload(fn, payload, run_awaitable)
            progress.clear()
            results.append((task_id, pack_outcome(outcome)))
            if time.monotonic() - last_send >= FLUSH_S:
                conn.send(("results", results))
                results, last_send = [], time.monotonic()
        if results:
            conn.send(("results", results))
