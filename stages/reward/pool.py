"""A long-lived pool of scorer processes with a per-sample timeout that really bounds time.

Why not ``concurrent.futures.ProcessPoolExecutor``: it cannot cancel a running call, so one hung
scorer holds a worker forever, and a worker that dies breaks the whole executor. Here each worker
is a process with its own socket and a shared ``[task_id, started_at]`` progress slot. The
driver sends each worker short ordered task lists (two lists in flight, so it never idles), the
worker answers in batches, and the progress slot tells the driver which task runs and since when.
Both directions carry plain data as JSON frames (:mod:`stages.reward.wire`): the driver never
unpickles or runs anything a worker sends, reads a frame only up to a size bound, and never
blocks on a worker's socket (one ``select`` loop over every worker, the zygote and the workers'
output pipes, waking at least every ``min(timeout_s / 4, 50 ms)`` while a call runs, and at
least once a second in any case).

Workers are forked from the scorer's zygote (``stages.reward.zygote``), which imported the
scorer once, at start-up, under ``startup_timeout_s``; a worker therefore holds the standard
library, ``stages.reward.worker`` and the scorer's module — no torch, no trainer — and a
replacement is ready in about a millisecond. Each worker's address space may grow by
``memory_mb`` (``reward.worker_memory_mb``) beyond what it was forked with, and its stdout and
stderr reach the driver's through pipes bounded to ``output_bytes`` per call
(``reward.worker_output_bytes``, :mod:`stages.reward.output`).

- timeout: when the running task passes ``timeout_s``, the worker is killed (SIGKILL), that task
  gets a ``timeout`` outcome, the worker's other unanswered tasks go back to the queue (finished
  but unsent ones are scored again), and a freshly forked worker replaces it;
- death: a worker that exits (``os._exit``, a segfault, an OOM kill) closes its socket; the task
  it was running gets an ``error`` outcome with its exit code, the rest are re-queued, and the
  worker is replaced; a worker that breaks the protocol (a frame over the bound, a malformed
  one) is killed and treated the same way;
- memory: a ``MemoryError`` in a worker is that sample's ``error``; the worker says so and
  leaves, its remaining tasks are re-queued, and a fresh worker replaces it;
- the zygote dying (it runs no scorer call, so only an outside kill or the OOM killer does that)
  is seen at its socket's end of file; its workers die with it (each has the parent-death signal
  SIGKILL), every task they held is re-queued (none is blamed: the scorer is pure, so scoring it
  again is safe), and a new zygote imports the scorer again under ``startup_timeout_s``. That
  happens at most once per :meth:`ScorerPool.map`: a second death in the same call, or a restart
  that fails, raises :class:`~stages.reward.zygote.ScorerProcessError` (one line naming the
  scorer's process and the config key), never a hang;
- stop: a worker found stopped (SIGSTOP from outside: state ``T`` in ``/proc``) when its task
  passes the deadline above ran no scorer code, so nothing is timed out: it is killed and
  replaced, and every task it held is scored again (one warning; at most ``num_workers + 2``
  times per call, after which the deadline blames the task as for any hung call). A stopped
  zygote is found before it is asked to fork, and while the driver waits for its answer, and is
  replaced as a dead one (killed, once per call; ``ZygoteStopped``). A stop is only acted on at
  a deadline: with ``timeout_s`` None a stopped worker is waited for, as a hung call is.

The pool lives for the run; call :meth:`close` at the end (or use ``with``). No scorer process
outlives the driver: the zygote leaves when its socket reaches end of file or its parent
changes, and takes its workers with it.

Example:
    >>> from stages.reward.custom import DEFAULT_SCORER
    >>> with ScorerPool(DEFAULT_SCORER, num_workers=1) as pool:
    ...     call = dict(data_source="openai/gsm8k", solution_str="#### 3", ground_truth="3")
    ...     [o.score for o in pool.map([call], timeout_s=5.0)]
    [1.0]
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import select
import signal
import threading
import time
import weakref
from collections import deque
from collections.abc import Iterable, Sequence
from typing import Any

from stages.reward.custom import ScorerRef
from stages.reward.output import OUTPUT_KEY, OutputCap
from stages.reward.wire import (
    SUPPORTED,
    FrameReader,
    FrameTooLarge,
    NotPlain,
    dumps,
    frame,
    loads,
    to_plain,
)
from stages.reward.worker import (
    ERROR,
    INVALID,
    MEMORY_KEY,
    TIMEOUT,
    Outcome,
    WorkerLimits,
    decode_result,
)
from stages.reward.zygote import (
    STARTUP_KEY,
    ScorerInfo,
    ScorerProcessError,
    ScorerStartupError,
    SpawnedWorker,
    Zygote,
    ZygoteGone,
    ZygoteStopped,
    is_stopped,
)

logger = logging.getLogger(__name__)

DEFAULT_STARTUP_TIMEOUT_S = 60.0
#: address space a worker may add to what it was forked with (reward.worker_memory_mb)
DEFAULT_WORKER_MEMORY_MB = 4096
#: scorer output passed on to the run's log per call (reward.worker_output_bytes)
DEFAULT_WORKER_OUTPUT_BYTES = 1 << 20
MAX_WAIT_S = 1.0  # the event loop wakes at least this often, whatever it waits for
_RECV_BYTES = 1 << 20
_READS_PER_WAKE = 8


class _Worker:
    """One forked scorer process as the pool tracks it: its unanswered task ids, in order, the
    bytes still to send it and the frames it is sending."""

    def __init__(self, spawned: SpawnedWorker) -> None:
        self.sock = spawned.sock
        self.sock.setblocking(False)
        self.progress = spawned.progress
        self.pid = spawned.pid
        self.dead = False  # its socket closed or failed, or it broke the protocol
        self.broken = ""  # how it broke the protocol
        self.retiring = False  # it said it leaves (a MemoryError)
        self.closed = False
        self.inflight: deque[int] = deque()
        self.head_since = 0.0  # when inflight[0] became the oldest unanswered task
        self._outbox = bytearray()
        self._reader = FrameReader()

    def running(self) -> tuple[int, float] | None:
        """(task id, start time) of the task the worker is running, or None between tasks."""
        running = self.progress.read()
        return running if running is not None and running[0] in self.inflight else None

    @property
    def sending(self) -> bool:
        return bool(self._outbox) and not self.dead

    def send(self, payload: bytes) -> None:
        self._outbox += frame(payload)
        self.flush()

    def flush(self) -> None:
        """Send what the socket takes now; a failed send marks the worker dead."""
        while self._outbox and not self.dead:
            try:
                sent = self.sock.send(self._outbox)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                self.dead = True
                return
            del self._outbox[:sent]

    def receive(self) -> list[bytes]:
        """The complete frames waiting on the socket (never blocks); end of file or an error
        marks the worker dead, a frame over the bound marks it broken."""
        frames: list[bytes] = []
        for _ in range(_READS_PER_WAKE):
            try:
                data = self.sock.recv(_RECV_BYTES)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                self.dead = True
                break
            if not data:
                self.dead = True
                break
            try:
                frames += self._reader.feed(data)
            except FrameTooLarge as exc:
                self.breaks(str(exc))
                break
        return frames

    def breaks(self, why: str) -> None:
        self.dead, self.broken = True, self.broken or why

    def kill(self) -> None:
        if not self.closed:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)
        self.close()

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.sock.close()
            self.progress.close()


class _State:
    """What the finalizer needs: the workers, the zygote and the output pipes (not the pool)."""

    def __init__(self) -> None:
        self.workers: list[_Worker] = []
        self.zygote: Zygote | None = None
        self.output: OutputCap | None = None


def _shutdown(state: _State) -> None:
    """Close every worker's socket, then the zygote, which kills and reaps what is left."""
    for worker in state.workers:
        worker.close()  # at end of file an idle worker exits
    state.workers.clear()
    if state.zygote is not None:
        state.zygote.close()
        state.zygote = None
    if state.output is not None:
        state.output.drain()
        state.output.close()
        state.output = None


