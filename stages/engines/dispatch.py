"""Splitting a DataProto over the data-parallel ranks of a role, and joining their outputs.

Dispatch (verl's DP_COMPUTE_PROTO): pad the batch to a multiple of the rank count d by cycling
from row 0 (``pad_dataproto_to_divisor``), cut it into d equal chunks in row order, run chunk k on
rank k, concatenate the outputs in rank order and cut the padding off the end.

Deliberate difference from verl (docs/differences.md, difference 2): the duplicated rows travel flagged, as
``non_tensor_batch["is_pad"]`` — a (B + pad,) bool array, True exactly on the appended copies — so
a worker can leave them out of its per-sample metrics. The flag column is added here and removed
again when the outputs are collected; the caller never sees it.

Ranks sharing a chunk (``ranks_per_chunk`` k > 1, for an engine that spans k ranks, such as
a vLLM engine tensor-parallel over k ranks): the batch is cut into d / k chunks instead, and
ranks k·j … k·j + k − 1 all get chunk j (consecutive ranks, as vLLM groups them). They compute
one result together, so each returns the same output: collecting keeps the first rank's of each
group after checking that its peers' outputs are equal to it (a difference means the engine's
ranks did not run in lockstep, and raises), and only those first ranks' metrics count.

Metrics: each rank may return ``meta_info["metrics"]`` with, per key, what ``reduce_metrics``
accepts: a :class:`Metric`, a list of Metrics (verl's ``append_to_dict``, one per micro-batch), a
plain list, an empty list or a scalar. Per key, each rank's Metrics pool into one Metric and the
ranks combine with ``Metric.aggregate_dp`` (SUM/MEAN: mean over ranks, then the metric's own
reduction; MIN/MAX over all values); see :func:`combine_rank_metrics` for the other kinds.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from dataproto import DataProto, dataproto_equal, keys, pad_dataproto_to_divisor, unpad_dataproto
from stages.metrics.metric import Metric, pool_metrics, reduce_metrics, to_scalar

METRICS_KEY = "metrics"


def split_for_ranks(
    batch: DataProto, world_size: int, *, allow_padding: bool, ranks_per_chunk: int = 1
) -> tuple[list[DataProto], int]:
    """One chunk of ``batch`` per rank (rank order), each with an ``is_pad`` column.

    Returns ``(chunks, pad_size)``: the batch padded with ``pad_size`` copies of its first rows
    (cycling from row 0) to a multiple of c = ``world_size / ranks_per_chunk``, cut into c equal
    chunks, chunk j given to ranks ``j·ranks_per_chunk … (j+1)·ranks_per_chunk − 1`` (one object,
    not copies). ``is_pad`` is False on the B real rows and True on the copies. The input is not
    modified.

    ``allow_padding=False`` (updates: a duplicated row would be trained on twice) raises
    ``ValueError`` when B is not a multiple of ``world_size``.

    Example:
        >>> import torch
        >>> chunks, pad = split_for_ranks(
        ...     DataProto.from_dict({"x": torch.arange(3)}), 2, allow_padding=True)
        >>> [c.batch["x"].tolist() for c in chunks], [c.non_tensor_batch["is_pad"].tolist() for c in chunks], pad
        ([[0, 1], [2, 0]], [[False, False], [False, True]], 1)
        >>> chunks, pad = split_for_ranks(
        ...     DataProto.from_dict({"x": torch.arange(3)}), 4, allow_padding=True, ranks_per_chunk=2)
        >>> [c.batch["x"].tolist() for c in chunks], pad
        ([[0, 1], [0, 1], [2, 0], [2, 0]], 1)
    """
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be an int ≥ 1, got {world_size!r}")
    check_ranks_per_chunk(ranks_per_chunk, world_size)
    groups = world_size // ranks_per_chunk
    if not isinstance(batch, DataProto):
        raise TypeError(f"dispatch needs a DataProto batch, got {type(batch).__name__}")
    if keys.IS_PAD in batch.non_tensor_batch:
        raise ValueError(
            f"the batch already has a {keys.IS_PAD!r} column: it was dispatched already and not "
            "collected; dispatch the original batch (collect_from_ranks removes the column)"
        )
    rows = len(batch)
    if rows % groups and not allow_padding:
        raise ValueError(
            f"the batch of {rows} rows does not split evenly over {groups} data-parallel "
            f"ranks ({rows} % {groups} = {rows % groups}) and this call does not allow "
            "padding (an update must not train on duplicated rows); make train_batch_size × "
            "rollout.n (and ppo_mini_batch_size × n) a multiple of trainer.nnodes × "
            "trainer.n_gpus_per_node"
        )
    padded, pad_size = pad_dataproto_to_divisor(batch, groups)
    flags = np.zeros(rows + pad_size, dtype=bool)
    flags[rows:] = True
    flagged = DataProto(
        batch=padded.batch,
        non_tensor_batch={**padded.non_tensor_batch, keys.IS_PAD: flags},
        meta_info=dict(padded.meta_info),
    )
    if rows == 0:  # nothing to split: every rank gets the empty batch
        return [flagged] * world_size, 0
    chunks = flagged.chunk(groups)
    return [chunks[chunk_index(rank, ranks_per_chunk)] for rank in range(world_size)], pad_size


def chunk_index(rank: int, ranks_per_chunk: int) -> int:
    """The chunk of a dispatched batch that rank ``rank`` got, when ``ranks_per_chunk``
    consecutive ranks share one (:func:`split_for_ranks`).

    >>> [chunk_index(r, 2) for r in range(4)], [chunk_index(r, 1) for r in range(3)]
    ([0, 0, 1, 1], [0, 1, 2])
    """
    return rank // ranks_per_chunk


def check_ranks_per_chunk(ranks_per_chunk: object, world_size: int) -> None:
    """Raise ``ValueError`` unless ``ranks_per_chunk`` is an int ≥ 1 dividing ``world_size``."""
    check_divisor(
        "ranks_per_chunk",
        ranks_per_chunk,
        world_size,
        f"the {world_size} ranks",
        " (e.g. rollout.tensor_model_parallel_size must divide the ranks)",
    )


def check_divisor(name: str, value: object, total: int, total_text: str, hint: str = "") -> None:
    """Raise ``ValueError`` naming ``name`` unless ``value`` is an int ≥ 1 dividing ``total``
    (``total_text``: how the message names the total; ``hint``: appended to it)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1 or total % value:
        raise ValueError(f"{name} must be an int ≥ 1 dividing {total_text}, got {value!r}{hint}")


