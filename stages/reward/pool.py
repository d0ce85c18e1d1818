"""A long-lived pool of scorer processes with a per-sample timeout that really bounds time.

Why not ``concurrent.futures.ProcessPoolExecutor``: it cannot cancel a running call, so one hung
scorer holds a worker forever, and a worker that dies breaks the whole executor. Here each worker
is a process with its own socket and a shared ``[task_id, started_at]`` progress slot. The
driver sends each worker short ordered task lists (two lists in flight, so it never idles), the
worker answers in batches, and the progress slot tells the driver which task runs and since when.

Workers are forked from the scorer's zygote (``stages.reward.zygote``), which imported the
scorer once, at start-up, under ``startup_timeout_s``; a worker therefore holds the standard
library, ``stages.reward.worker`` and the scorer's module — no torch, no trainer — and a
replacement is ready in about a millisecond:

- timeout: when the running task passes ``timeout_s``, the worker is killed (SIGKILL), that task
  gets a ``timeout`` outcome, the worker's other unanswered tasks go back to the queue (finished
  but unsent ones are scored again), and a freshly forked worker replaces it;
- death: a worker that exits (``os._exit``, a segfault, an OOM kill) closes its socket; the task
  it was running gets an ``error`` outcome with its exit code, the rest are re-queued, and the
  worker is replaced;
- the zygote itself dying (it runs no scorer call, so only an outside kill does that) is found
  at the next replacement: every worker is replaced, their tasks re-queued, and a new zygote
  imports the scorer again under ``startup_timeout_s``.

The driver wakes at least every ``timeout_s / 4`` (≤ 50 ms) to check the progress slots, so a
timeout fires within that margin. The pool lives for the run; call :meth:`close` at the end (or
use ``with``).

Example:
    >>> from stages.reward.custom import DEFAULT_SCORER
    >>> with ScorerPool(DEFAULT_SCORER, num_workers=1) as pool:
    ...     call = dict(data_source="openai/gsm8k", solution_str="#### 3", ground_truth="3")
    ...     [o.score for o in pool.map([call], timeout_s=5.0)]
    [1.0]
"""

from __future__ import annotations

import contextlib
import math
import os
import pickle
import signal
import threading
import time
import weakref
from collections import deque
from collections.abc import Sequence
from multiprocessing.connection import wait
from typing import Any

from stages.reward.custom import ScorerRef
from stages.reward.worker import ERROR, TIMEOUT, Outcome, read_outcome
from stages.reward.zygote import ScorerInfo, SpawnedWorker, Zygote, ZygoteGone

DEFAULT_STARTUP_TIMEOUT_S = 60.0


class _Worker:
    """One forked scorer process as the pool tracks it: its unanswered task ids, in order."""

    def __init__(self, spawned: SpawnedWorker) -> None:
        self.conn = spawned.conn
        self.progress = spawned.progress
        self.pid = spawned.pid
        self.dead = False
        self.closed = False
        self.inflight: deque[int] = deque()

    def running(self) -> tuple[int, float] | None:
        """(task id, start time) of the task the worker is running, or None between tasks."""
        running = self.progress.read()
        return running if running is not None and running[0] in self.inflight else None

    def kill(self) -> None:
        if not self.closed:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)
        self.close()

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.conn.close()
            self.progress.close()


class _State:
    """What the finalizer needs: the workers and the zygote (no reference to the pool)."""

    def __init__(self) -> None:
        self.workers: list[_Worker] = []
        self.zygote: Zygote | None = None


def _shutdown(state: _State) -> None:
    """Ask every worker to exit, then close the zygote, which kills and reaps what is left."""
    for worker in state.workers:
        with contextlib.suppress(OSError):
            worker.conn.send(None)
        worker.close()
    state.workers.clear()
    if state.zygote is not None:
        state.zygote.close()
        state.zygote = None


