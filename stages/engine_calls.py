"""How a stage reaches a model: ``ctx.engines[role].call(method, batch)`` and its metrics.

``ctx.engines`` maps a role (``actor``, ``ref``, ``critic``) to a worker group
(``stages.engines.worker_group.WorkerGroup``: ``call(method, batch, **kwargs) -> DataProto``), or
to the run's in-process adapter with the same method. A worker reports metrics in the returned
``meta_info["metrics"]`` (``Metric`` objects, lists or floats); :func:`call_engine` reduces them to
floats (``reduce_metrics``: a Metric by its own aggregation, a list by verl's key rule, a number
as it is) and returns them apart from the delta.
"""

from __future__ import annotations

from typing import Any

from dataproto import DataProto, keys
from stages.metrics.metric import reduce_metrics
from stages.stage import StageContext


def get_engine(ctx: StageContext, role: str) -> Any:
    """``ctx.engines[role]``; a ``KeyError`` naming the role and the engines the run holds."""
    if role not in ctx.engines:
        raise KeyError(
            f"this stage needs the {role!r} engine, but the run holds {sorted(ctx.engines)}; "
            "the train flow builds it when the config enables it (flows/engines.py)"
        )
    return ctx.engines[role]


def call_engine(
    ctx: StageContext, role: str, method: str, batch: DataProto, **kwargs: Any
) -> tuple[DataProto, dict[str, float]]:
    """Run ``method`` of the ``role`` engine on ``batch``; returns (its DataProto, its metrics)."""
    out = get_engine(ctx, role).call(method, batch, **kwargs)
    metrics = out.meta_info.pop(keys.METRICS, None) or {}
    return out, reduce_metrics(metrics)