class ScorerPool:
    """``num_workers`` processes scoring with ``scorer``; :meth:`map` bounds each call's time.

    Args:
        scorer: the function to call (imported in the zygote, never in this process).
        num_workers: worker processes.
        startup_timeout_s: bound on the scorer's import (``reward.startup_timeout_s``).
        max_chunk: most tasks in one list sent to a worker.
        memory_mb: address space each worker may add to what it was forked with, in MiB
            (``reward.worker_memory_mb``; None: no bound).
        output_bytes: the workers' stdout and stderr passed on per :meth:`map` call, in bytes
            (``reward.worker_output_bytes``; None: the workers write to this process's own).
        reserved_names: extra names a result may not use (the batch's keys: the reward loop
            passes ``stages.reward.accounting.RESERVED_EXTRA_NAMES``); checked in the worker.
        no_network: the workers get no network (:attr:`network_isolation` says how; the tool
            sandbox sets it, reward scorers keep the network).
        calls_per_worker: each worker leaves after this many calls and a fresh fork takes its
            place (1: a process per call; each replacement counts in :attr:`restarts`); None:
            a worker serves until it fails.

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
        memory_mb: int | None = DEFAULT_WORKER_MEMORY_MB,
        output_bytes: int | None = DEFAULT_WORKER_OUTPUT_BYTES,
        reserved_names: Iterable[str] = (),
        no_network: bool = False,
        calls_per_worker: int | None = None,
    ) -> None:
        if num_workers < 1:
            raise ValueError(f"reward.num_workers must be >= 1, got {num_workers}")
        if startup_timeout_s <= 0:
            raise ValueError(f"reward.startup_timeout_s must be > 0 s, got {startup_timeout_s}")
        if memory_mb is not None and memory_mb < 1:
            raise ValueError(f"{MEMORY_KEY} must be >= 1 MiB or None, got {memory_mb}")
        if calls_per_worker is not None and calls_per_worker < 1:
            raise ValueError(f"calls_per_worker must be >= 1 or None, got {calls_per_worker}")
        self.scorer = scorer
        self.num_workers = num_workers
        self.startup_timeout_s = startup_timeout_s
        self.max_chunk = max(1, max_chunk)
        self.limits = WorkerLimits(
            frozenset(reserved_names), memory_mb, no_network, calls_per_worker
        )
        self.restarts = 0  # workers replaced (a timeout, a death, a MemoryError, calls_per_worker)
        self.zygote_restarts = 0
        self.output_dropped = 0  # bytes of scorer output dropped in the last map call
        self._lock = threading.Lock()
        self._state = _State()
        self._finalizer = weakref.finalize(self, _shutdown, self._state)
        try:
            if output_bytes is not None:
                self._state.output = OutputCap(output_bytes)
            self._state.zygote = self._new_zygote()
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
    def network_isolation(self) -> str | None:
        """How ``no_network`` is enforced in the workers: ``"namespace"`` (a network namespace
        of their own) or ``"audit-hook"`` (Python-level socket use refused); None: not asked."""
        return self.info.network_isolation

    @property
    def worker_pids(self) -> list[int]:
        return [worker.pid for worker in self._workers]

    @property
    def zygote_pid(self) -> int | None:
        zygote = self._state.zygote
        return None if zygote is None else zygote.process.pid

    @property
    def output_dropped_total(self) -> int:
        """Bytes of scorer output dropped over the pool's life (``reward.worker_output_bytes``)."""
        output = self._state.output
        return 0 if output is None else output.dropped_total

    @property
    def _workers(self) -> list[_Worker]:
        return self._state.workers

    # --- life cycle ---
    def _new_zygote(self) -> Zygote:
        output = self._state.output
        return Zygote(
            self.scorer,
            self.startup_timeout_s,
            limits=self.limits,
            output_fds=None if output is None else output.write_fds,
        )

    def _spawn(self) -> _Worker:
        """A freshly forked worker (raises ``ZygoteGone`` when the zygote is not there any more)."""
        if self._state.zygote is None:
            raise ZygoteGone("the reward pool has no zygote (closed, or its restart failed)")
        return _Worker(self._state.zygote.spawn())

    def _ready(self) -> None:
        """A live zygote and ``num_workers`` workers; ``ZygoteGone`` when the zygote is gone."""
        zygote = self._state.zygote
        if zygote is None or zygote.gone():
            raise ZygoteGone("the reward zygote exited")
        while len(self._workers) < self.num_workers:
            self._workers.append(self._spawn())

    def _discard_workers(self) -> None:
        """Drop every worker (killed while the zygote lives, so its pid cannot have been reused;
        a dead zygote's workers died with it)."""
        zygote = self._state.zygote
        alive = zygote is not None and not zygote.gone()
        for worker in self._workers:
            if alive:
                worker.kill()
                zygote.release(worker.pid)
            else:
                worker.close()
        self._workers.clear()

    def _restart_zygote(self) -> None:
        """A new zygote (the scorer imported again, under ``startup_timeout_s``)."""
        self._discard_workers()
        old, self._state.zygote = self._state.zygote, None
        pid = None if old is None else old.process.pid
        if old is not None:
            old.close()
        self.zygote_restarts += 1
        try:
            self._state.zygote = self._new_zygote()
        except ScorerStartupError as exc:
            raise ScorerProcessError(
                f"reward scorer process of {self.scorer.label} (zygote pid {pid}) exited while "
                f"scoring and could not be started again under {STARTUP_KEY}: {exc}"
            ) from None

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
        ``ScorerProcessError`` if the zygote died twice in this call or could not be restarted.
        """
        if self.closed:
            raise RuntimeError("ScorerPool.map called after close()")
        with self._lock:
            output = self._state.output
            if output is not None:
                output.begin()
            try:
                return self._run(calls, timeout_s)
            except BaseException:
                with contextlib.suppress(Exception):  # tasks in flight would answer the next map
                    self._discard_workers()
                raise
            finally:
                if output is not None:
                    output.drain()
                    self.output_dropped = output.dropped

    def _run(self, calls: Sequence[dict[str, Any]], timeout_s: float | None) -> list[Outcome]:
        outcomes: list[Outcome | None] = [None] * len(calls)
        payloads: list[bytes | None] = [None] * len(calls)  # encoded when first sent
        pending: deque[int] = deque(range(len(calls)))
        remaining = len(calls)
        restarts_left, ready = 1, False
        self._unblamed_deaths = 0
        while remaining:
            try:
                if not ready:
                    self._ready()
                    ready = True
                remaining -= self._dispatch(pending, calls, payloads, outcomes)
                remaining -= self._step(timeout_s, outcomes, pending)
            except ZygoteGone as gone:
                for worker in self._workers:  # its workers died with it: score their tasks again
                    pending.extendleft(reversed(worker.inflight))
                    worker.inflight.clear()
                how = "is stopped (SIGSTOP)" if isinstance(gone, ZygoteStopped) else "exited"
                if restarts_left == 0:
                    self._discard_workers()
                    raise ScorerProcessError(
                        f"reward scorer process of {self.scorer.label} (zygote pid "
                        f"{self.zygote_pid}) {how} again while this batch was scored, after one "
                        "restart in the same call (killed or stopped from outside, or by the OOM "
                        f"killer: lower reward.num_workers or set {MEMORY_KEY})"
                    ) from None
                restarts_left, ready = restarts_left - 1, False
                logger.warning(
                    "reward scorer process of %s (zygote pid %s) %s; starting it again "
                    "(the scorer imported again) to score the %d samples of the batch left",
                    self.scorer.label, self.zygote_pid, how, len(pending),
                )  # fmt: skip
                self._restart_zygote()
                remaining = outcomes.count(None)  # results applied before the exception count
        return outcomes  # type: ignore[return-value]

    def _dispatch(
        self,
        pending: deque[int],
        calls: Sequence[dict[str, Any]],
        payloads: list[bytes | None],
        outcomes: list[Outcome | None],
    ) -> int:
        """Keep two task lists of ``size`` in flight per worker; ``size`` shrinks near the end.
        A worker that leaves after ``calls_per_worker`` calls gets no more than that.

        Each sample is encoded as plain data when first sent (while the workers score earlier
        ones); one that is not plain data gets its ``error`` outcome here. Returns those."""
        size = max(1, min(self.max_chunk, math.ceil(len(pending) / (2 * self.num_workers))))
        in_flight = 2 * size
        if self.limits.calls_per_worker is not None:
            in_flight = min(in_flight, self.limits.calls_per_worker)
            size = min(size, in_flight)
        done = 0
        for worker in self._workers:
            if not pending or worker.dead or len(worker.inflight) >= in_flight:
                continue
            ids, tasks = [], []
            while pending and len(ids) < size:
                i = pending.popleft()
                payload = payloads[i]
                if payload is None:
                    try:
                        payload = payloads[i] = dumps(to_plain(calls[i]))
                    except NotPlain as err:
                        outcomes[i] = Outcome(ERROR, message=_unsendable_sample(err))
                        done += 1
                        continue
                ids.append(i)
                tasks.append(b"[%d,%s]" % (i, payload))
            if not ids:
                continue
            if not worker.inflight:
                worker.head_since = time.monotonic()
            worker.inflight.extend(ids)
            worker.send(b'{"tasks":[' + b",".join(tasks) + b"]}")
        return done

    def _step(self, timeout_s: float | None, outcomes: list, pending: deque[int]) -> int:
        """Wait for the next event, then apply it: results, output, timeouts, deaths; returns
        outcomes completed. Raises ``ZygoteGone`` when the zygote's socket reaches end of file."""
        zygote = self._state.zygote
        assert zygote is not None
        by_fd = {worker.sock.fileno(): worker for worker in self._workers if not worker.dead}
        output = self._state.output
        output_fds = [] if output is None else output.read_fds
        poller = select.poll()  # not select.select: a trainer's descriptors may pass 1024
        for fd in (zygote.fileno(), *output_fds):
            poller.register(fd, select.POLLIN)
        for fd, worker in by_fd.items():
            poller.register(fd, select.POLLIN | (select.POLLOUT if worker.sending else 0))
        events = poller.poll(self._wait_s(timeout_s) * 1000)
        if any(fd == zygote.fileno() for fd, _ in events) and zygote.gone():
            raise ZygoteGone("the reward zygote exited")
        done = 0
        for fd, event in events:
            if fd in by_fd:
                worker = by_fd[fd]
                if event & select.POLLOUT:
                    worker.flush()
                if event & ~select.POLLOUT:  # data, end of file (POLLHUP) or an error
                    for payload in worker.receive():
                        done += self._apply(worker, payload, outcomes)
            elif fd in output_fds:
                output.pump(fd)
        done += self._expire(timeout_s, outcomes, pending)
        done += self._replace_gone(outcomes, pending)
        return done

    def _wait_s(self, timeout_s: float | None) -> float:
        """Seconds until the next deadline, capped by the progress-polling interval."""
        waits = [MAX_WAIT_S]
        if any(worker.dead or worker.retiring for worker in self._workers):
            return 0.0
        if timeout_s is not None:
            now = time.monotonic()
            for worker in self._workers:
                if worker.inflight:
                    waits.append(min(timeout_s / 4, 0.05))
                    waits.append(worker.head_since + _answer_bound(timeout_s) - now)
                    running = worker.running()
                    if running is not None:
                        waits.append(running[1] + timeout_s - now)
        return max(0.0, min(waits))

    def _apply(self, worker: _Worker, payload: bytes, outcomes: list[Outcome | None]) -> int:
        """Apply one results frame of ``worker``; returns outcomes completed."""
        if worker.broken:
            return 0
        try:
            message = loads(payload)
            results, retire = message["results"], message["retire"]
            if type(results) is not list or type(retire) is not bool:
                raise ValueError("not a results frame")
        except Exception as exc:
            worker.breaks(f"the worker sent a malformed message ({type(exc).__name__}: {exc})")
            return 0
        done = 0
        for entry in results:
            expected = worker.inflight[0] if worker.inflight else None
            try:
                task_id, outcome = decode_result(entry)
            except Exception as exc:
                task_id = (
                    entry[0] if type(entry) is list and entry and type(entry[0]) is int else None
                )
                outcome = Outcome(
                    INVALID,
                    message=f"the worker sent a result the driver does not accept "
                    f"({type(exc).__name__}: {exc}); a result is plain data ({SUPPORTED})",
                )
            if expected is None or task_id != expected:
                worker.breaks(f"the worker answered task {task_id!r} out of order")
                return done
            worker.inflight.popleft()
            worker.head_since = time.monotonic()
            outcomes[task_id] = outcome
            done += 1
        worker.retiring = worker.retiring or retire
        return done

    def _expire(self, timeout_s: float | None, outcomes: list, pending: deque[int]) -> int:
        """Kill workers whose running task passed its deadline; returns outcomes completed.

        The deadline is read from the worker's progress slot. As the slot is the worker's own
        memory, a scorer could also clear it and hang: the oldest unanswered task of a worker is
        therefore timed out too when no answer came for it within ``2 * timeout_s + 2 s``
        (``_answer_bound``; an honest worker answers it within ``2 * timeout_s``: its own run
        plus the next task's, after which its result is sent at the latest).
        """
        if timeout_s is None:
            return 0
        now, done = time.monotonic(), 0
        for index, worker in enumerate(self._workers):
            if worker.dead or not worker.inflight:
                continue
            running = worker.running()
            if running is not None and now >= running[1] + timeout_s:
                message = f"timed out after {timeout_s:g} s (worker killed and replaced)"
                blamed = running[0]
            elif now >= worker.head_since + _answer_bound(timeout_s):
                blamed = worker.inflight[0]
                message = (
                    f"no answer within {_answer_bound(timeout_s):g} s while its worker showed no "
                    "task running (worker killed and replaced)"
                )
            else:
                continue
            if self._stopped_from_outside(worker):
                self._retire(index, None, None, outcomes, pending)  # every task scored again
                continue
            done += self._retire(
                index, blamed, Outcome(TIMEOUT, message=message), outcomes, pending
            )
        return done

    def _stopped_from_outside(self, worker: _Worker) -> bool:
        """Whether ``worker``, past its deadline, is stopped (SIGSTOP: it runs no scorer code, so
        its sample did not time out) and not too often in this call: at most
        ``num_workers + 2`` times, shared with the deaths between tasks (``_bury``), so a scorer
        that stops itself each time is timed out in the end instead of looping."""
        if not is_stopped(worker.pid) or self._unblamed_deaths >= self.num_workers + 2:
            return False
        self._unblamed_deaths += 1
        logger.warning(
            "reward scorer worker (pid %d) of %s is stopped (SIGSTOP) past its deadline; killed "
            "and replaced, its %d sample(s) scored again",
            worker.pid, self.scorer.label, len(worker.inflight),
        )  # fmt: skip
        return True

    def _replace_gone(self, outcomes: list, pending: deque[int]) -> int:
        """Replace workers that left: a retiring one re-queues its tasks; a dead or broken one
        blames the task it was running (``error``, with its exit code) and re-queues the rest."""
        done = 0
        for index, worker in enumerate(self._workers):
            if worker.retiring:
                self._retire(index, None, None, outcomes, pending)
            elif worker.dead:
                done += self._bury(index, outcomes, pending)
        return done

    def _bury(self, index: int, outcomes: list, pending: deque[int]) -> int:
        worker = self._workers[index]
        zygote = self._state.zygote
        assert zygote is not None
        if zygote.gone():  # it took its workers with it: nothing of theirs is blamed
            raise ZygoteGone("the reward zygote exited")
        running = worker.running()
        blamed = running[0] if running is not None else None
        if blamed is None and worker.inflight:
            self._unblamed_deaths += 1
            if self._unblamed_deaths > self.num_workers + 2:  # never loop on deaths between tasks
                blamed = worker.inflight[0]
        worker.kill()  # a worker that broke the protocol may still run
        code = zygote.reap(worker.pid)  # ZygoteGone: _run restarts the zygote, blaming no one
        if worker.broken:
            message = f"{worker.broken}; worker killed and replaced"
        else:
            message = f"worker process died (exit code {code}) while scoring; replaced"
        return self._retire(index, blamed, Outcome(ERROR, message=message), outcomes, pending)

    def _retire(
        self,
        index: int,
        blamed: int | None,
        outcome: Outcome | None,
        outcomes: list,
        pending: deque[int],
    ) -> int:
        """Kill worker ``index`` and replace it; ``blamed`` gets ``outcome``, the rest are re-queued."""
        worker = self._workers[index]
        if not worker.closed:
            worker.kill()
            if self._state.zygote is not None:
                self._state.zygote.release(worker.pid)
        requeue = [task for task in worker.inflight if task != blamed]
        pending.extendleft(reversed(requeue))
        worker.inflight.clear()
        if blamed is not None:
            outcomes[blamed] = outcome
        self.restarts += 1
        self._workers[index] = self._spawn()  # ZygoteGone: _run replaces the zygote and all
        return 0 if blamed is None else 1


def _answer_bound(timeout_s: float) -> float:
    """How long the oldest unanswered task of a worker may wait for its answer (``_expire``)."""
    return 2 * timeout_s + 2.0


def _unsendable_sample(err: NotPlain) -> str:
    where = "".join(err.path) or "the sample"
    return (
        f"sample could not be sent to the scorer worker: {where} is a {err.type_name}; samples "
        f"cross as plain data ({SUPPORTED})"
    )


__all__ = [
    "DEFAULT_STARTUP_TIMEOUT_S",
    "DEFAULT_WORKER_MEMORY_MB",
    "DEFAULT_WORKER_OUTPUT_BYTES",
    "OUTPUT_KEY",
    "ScorerPool",
]
