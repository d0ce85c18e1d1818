"""The scorer workers' stdout and stderr, passed on to the driver's under a per-call byte bound.

Without a bound a scorer that prints 10 MB per call grows the run's log by that much per sample.
Each worker's file descriptors 1 and 2 are the write ends of two pipes (the zygote puts them
there after the fork, so C-level writes are caught as well as ``print``); the driver reads the
read ends, which never block, inside the pool's event loop, and writes what arrives to its own
descriptors 1 and 2, as a worker that inherited them would have. Once a call (one
:meth:`~stages.reward.pool.ScorerPool.map`, a step's batch) has passed ``limit`` bytes, the rest
is dropped and counted, and one line on stderr says so; the next call starts a new budget.

A worker writes into a pipe buffer (64 KiB on Linux); the driver empties it while a call runs,
so a chatty scorer costs the driver's reading time, never a stall. Between calls no scorer code
runs, so nothing is read then.
"""

from __future__ import annotations

import contextlib
import os

OUTPUT_KEY = "reward.worker_output_bytes"
_CHUNK = 1 << 16
_READS_PER_PUMP = 16  # then back to the event loop (timeouts), even if a worker keeps writing
# (16 reads of 64 KiB: more than a pipe holds, so one pump empties a pipe nobody writes to)


class OutputCap:
    """Two pipes for the workers' stdout and stderr, forwarded under ``limit`` bytes per call.

    Args:
        limit: bytes passed on per call, stdout and stderr together.
        targets: the driver's descriptors the two streams go to (its stdout and stderr).
    """

    def __init__(self, limit: int, targets: tuple[int, int] = (1, 2)) -> None:
        if limit < 0:
            raise ValueError(f"{OUTPUT_KEY} must be >= 0 bytes or None, got {limit}")
        self.limit = limit
        self.targets = targets
        self._pipes: list[tuple[int, int]] = []
        for _ in targets:
            read_end, write_end = os.pipe()
            os.set_blocking(read_end, False)
            self._pipes.append((read_end, write_end))
        self.passed = 0  # this call: bytes passed on
        self.dropped = 0  # this call: bytes dropped
        self.dropped_total = 0  # over the pool's life

    @property
    def write_fds(self) -> tuple[int, int]:
        """The descriptors each worker's stdout and stderr become."""
        return tuple(write_end for _, write_end in self._pipes)  # type: ignore[return-value]

    @property
    def read_fds(self) -> list[int]:
        return [read_end for read_end, _ in self._pipes]

    def begin(self) -> None:
        """A new call: a new budget."""
        self.passed = self.dropped = 0

    def pump(self, fd: int) -> None:
        """Read what is waiting on ``fd`` (one of :attr:`read_fds`); pass it on or drop it."""
        target = self.targets[self.read_fds.index(fd)]
        for _ in range(_READS_PER_PUMP):
            try:
                data = os.read(fd, _CHUNK)
            except (BlockingIOError, InterruptedError):
                return
            if not data:
                return
            self._forward(target, data)

    def drain(self) -> None:
        """What waits on both pipes (end of a call): what the workers wrote before they sent
        their results. Bounded, so a scorer thread that keeps printing cannot hold the call."""
        for fd in self.read_fds:
            self.pump(fd)

    def _forward(self, target: int, data: bytes) -> None:
        room = max(self.limit - self.passed, 0)
        kept, cut = data[:room], len(data) - min(room, len(data))
        if kept:
            _write_all(target, kept)
            self.passed += len(kept)
        if cut:
            if not self.dropped:
                _write_all(
                    self.targets[-1],
                    (
                        f"\n[ppoflow] reward scorer output past {OUTPUT_KEY}={self.limit} bytes "
                        "in this batch is dropped (counted)\n"
                    ).encode(),
                )
            self.dropped += cut
            self.dropped_total += cut

    def close(self) -> None:
        for read_end, write_end in self._pipes:
            for fd in (read_end, write_end):
                with contextlib.suppress(OSError):
                    os.close(fd)
        self._pipes = []


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    with contextlib.suppress(OSError):  # a closed stdout loses the scorer's output, nothing else
        while view:
            view = view[os.write(fd, view) :]
