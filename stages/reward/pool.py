"""A long-lived pool of scorer processes with a per-sample timeout that really bounds time.

Why not ``concurrent.futures.ProcessPoolExecutor``: it cannot cancel a running call, so one hung
scorer holds a worker forever, and a worker that dies breaks the whole executor. Here each worker
is a process with its own pipe and a shared ``[task_id, started_at]`` progress slot. The parent
sends each worker short ordered task lists (two lists in flight, so it never idles), the worker
answers in batches, and the progress slot tells the parent which task runs and since when.

- timeout: when the running task passes ``timeout_s``, the worker is killed (SIGKILL), that task
  gets a ``timeout`` outcome, the worker's other unanswered tasks go back to the queue (finished
  but unsent ones are scored again), and a fresh worker replaces it;
- death: a worker that exits (``os._exit``, a segfault, an OOM kill) closes its pipe; the task it
  was running gets an ``error`` outcome, the rest are re-queued, and the worker is replaced.

The parent wakes at least every ``timeout_s / 4`` (≤ 50 ms) to check the progress slots, so a
timeout fires within that margin. Workers start with the ``forkserver`` method (about 10 ms each
once the server runs, without the parent's torch state; ``fork`` after torch is unsafe and
``spawn`` re-imports everything), from a script whose ``__main__`` is guarded. The pool lives for
the run: start-up happens once, in the constructor, which also checks that every worker could
import the scorer; call :meth:`close` at the end (or use ``with``).

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
import multiprocessing as mp
import pickle
import threading
import time
import weakref
from collections import deque
from collections.abc import Sequence
from multiprocessing.connection import wait
from typing import Any

from stages.reward.custom import ScorerRef
from stages.reward.worker import ERROR, TIMEOUT, Outcome, worker_main

_START_METHOD = "forkserver" if "forkserver" in mp.get_all_start_methods() else "spawn"


class _Worker:
    """One scorer process, its pipe, its progress slot, and its unanswered task ids (in order)."""

    def __init__(self, ctx: Any, scorer: ScorerRef) -> None:
        self.conn, child_conn = ctx.Pipe(duplex=True)
        self.progress = ctx.Array("d", [-1.0, 0.0], lock=False)  # [task_id, started_at]
        self.process = ctx.Process(
            target=worker_main, args=(child_conn, scorer, self.progress), daemon=True
        )
        self.process.start()
        child_conn.close()  # so that our recv() sees EOF when the worker dies
        self.started_at = time.monotonic()
        self.ready = False
        self.dead = False
        self.inflight: deque[int] = deque()

    def running(self) -> tuple[int, float] | None:
        """(task id, start time) of the task the worker is running, or None between tasks."""
        task, since, again = self.progress[0], self.progress[1], self.progress[0]
        if task < 0 or task != again or int(task) not in self.inflight:
            return None  # idle, or read while it moved on: look again at the next wake-up
        return int(task), since

    def kill(self) -> None:
        if self.process.is_alive():
            self.process.kill()
        self.process.join(5.0)
        self.conn.close()

    def ask_to_stop(self) -> None:
        with contextlib.suppress(OSError):
            self.conn.send(None)


def _shutdown(workers: list[_Worker]) -> None:
    """Ask every worker to exit, give them a second together, then kill what is left."""
    for worker in workers:
        worker.ask_to_stop()
    deadline = time.monotonic() + 1.0
    for worker in workers:
        worker.process.join(max(deadline - time.monotonic(), 0.0))
        worker.kill()
    workers.clear()


class ScorerPool:
    """``num_workers`` processes scoring with ``scorer``; :meth:`map` bounds each call's time."""

    def __init__(
        self,
        scorer: ScorerRef,
        num_workers: int = 8,
        *,
        startup_timeout_s: float = 60.0,
        max_chunk: int = 16,
        start_method: str = _START_METHOD,
    ) -> None:
        if num_workers < 1:
            raise ValueError(f"reward.num_workers must be >= 1, got {num_workers}")
        self.scorer = scorer
        self.num_workers = num_workers
        self.startup_timeout_s = startup_timeout_s
        self.max_chunk = max(1, max_chunk)
        self.restarts = 0  # workers replaced after a timeout or a death, over the pool's life
        self._ctx = mp.get_context(start_method)
        self._lock = threading.Lock()
        self._workers: list[_Worker] = []
        self._finalizer = weakref.finalize(self, _shutdown, self._workers)
        self._workers.extend(_Worker(self._ctx, scorer) for _ in range(num_workers))
        self._await_ready()

    # --- life cycle ---
    def _await_ready(self) -> None:
        """Block until every worker imported the scorer; raise with the worker's error if one failed."""
        deadline = time.monotonic() + self.startup_timeout_s
        for worker in self._workers:
            if not worker.conn.poll(max(deadline - time.monotonic(), 0.0)):
                self.close()
                raise TimeoutError(
                    f"reward worker did not start within {self.startup_timeout_s} s "
                    f"(scorer {self.scorer.label})"
                )
            message = self._recv_or_none(worker)
            if message is None:
                worker.process.join(5.0)
                code = worker.process.exitcode
                self.close()
                raise RuntimeError(f"reward worker exited during start-up (exit code {code})")
            self._on_message(worker, message, [])

    def close(self) -> None:
        """Stop every worker (idempotent)."""
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
        failures are outcomes. Raises ``RuntimeError`` if the pool is closed or a replacement
        worker cannot import the scorer any more.
        """
        if self.closed:
            raise RuntimeError("ScorerPool.map called after close()")
        with self._lock:
            try:
                return self._run(calls, timeout_s)
            except BaseException:
                self._replace_all()  # interrupted: tasks in flight would answer the next map
                raise

    def _run(self, calls: Sequence[dict[str, Any]], timeout_s: float | None) -> list[Outcome]:
        outcomes: list[Outcome | None] = [None] * len(calls)
        payloads = [pickle.dumps(call) for call in calls]
        pending: deque[int] = deque(range(len(calls)))
        remaining = len(calls)
        while remaining:
            self._dispatch(pending, payloads)
            busy = {w.conn: w for w in self._workers if w.inflight or not w.ready}
            for conn in wait(list(busy), timeout=self._wait_s(timeout_s)):
                remaining -= self._drain(busy[conn], outcomes)
            remaining -= self._expire(timeout_s, outcomes, pending)
            remaining -= self._reap_dead(outcomes, pending)
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
        now, waits = time.monotonic(), []
        for worker in self._workers:
            if not worker.ready:
                waits.append(worker.started_at + self.startup_timeout_s - now)
            elif worker.inflight and timeout_s is not None:
                running = worker.running()
                waits.append(min(timeout_s / 4, 0.05))
                if running is not None:
                    waits.append(running[1] + timeout_s - now)
        return max(0.0, min(waits)) if waits else None

    @staticmethod
    def _recv_or_none(worker: _Worker) -> Any:
        try:
            return worker.conn.recv()
        except (EOFError, OSError):
            return None

    def _drain(self, worker: _Worker, outcomes: list[Outcome | None]) -> int:
        """Apply every message waiting on ``worker``'s pipe; returns outcomes completed."""
        done = 0
        while not worker.dead and worker.conn.poll():
            message = self._recv_or_none(worker)
            if message is None:  # pipe closed: the worker died; _reap_dead replaces it
                worker.dead = True
                break
            done += self._on_message(worker, message, outcomes)
        return done

    def _on_message(self, worker: _Worker, message: Any, outcomes: list[Outcome | None]) -> int:
        """Apply one message from ``worker``; returns how many outcomes it completed."""
        tag, payload = message
        if tag == "init_error":
            self.close()
            raise RuntimeError(
                f"reward worker could not load scorer {self.scorer.label}: {payload}"
            )
        if tag == "ready":
            worker.ready = True
            return 0
        for task_id, status, score, extras, text in payload:
            if not worker.inflight or worker.inflight[0] != task_id:
                raise RuntimeError(f"reward worker answered task {task_id} out of order")
            worker.inflight.popleft()
            outcomes[task_id] = Outcome(status, score, extras, text)
        return len(payload)

    def _expire(self, timeout_s: float | None, outcomes: list, pending: deque[int]) -> int:
        """Kill workers whose running task passed its deadline; returns outcomes completed."""
        now, done = time.monotonic(), 0
        for index, worker in enumerate(self._workers):
            if not worker.ready and now >= worker.started_at + self.startup_timeout_s:
                self.close()
                raise RuntimeError(
                    f"a replacement reward worker did not start within {self.startup_timeout_s} s"
                )
            running = worker.running() if timeout_s is not None and not worker.dead else None
            if running is None or now < running[1] + timeout_s:
                continue
            message = f"timed out after {timeout_s} s (worker killed and replaced)"
            done += self._retire(
                index, running[0], Outcome(TIMEOUT, message=message), outcomes, pending
            )
        return done

    def _reap_dead(self, outcomes: list, pending: deque[int]) -> int:
        """Replace workers that exited; the task each was running gets an ``error`` outcome."""
        done = 0
        for index, worker in enumerate(self._workers):
            if not worker.dead:
                continue
            running = worker.running()
            worker.process.join(5.0)
            blamed = running[0] if running else (worker.inflight[0] if worker.inflight else None)
            code = worker.process.exitcode
            message = f"worker process died (exit code {code}) while scoring; replaced"
            done += self._retire(index, blamed, Outcome(ERROR, message=message), outcomes, pending)
        return done

    def _retire(
        self, index: int, blamed: int | None, outcome: Outcome, outcomes: list, pending: deque[int]
    ) -> int:
        """Kill worker ``index`` and replace it; ``blamed`` gets ``outcome``, the rest are re-queued."""
        worker = self._workers[index]
        worker.kill()
        self._workers[index] = _Worker(self._ctx, self.scorer)
        self.restarts += 1
        requeue = [task for task in worker.inflight if task != blamed]
        pending.extendleft(reversed(requeue))
        if blamed is None:
            return 0
        outcomes[blamed] = outcome
        return 1

    def _replace_all(self) -> None:
        for index, worker in enumerate(self._workers):
            worker.kill()
            self._workers[index] = _Worker(self._ctx, self.scorer)
