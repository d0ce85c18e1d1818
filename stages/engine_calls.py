"""How a stage reaches a model: ``ctx.engines[role].call(method, batch)`` and its metrics.

``ctx.engines`` maps a role (``actor``, ``ref``, ``critic``) to a worker group
(``stages.engines.worker_group.WorkerGroup``: ``call(method, batch, **kwargs) -> DataProto``), or
to the run's in-process adapter with the same method. A worker reports metrics in the returned
``meta_info["metrics"]``; :func:`call_engine` reduces them to one float per key
(``reduce_metrics``) and returns them apart from the delta. Per key the value may be:

- a ``Metric``: its own declared aggregation (mean, sum, min or max);
- a list of ``Metric`` objects (verl's ``append_to_dict``, one per micro-batch): pooled into one
  Metric of their declared aggregation (they must share it, else ``ValueError`` naming the key);
- a plain list of numbers: verl's key-substring rule (max if the key contains ``"max"``, else
  min if it contains ``"min"``, else mean);
- an empty list: NaN, as in verl;
- a number: as it is.

A worker group has already combined its ranks (``dispatch.combine_rank_metrics``, same kinds per
rank), so its metrics arrive as floats.
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
