"""Fills the disk of a Python process at a chosen point: a file-size limit from then on.

Put this directory on ``PYTHONPATH`` and set ``PPOFLOW_FSIZE_AFTER`` to a folder and
``PPOFLOW_FSIZE_LIMIT`` to a number of bytes: an audit hook (``sys.addaudithook``) waits for the
first ``open`` of a file below that folder for writing and then lowers the process's soft
``RLIMIT_FSIZE`` to the limit (the hard limit is kept, so the process could raise it again). Every
later write that would take a file past the limit fails with ``EFBIG``, as Python ignores
``SIGXFSZ``; files below the limit are written as before. Only this process is limited: the
processes it started before (Prefect's server, the reward workers) are not.
"""

import os
import resource
import sys

_AFTER = os.environ.get("PPOFLOW_FSIZE_AFTER")
_LIMIT = os.environ.get("PPOFLOW_FSIZE_LIMIT")
_WRITES = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT


def _is_write(mode, flags) -> bool:
    if isinstance(mode, str):
        return any(char in mode for char in "wax+")
    return isinstance(flags, int) and bool(flags & _WRITES)


def _hook(event: str, args) -> None:
    global _AFTER
    if event != "open" or _AFTER is None:
        return
    try:
        path, mode, flags = args
        if isinstance(path, int) or not _is_write(mode, flags):
            return
        if not os.path.abspath(os.fsdecode(path)).startswith(_AFTER + "/"):
            return
    except Exception:  # a watcher must never break the process it watches
        return
    _AFTER = None  # once
    _, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (int(_LIMIT), hard))


if _AFTER and _LIMIT:
    _AFTER = os.path.abspath(_AFTER)
    sys.addaudithook(_hook)
else:
    _AFTER = None
