"""Stage 2, balance: a row order that evens the sequence-length workload over the DP ranks.

requires: ``attention_mask`` (B, T). produces: ``balance_order`` (B,) int64, a permutation; the
step flow reorders the whole step batch by it right after this stage (``Stage.reorders``) and
drops it from the batch. Runs when ``trainer.balance_batch`` (verl's default true).

verl's rule (``stages.algos.balance``): workload 24576·L + L² with L the row's attention sum,
Karmarkar–Karp into ``dp_size`` equal-size partitions, each arranged small-large-small. Metrics
``global_seqlen/{min,max,minmax_diff,balanced_min,balanced_max,mean}``.
"""

from __future__ import annotations

from dataproto import DataProto
from dataproto import keys as K
from stages.algos.balance import balance_batch
from stages.stage import Stage, StageContext, tensor


def balance_fn(batch: DataProto, ctx: StageContext) -> DataProto:
    """requires: attention_mask (B, T); produces: balance_order (B,) int64."""
    permutation, metrics = balance_batch(batch, ctx.config.derived.dp_size)
    ctx.metrics.update({name: float(value) for name, value in metrics.items()})
    return DataProto.from_dict({K.BALANCE_ORDER: permutation})


def balance_enabled(config) -> bool:
    return bool(config.trainer.balance_batch)


BALANCE_STAGE = Stage(
    name="balance",
    version=1,
    requires=(tensor(K.ATTENTION_MASK),),
    produces=(tensor(K.BALANCE_ORDER),),
    fn=balance_fn,
    when=balance_enabled,
    config_keys=("trainer.n_gpus_per_node", "trainer.nnodes"),
    reorders=K.BALANCE_ORDER,
)
