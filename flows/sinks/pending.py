"""A sink's pending-metrics file: ``<run_dir>/<name>_pending.jsonl``, the metric values a sink did
not take, so that no computed step is lost.

One JSON row per value, appended: ``key`` (the metric's own name), ``value`` (a number; a
non-finite one as its ``repr``, since JSON has no NaN or infinity), ``step`` and ``ts`` (the time
it was logged, in ms since the epoch). The fan-out writes one for a retired sink
(flows/sinks/fanout.py), :class:`~flows.sinks.mlflow_logger.MLflowLogger` writes
``mlflow_pending.jsonl`` at close for what an unreachable store did not take, and the MLflow
process sink for what a process it gave up on had not stored (flows/sinks/mlflow_process.py).
A module of its own with no imports from ppoflow, so the training process's side of the MLflow
sink, which never imports MLflow, can write it.

Example:
    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     path = pending_file(tmp, "mlflow")
    ...     append_pending(path, [("actor/pg_loss", float("nan"), 3, 1700000000000)])
    ...     print(path.name, path.read_text().strip())
    1
    mlflow_pending.jsonl {"key": "actor/pg_loss", "value": "nan", "step": 3, "ts": 1700000000000}
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable
from pathlib import Path

PENDING_SUFFIX = "_pending.jsonl"


def pending_file(run_dir: str | os.PathLike, name: str) -> Path:
    """The pending file of the sink ``name`` in ``run_dir``."""
    return Path(run_dir) / f"{name}{PENDING_SUFFIX}"


def append_pending(path: Path, values: Iterable[tuple[str, float, int, int]]) -> int:
    """Append one row per ``(key, value, step, ts_ms)`` to ``path`` (its folder made if missing);
    returns how many rows were written."""
    rows = []
    for key, value, step, ts in values:
        value = float(value)
        shown: float | str = value if math.isfinite(value) else repr(value)
        rows.append(json.dumps({"key": key, "value": shown, "step": int(step), "ts": int(ts)}))
    if rows:
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a", encoding="utf-8") as out:
            out.write("\n".join(rows) + "\n")
    return len(rows)


def read_pending(path: Path) -> list[tuple[str, float, int, int]]:
    """The rows of ``path`` as ``(key, value, step, ts_ms)`` (a non-finite value back to its
    float); ``[]`` when the file does not exist. A line cut short by a kill mid-append is
    skipped.

    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     path = pending_file(tmp, "mlflow")
    ...     _ = append_pending(path, [("a", float("inf"), 2, 5), ("b", 1.5, 3, 6)])
    ...     with path.open("a") as out:
    ...         _ = out.write('{"key": "c", "val')
    ...     read_pending(path)
    [('a', inf, 2, 5), ('b', 1.5, 3, 6)]
    """
    if not path.exists():
        return []
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            row = json.loads(line)
            rows.append((str(row["key"]), float(row["value"]), int(row["step"]), int(row["ts"])))
        except (ValueError, KeyError, TypeError):
            continue
    return rows


__all__ = ["PENDING_SUFFIX", "append_pending", "pending_file", "read_pending"]
