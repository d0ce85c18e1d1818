"""How a stage reaches a model: ``ctx.engines[role].call(method, batch)``, its metrics, its delta.

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

A stage that calls a model on the step batch requires :func:`engine_inputs` (the rollout's
sequences, then its own keys), and its function is one :func:`engine_delta` (or
:func:`run_engine` and its own delta):

>>> import torch
>>> class Critic:
...     def call(self, method, batch):
...         return DataProto.from_dict({"values": torch.zeros(2, 3), "extra": torch.ones(2)},
...                                    meta_info={"metrics": {"critic/vf_loss": [1.0, 3.0]}})
>>> ctx = StageContext(config=None, engines={"critic": Critic()})
>>> delta = engine_delta(ctx, "critic", "compute_values", DataProto.from_dict({}), "values")
>>> sorted(delta.batch.keys()), ctx.metrics
(['values'], {'critic/vf_loss': 2.0})
>>> engine_delta(ctx, "critic", "update_critic", DataProto.from_dict({})).batch is None
True
"""

from __future__ import annotations

from typing import Any

from dataproto import DataProto
from dataproto import keys as K
from stages.metrics.metric import reduce_metrics
from stages.stage import KeyRef, StageContext, meta, tensor

#: what every model call on the step batch reads: the rollout's ``input_ids`` /
#: ``attention_mask`` / ``position_ids`` (B, T) and ``responses`` (B, R)
SEQUENCE_KEYS: tuple[KeyRef, ...] = (
    tensor(K.INPUT_IDS),
    tensor(K.ATTENTION_MASK),
    tensor(K.POSITION_IDS),
    tensor(K.RESPONSES),
)


def engine_inputs(*tensors: str, temperature: bool = False) -> tuple[KeyRef, ...]:
    """What a model call on the step batch requires: :data:`SEQUENCE_KEYS`, then the tensor keys
    ``tensors``, then ``meta_info.temperature`` when it takes log-probs at the rollout temperature.

    >>> [str(ref) for ref in engine_inputs("values", temperature=True)][3:]
    ['batch.responses', 'batch.values', 'meta_info.temperature']
    """
    own = tuple(tensor(name) for name in tensors)
    return SEQUENCE_KEYS + own + ((meta(K.TEMPERATURE),) if temperature else ())


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
    metrics = out.meta_info.pop(K.METRICS, None) or {}
    return out, reduce_metrics(metrics)


def run_engine(
    ctx: StageContext, role: str, method: str, batch: DataProto, **kwargs: Any
) -> DataProto:
    """:func:`call_engine`, its metrics added to ``ctx.metrics``; returns the engine's DataProto."""
    out, metrics = call_engine(ctx, role, method, batch, **kwargs)
    ctx.metrics.update(metrics)
    return out


def tensor_delta(out: DataProto, *names: str) -> DataProto:
    """A stage's delta: the tensors ``names`` of ``out`` (none: the empty delta, ``batch=None``)."""
    return DataProto.from_dict({name: out.batch[name] for name in names})


def engine_delta(
    ctx: StageContext, role: str, method: str, batch: DataProto, *produces: str
) -> DataProto:
    """The body of a stage that is one model call: :func:`run_engine`, then the delta of the
    tensors it ``produces`` (an update produces none and returns the empty delta)."""
    return tensor_delta(run_engine(ctx, role, method, batch), *produces)
