"""Step results leave the training loop on one background thread, in order.

Logging a step's metrics to MLflow and publishing its Prefect report take tens of milliseconds
of I/O per step (``bench/orchestration.py``); the next step does not need either, so
:class:`Publisher` runs them on a single worker thread while the next step computes. Calls run in
submission order, each in a copy of the submitting thread's context (so Prefect's flow-run
context, which names the run a report belongs to, carries over).

At most one submission is in flight: :meth:`Publisher.submit` first waits for the previous one,
so an error there (one the MLflow logger does not absorb as an outage) surfaces one step later at
the latest. Call :meth:`wait` before anything else touches the same objects (validation logs its
generations through the same MLflow logger) and :meth:`close` at the end.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any


class Publisher:
    """One background thread for a run's per-step I/O (module docstring)."""

    def __init__(self) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ppoflow-publish")
        self._pending: Future | None = None

    def submit(self, fn: Callable[..., Any], *args: Any) -> None:
        """Run ``fn(*args)`` on the publishing thread after the previous call finished."""
        self.wait()
        self._pending = self._pool.submit(contextvars.copy_context().run, fn, *args)

    def wait(self) -> None:
        """Block until the last submission finished; re-raise its exception if it failed."""
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.result()

    def close(self) -> None:
        """Wait for the last submission (re-raising its error) and stop the thread."""
        try:
            self.wait()
        finally:
            self._pool.shutdown(wait=True)