def real_rows_mask(batch: DataProto) -> torch.Tensor:
    """(B,) bool, True on the rows that are not dispatch padding (all True without ``is_pad``).

    For a worker's per-sample metrics: e.g. ``response_mask * real_rows_mask(batch)[:, None]``
    leaves padded rows out of a token-mean.

    Example:
        >>> chunks, _ = split_for_ranks(
        ...     DataProto.from_dict({"x": torch.arange(3)}), 2, allow_padding=True)
        >>> real_rows_mask(chunks[1]).tolist(), real_rows_mask(DataProto.from_dict({"x": torch.arange(2)})).tolist()
        ([True, False], [True, True])
    """
    is_pad = batch.non_tensor_batch.get(keys.IS_PAD)
    if is_pad is None:
        return torch.ones(len(batch), dtype=torch.bool)
    if is_pad.dtype != np.bool_ or is_pad.shape != (len(batch),):
        raise ValueError(
            f"{keys.IS_PAD!r} must be a ({len(batch)},) bool array, got dtype {is_pad.dtype} "
            f"and shape {is_pad.shape}"
        )
    return torch.from_numpy(~is_pad)


def collect_from_ranks(
    outputs: Sequence[DataProto], pad_size: int, *, ranks_per_chunk: int = 1
) -> DataProto:
    """Join the ranks' outputs (rank order), cut the ``pad_size`` padded rows, combine metrics.

    Row-less outputs (e.g. an update that returns only metrics) give a row-less result. The
    ``is_pad`` column, if a worker passed it through, is dropped. Every meta_info key other than
    ``"metrics"`` must agree across ranks; the combined metrics are ``meta_info["metrics"]``,
    a dict of floats. With ``ranks_per_chunk`` k > 1 (the split's), each group of k ranks
    returned one result: the first rank's output stands for its group, its peers' must equal it
    (:func:`check_peers_agree`), and only the first ranks' metrics combine.
    """
    if not outputs:
        raise ValueError("collect_from_ranks needs one output per rank, got none")
    for rank, output in enumerate(outputs):
        if not isinstance(output, DataProto):
            raise TypeError(
                f"rank {rank} returned a {type(output).__name__}; a worker method called through "
                "a worker group must return a DataProto (put scalars in meta_info['metrics'])"
            )
    check_ranks_per_chunk(ranks_per_chunk, len(outputs))
    check_peers_agree(outputs, ranks_per_chunk)
    outputs = list(outputs)[::ranks_per_chunk]
    metrics = combine_rank_metrics([o.meta_info.get(METRICS_KEY) or {} for o in outputs])
    stripped = [
        DataProto(
            batch=o.batch,
            non_tensor_batch={k: v for k, v in o.non_tensor_batch.items() if k != keys.IS_PAD},
            meta_info={k: v for k, v in o.meta_info.items() if k != METRICS_KEY},
        )
        for o in outputs
    ]
    joined = DataProto.concat(stripped)
    if len(joined) > 0:
        joined = unpad_dataproto(joined, pad_size)
    if metrics:
        joined.meta_info[METRICS_KEY] = metrics
    return joined


