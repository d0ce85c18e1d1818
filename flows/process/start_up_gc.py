"""Python's cyclic garbage collector held off while a process starts, then frozen out of the
start-up's objects.

Importing the stack (torch; tensordict, which imports torch's compiler and SymPy; Prefect;
transformers; DeepSpeed) allocates about 600,000 objects that live as long as the process.
CPython's collector runs a full pass over every tracked object each time the long-lived ones
have grown by a quarter, so during the imports it scans a growing heap again and again (a
quarter to a third of the imports' time; bench/README.md has the figures). They leave about 14,000 objects of cyclic garbage (a few MiB) that a pass would free.

:func:`pause` turns the collector off (the ``ppoflow`` executable calls it first thing for a
training command); :func:`resume` turns it back on once the run is open (the first step),
after :func:`gc.freeze` has moved everything allocated so far to the permanent generation, so
the collections during training scan only what training allocates. The start-up's garbage is
kept for the process's life, and a frozen object that becomes cyclic garbage later is not
freed (objects without cycles are freed by their reference counts, frozen or not). A process
that did not :func:`pause` is left as it is.
"""

from __future__ import annotations

import gc

_paused: list[bool] = []  # [True] while this module holds the collector off


def pause() -> None:
    """Turn the cyclic collector off, if it is on, until :func:`resume`."""
    if gc.isenabled():
        gc.disable()
        _paused[:] = [True]


def resume() -> None:
    """After :func:`pause`: freeze the objects allocated so far and turn the collector back on
    (idempotent; nothing when this module did not turn it off)."""
    if _paused:
        _paused.clear()
        gc.freeze()
        gc.enable()


def is_paused() -> bool:
    """Whether :func:`pause` holds the collector off now."""
    return bool(_paused)


__all__ = ["is_paused", "pause", "resume"]
