"""What one scoring call produced, and the body of a scorer worker process.

Imports only the standard library (and the scorer's own module, in the worker): a worker started
by the ``forkserver`` method costs ~10 ms, not the ~1.5 s a torch import would.

Protocol on the worker's pipe (parent → worker): a list of ``(task_id, pickled kwargs)`` to score
in order, or ``None`` to exit. Worker → parent: ``("ready", pid)`` once the scorer is imported
(or ``("init_error", message)`` and exit), then ``("results", [(task_id, status, score, extras,
message), ...])`` batches, in task order. Each sample is pickled on its own, so one that cannot
be unpickled in the worker fails alone.
"""

from __future__ import annotations

import math
import numbers
import os
import pickle
import signal
import time
from dataclasses import dataclass, field
from typing import Any

OK, ERROR, TIMEOUT, INVALID = "ok", "error", "timeout", "invalid"
FLUSH_S = 0.01  # a worker sends finished results at least this often while it is busy


@dataclass
class Outcome:
    """The result of scoring one sample.

    status: ``ok``, ``error`` (raised / worker died), ``timeout`` or ``invalid`` (NaN/inf,
        non-number, dict without ``score``).
    score: the finite score when ``ok`` (the caller substitutes its error score otherwise).
    extras: per-sample extra infos: every key of a dict result (``score`` included, as in verl),
        or ``{"acc": score}`` for a scalar result.
    message: why it failed (empty when ``ok``).
    """

    status: str
    score: float = 0.0
    extras: dict[str, Any] = field(default_factory=dict)
    message: str = ""


def _finite(value: Any) -> float | None:
    is_number = isinstance(value, numbers.Real) and not isinstance(value, str)
    return float(value) if is_number and math.isfinite(value) else None


def _describe(value: Any) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text[:80]}{'…' if len(text) > 80 else ''}"


def classify_result(value: Any) -> Outcome:
    """Turn a scorer's return value into an :class:`Outcome` (never raises).

    >>> classify_result(True)
    Outcome(status='ok', score=1.0, extras={'acc': 1.0}, message='')
    >>> classify_result({"score": 0.5, "pred": "7"}).extras
    {'score': 0.5, 'pred': '7'}
    >>> classify_result(float("nan")).status, classify_result("1.0").status
    ('invalid', 'invalid')
    """
    if isinstance(value, dict):
        if "score" not in value:
            return Outcome(
                INVALID, message=f"dict result has no 'score' key (keys: {sorted(value)})"
            )
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


def call_scorer(fn: Any, kwargs: dict[str, Any]) -> Outcome:
    """Run a sync scorer on one sample; an exception becomes an ``error`` outcome."""
    try:
        value = fn(**kwargs)
    except Exception as exc:
        return Outcome(ERROR, message=f"raised {type(exc).__name__}: {exc}")
    return classify_result(value)


def _score_payload(fn: Any, payload: bytes) -> Outcome:
    try:
        kwargs = pickle.loads(payload)
    except Exception as exc:  # e.g. an extra_info class the worker cannot import
        return Outcome(ERROR, message=f"sample could not be unpickled in the worker: {exc!r}")
    return call_scorer(fn, kwargs)


def _send_results(conn: Any, results: list[tuple]) -> None:
    try:
        conn.send(("results", results))
    except (pickle.PicklingError, TypeError, AttributeError):  # an extra value cannot be pickled
        safe = []
        for item in results:
            try:
                pickle.dumps(item)
            except Exception as exc:
                item = (item[0], ERROR, 0.0, {}, f"result could not be sent back: {exc!r}")
            safe.append(item)
        conn.send(("results", safe))


def worker_main(conn: Any, scorer: Any, progress: Any) -> None:
    """Worker process body: import ``scorer`` (a ``ScorerRef``), then serve task lists until None.

    ``progress`` is a shared ``[task_id, started_at]`` pair (``time.monotonic``, which is
    system-wide): written before each task and reset to ``-1`` after it, so the parent knows
    which task runs and since when without a message per task. Results are sent in batches at
    the end of each task list, or every ``FLUSH_S`` seconds while a long list runs.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is handled by the parent, which kills us
    try:
        fn = scorer.resolve()
    except BaseException as exc:
        conn.send(("init_error", f"{type(exc).__name__}: {exc}"))
        return
    conn.send(("ready", os.getpid()))
    while True:
        try:
            tasks = conn.recv()
        except EOFError:
            return
        if tasks is None:
            return
        results: list[tuple] = []
        last_send = time.monotonic()
        for task_id, payload in tasks:
            progress[1] = time.monotonic()
            progress[0] = task_id
            outcome = _score_payload(fn, payload)
            progress[0] = -1.0
            results.append(
                (task_id, outcome.status, outcome.score, outcome.extras, outcome.message)
            )
            if time.monotonic() - last_send >= FLUSH_S:
                _send_results(conn, results)
                results, last_send = [], time.monotonic()
        if results:
            _send_results(conn, results)