def check_peers_agree(outputs: Sequence[DataProto], ranks_per_chunk: int) -> None:
    """Raise ``RuntimeError`` unless every rank's rows equal its group's first rank's (groups of
    ``ranks_per_chunk`` consecutive ranks; tensors and non-tensor columns compared exactly,
    meta_info not: a rank's timings are its own)."""
    for rank, output in enumerate(outputs):
        first = rank - rank % ranks_per_chunk
        if rank != first and not dataproto_equal(_rows_of(output), _rows_of(outputs[first])):
            raise RuntimeError(
                f"ranks {first} and {rank} share one engine (ranks_per_chunk={ranks_per_chunk}) "
                "but returned different outputs: the engine's ranks did not compute in "
                "lockstep (different inputs, seeds or weights on its ranks)"
            )


def _rows_of(output: DataProto) -> DataProto:
    return DataProto(batch=output.batch, non_tensor_batch=output.non_tensor_batch, meta_info={})


def combine_rank_metrics(per_rank: Sequence[dict]) -> dict[str, float]:
    """One float per metric key from one metrics dict per rank.

    Every rank must report the same keys, and for a key every rank the same kind of value:

    - a :class:`Metric` or a list of Metrics (one per micro-batch; numbers beside them are values
      of their aggregation) on every rank → each rank's list pools into one Metric, as in
      ``reduce_metrics``, and the ranks combine with ``Metric.aggregate_dp``: SUM / MEAN take the
      mean over ranks, then sum / mean over micro-batches; MIN / MAX reduce over all values. The
      ranks must share one aggregation and hold the same number of values (``ValueError``);
    - a scalar (int, float, 1-element tensor/array) on every rank → the mean over ranks;
    - plain lists of numbers (empty ones beside them add nothing) → the ranks' values
      concatenated, then verl's key-substring rule (max / min / mean, see ``reduce_metrics``), as
      verl concatenates the ranks' lists before reducing;
    - an empty list on every rank → NaN, as ``reduce_metrics``.

    Ranks that disagree in kind (Metrics beside plain values or empty lists, a scalar beside a
    list) raise ``TypeError`` naming the key and each rank's kind.

    Example:
        >>> combine_rank_metrics([
        ...     {"loss": Metric("sum", [1.0, 2.0]), "lr": 0.1, "kl": []},
        ...     {"loss": [Metric("sum", 3.0), Metric("sum", 4.0)], "lr": 0.3, "kl": []},
        ... ])
        {'loss': 5.0, 'lr': 0.2, 'kl': nan}
    """
    for rank, metrics in enumerate(per_rank):
        if not isinstance(metrics, dict):
            raise TypeError(
                f"rank {rank}: meta_info['metrics'] must be a dict of Metric, lists or scalars, "
                f"got {type(metrics).__name__}"
            )
    names = list(dict.fromkeys(name for metrics in per_rank for name in metrics))
    combined: dict[str, float] = {}
    for name in names:
        missing = [rank for rank, metrics in enumerate(per_rank) if name not in metrics]
        if missing:
            raise ValueError(
                f"metric {name!r} is missing on rank(s) {missing} of {len(per_rank)}; every rank "
                "must report the same metric keys"
            )
        combined[name] = _combine_key(name, [metrics[name] for metrics in per_rank])
    return combined


def _value_kind(value: object) -> str:
    """``"metric"``, ``"empty"``, ``"list"`` or ``"scalar"``: what one rank reported for a key."""
    if isinstance(value, Metric):
        return "metric"
    if isinstance(value, list | tuple):
        if not value:
            return "empty"
        return "metric" if any(isinstance(item, Metric) for item in value) else "list"
    return "scalar"


def _combine_key(name: str, values: list) -> float:
    """One float from one rank's value per rank for metric ``name`` (rules: combine_rank_metrics)."""
    kinds = [_value_kind(value) for value in values]
    if set(kinds) == {"empty"}:
        return float("nan")
    if set(kinds) == {"metric"}:
        pooled = [v if isinstance(v, Metric) else pool_metrics(name, list(v)) for v in values]
        try:
            return Metric.aggregate_dp(pooled)
        except ValueError as error:
            raise ValueError(f"metric {name!r}: {error}") from error
    if set(kinds) == {"scalar"}:
        return float(np.mean([to_scalar(v, f"metric {name!r}") for v in values]))
    if set(kinds) <= {"list", "empty"}:
        return reduce_metrics({name: [item for value in values for item in value]})[name]
    raise TypeError(
        f"metric {name!r} has different kinds of value across ranks ({kinds}, rank order); "
        "report the same kind on every rank: Metric or list of Metrics, a scalar, or a plain list"
    )
