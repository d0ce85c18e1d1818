"""The background artifact writer: a stage's files are written while the step goes on.

A stage's artifact fingerprint is computed in memory (``save_artifact(write_in=…)`` digests the
bytes each file will hold), so the stage's record, its cache record and the next stages' cache
keys are known at once; one writer thread then writes the files, each artifact as atomically as a
synchronous save (a temp folder, then one rename). The step waits for its writes before it ends:
its final journal (``done``), the checkpoint after it, retention and the next step all see every
artifact on disk. A write that fails re-raises its error there, the original exception (a full
disk is the same ``OSError`` as in a synchronous save); a process killed before a write ended
leaves at most a temp folder, which the next start removes, and a cache record whose artifact is
missing, which reads as a miss (the stage is recomputed).

``ppoflow.artifacts.write_in_background`` (default true) turns it on for a training or a re-run;
false writes every artifact inside its stage, as before.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager

#: the writer of the step running in this context (None: write inside the stage)
_CURRENT: contextvars.ContextVar[ArtifactWriter | None] = contextvars.ContextVar(
    "ppoflow_artifact_writer", default=None
)
THREAD_NAME = "ppoflow-artifact-writer"


class ArtifactWriter:
    """Runs submitted writes one at a time, in order, on one thread."""

    def __init__(self) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=THREAD_NAME)
        self._pending: list[Future] = []

    def submit(self, write: Callable[[], None]) -> None:
        """Queue ``write`` (``save_artifact``'s ``write_in``)."""
        self._pending.append(self._pool.submit(write))

    def drain(self) -> None:
        """Wait for every queued write; re-raise the first one's error (the others still ran)."""
        pending, self._pending = self._pending, []
        errors = [future.exception() for future in pending]
        first = next((error for error in errors if error is not None), None)
        if first is not None:
            raise first

    def close(self) -> None:
        """Drain, then stop the thread."""
        try:
            self.drain()
        finally:
            self._pool.shutdown(wait=True)


def current_writer() -> ArtifactWriter | None:
    """The background writer of the step running in this context, if any."""
    return _CURRENT.get()


@contextmanager
def writing_in_background(enabled: bool) -> Iterator[ArtifactWriter | None]:
    """Inside: stages of this context hand their writes to one writer (when ``enabled``); on the
    way out every write has ended (an error of one re-raised, unless another is propagating)."""
    if not enabled:
        yield None
        return
    writer = ArtifactWriter()
    token = _CURRENT.set(writer)
    failed = False
    try:
        yield writer
    except BaseException:
        failed = True
        raise
    finally:
        _CURRENT.reset(token)
        try:
            writer.close()
        except Exception:
            if not failed:
                raise


__all__ = ["THREAD_NAME", "ArtifactWriter", "current_writer", "writing_in_background"]