class ScorerPool:
    """``num_workers`` processes scoring with ``scorer``; :meth:`map` bounds each call's time.

    Args:
        scorer: the function to call (imported in the zygote, never in this process).
        num_workers: worker processes.
        startup_timeout_s: bound on the scorer's import (``reward.startup_timeout_s``).
        max_chunk: most tasks in one list sent to a worker.

    Raises:
        ScorerStartupError: the scorer's import hung past ``startup_timeout_s``, failed, or
            lacks the function (one line naming the file and the cause).
    """

    def __init__(
        self,
        scorer: ScorerRef,
        num_workers: int = 8,
        *,
        startup_timeout_s: float = DEFAULT_STARTUP_TIMEOUT_S,
        max_chunk: int = 16,
    ) -> None:
        if num_workers < 1:
            raise ValueError(f"reward.num_workers must be >= 1, got {num_workers}")
        if startup_timeout_s <= 0:
            raise ValueError(f"reward.startup_timeout_s must be > 0 s, got {startup_timeout_s}")
        self.scorer = scorer
        self.num_workers = num_workers
        self.startup_timeout_s = startup_timeout_s
        self.max_chunk = max(1, max_chunk)
        self.restarts = 0  # workers replaced after a timeout or a death, over the pool's life
        self.zygote_restarts = 0
        self._lock = threading.Lock()
        self._state = _State()
        self._finalizer = weakref.finalize(self, _shutdown, self._state)
        try:
            self._state.zygote = Zygote(scorer, startup_timeout_s)
            self._workers.extend(self._spawn() for _ in range(num_workers))
        except BaseException:
            self.close()
            raise

    @property
    def info(self) -> ScorerInfo:
        """What the zygote learnt while importing the scorer (prompt wanted, async, threads)."""
        assert self._state.zygote is not None, "ScorerPool.info after close()"
        return self._state.zygote.info

    @property
    def worker_pids(self) -> list[int]:
        return [worker.pid for worker in self._workers]

    @property
    def _workers(self) -> list[_Worker]:
        return self._state.workers

    # --- life cycle ---
    def _spawn(self) -> _Worker:
        """A freshly forked worker (raises ``ZygoteGone`` when the zygote is not there any more)."""
        if self._state.zygote is None:
            raise ZygoteGone("the reward pool has no zygote (closed, or its restart failed)")
        return _Worker(self._state.zygote.spawn())

    def _fresh_workers(self) -> None:
        """Kill every worker and fork new ones; a zygote that is gone is started again first."""
        for worker in self._workers:
            worker.kill()
            if self._state.zygote is not None:
                self._state.zygote.release(worker.pid)
        self._workers.clear()
        try:
            self._workers.extend(self._spawn() for _ in range(self.num_workers))
        except ZygoteGone:
            for worker in self._workers:
                worker.kill()
            self._workers.clear()
            self._restart_zygote()
            self._workers.extend(self._spawn() for _ in range(self.num_workers))

    def _restart_zygote(self) -> None:
        """A new zygote (the scorer imported again, under ``startup_timeout_s``)."""
        old, self._state.zygote = self._state.zygote, None
        if old is not None:
            old.close()
        self.zygote_restarts += 1
        self._state.zygote = Zygote(self.scorer, self.startup_timeout_s)

    def close(self) -> None:
        """Stop every worker and the zygote (idempotent)."""
        self._finalizer()

    def __enter__(self) -> ScorerPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def closed(self) -> bool:
        return not self._finalizer.alive

    # --- scoring ---
    def map(self, calls: Sequence[dict[str, Any]], timeout_s: float | None) -> list[Outcome]:
        """Score ``scorer(**calls[i])`` for every i; the i-th outcome answers the i-th call.

        ``timeout_s`` bounds each call (None: no bound). Never raises for a scorer's failure:
        failures are outcomes. Raises ``RuntimeError`` if the pool is closed, and
        ``ScorerStartupError`` if a replacement zygote cannot import the scorer any more.
        """
        if self.closed:
            raise RuntimeError("ScorerPool.map called after close()")
        with self._lock:
            try:
                return self._run(calls, timeout_s)
            except BaseException:
                if self._state.zygote is not None:  # tasks in flight would answer the next map
                    self._fresh_workers()
                raise

    def _run(self, calls: Sequence[dict[str, Any]], timeout_s: float | None) -> list[Outcome]:
        outcomes: list[Outcome | None] = [None] * len(calls)
        payloads = [pickle.dumps(call) for call in calls]
        pending: deque[int] = deque(range(len(calls)))
        remaining = len(calls)
        while remaining:
            self._dispatch(pending, payloads)
            busy = {w.conn: w for w in self._workers if w.inflight}
            try:
                for conn in wait(list(busy), timeout=self._wait_s(timeout_s)):
                    remaining -= self._drain(busy[conn], outcomes)
                remaining -= self._expire(timeout_s, outcomes, pending)
                remaining -= self._reap_dead(outcomes, pending)
            except ZygoteGone:  # re-queue what is in flight, replace the zygote and the workers
                for worker in self._workers:
                    pending.extendleft(reversed(worker.inflight))
                    worker.inflight.clear()
                self._fresh_workers()
                remaining = outcomes.count(None)
        return outcomes  # type: ignore[return-value]

    def _dispatch(self, pending: deque[int], payloads: list[bytes]) -> None:
        """Keep two task lists of ``size`` in flight per worker; ``size`` shrinks near the end."""
        size = max(1, min(self.max_chunk, math.ceil(len(pending) / (2 * self.num_workers))))
        for worker in self._workers:
            if not pending or worker.dead or len(worker.inflight) >= 2 * size:
                continue
            ids = [pending.popleft() for _ in range(min(size, len(pending)))]
            try:
                worker.conn.send([(i, payloads[i]) for i in ids])
            except OSError:  # it died idle; its tasks return to the queue, the reaper replaces it
                pending.extendleft(reversed(ids))
                worker.dead = True
                continue
            worker.inflight.extend(ids)

    def _wait_s(self, timeout_s: float | None) -> float | None:
        """Seconds until the next deadline, capped by the progress-polling interval."""
        if timeout_s is None:
            return None
        now, waits = time.monotonic(), []
        for worker in self._workers:
            if worker.inflight:
                running = worker.running()
                waits.append(min(timeout_s / 4, 0.05))
                if running is not None:
                    waits.append(running[1] + timeout_s - now)
        return max(0.0, min(waits)) if waits else None

    def _drain(self, worker: _Worker, outcomes: list[Outcome | None]) -> int:
        """Apply every message waiting on ``worker``'s socket; returns outcomes completed."""
        done = 0
        while not worker.dead and worker.conn.poll():
            try:
                _, results = worker.conn.recv()
            except (EOFError, OSError):  # socket closed: the worker died; _reap_dead replaces it
                worker.dead = True
                break
            for task_id, packed in results:
                if not worker.inflight or worker.inflight[0] != task_id:
                    raise RuntimeError(f"reward worker answered task {task_id} out of order")
                worker.inflight.popleft()
                outcomes[task_id] = read_outcome(packed)
            done += len(results)
        return done

    def _expire(self, timeout_s: float | None, outcomes: list, pending: deque[int]) -> int:
        """Kill workers whose running task passed its deadline; returns outcomes completed."""
        if timeout_s is None:
            return 0
        now, done = time.monotonic(), 0
        for index, worker in enumerate(self._workers):
            running = None if worker.dead else worker.running()
            if running is None or now < running[1] + timeout_s:
                continue
            message = f"timed out after {timeout_s:g} s (worker killed and replaced)"
            outcome = Outcome(TIMEOUT, message=message)
            done += self._retire(index, running[0], outcome, outcomes, pending, killed=True)
        return done

    def _reap_dead(self, outcomes: list, pending: deque[int]) -> int:
        """Replace workers that exited; the task each was running gets an ``error`` outcome."""
        done = 0
        for index, worker in enumerate(self._workers):
            if not worker.dead:
                continue
            running = worker.progress.read()
            blamed = running[0] if running else (worker.inflight[0] if worker.inflight else None)
            code = self._exit_code(worker)
            message = f"worker process died (exit code {code}) while scoring; replaced"
            outcome = Outcome(ERROR, message=message)
            done += self._retire(index, blamed, outcome, outcomes, pending, killed=False)
        return done

    def _exit_code(self, worker: _Worker) -> int | None:
        if self._state.zygote is None:
            return None
        try:
            return self._state.zygote.reap(worker.pid)
        except ZygoteGone:
            return None  # the next _spawn raises it again, and _run replaces the zygote

    def _retire(
        self,
        index: int,
        blamed: int | None,
        outcome: Outcome,
        outcomes: list,
        pending: deque[int],
        *,
        killed: bool,
    ) -> int:
        """Kill worker ``index`` and replace it; ``blamed`` gets ``outcome``, the rest are re-queued."""
        worker = self._workers[index]
        if killed:
            worker.kill()
            if self._state.zygote is not None:
                self._state.zygote.release(worker.pid)
        else:
            worker.close()
        requeue = [task for task in worker.inflight if task != blamed]
        pending.extendleft(reversed(requeue))
        worker.inflight.clear()
        worker.dead = True
        if blamed is not None:
            outcomes[blamed] = outcome
        self.restarts += 1
        self._workers[index] = self._spawn()  # ZygoteGone: _run replaces the zygote and all
        return 0 if blamed is None else 1
