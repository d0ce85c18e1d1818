"""Metrics that carry their own aggregation, and the reduction of per-micro-batch metric lists.

Workers return one value per micro-batch; the driver reduces each list to one number per step.
A :class:`Metric` (or a list of them, one per micro-batch) says how (mean, sum, min or max).
Plain lists fall back to verl's key-substring rule, see :func:`reduce_metrics`.
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import Enum

import numpy as np
import torch

Numeric = int | float | np.number | np.ndarray | torch.Tensor


class AggregationType(Enum):
    """How a metric's values combine: arithmetic mean, sum, minimum or maximum."""

    MEAN = "mean"
    SUM = "sum"
    MIN = "min"
    MAX = "max"


_REDUCERS = {
    AggregationType.MEAN: np.mean,
    AggregationType.SUM: np.sum,
    AggregationType.MIN: np.min,
    AggregationType.MAX: np.max,
}


def to_scalar(value: object, what: str = "metric value") -> float:
    """int, float, numpy scalar, 1-element ndarray or 1-element tensor → Python float.

    Raises ``ValueError`` for a tensor/array with more than one element and ``TypeError`` for other
    types (str, None, lists …), naming ``what``.

    Example:
        >>> to_scalar(torch.tensor([2.5])), to_scalar(np.int64(3)), to_scalar(True)
        (2.5, 3.0, 1.0)
    """
    if isinstance(value, torch.Tensor | np.ndarray):
        size = value.size if isinstance(value, np.ndarray) else value.numel()
        if size == 1:
            return float(value.item())
        raise ValueError(
            f"{what} must be a scalar, got a {type(value).__name__} of shape {tuple(value.shape)}; "
            "reduce it first (e.g. .mean())"
        )
    if isinstance(value, int | float | np.number | np.bool_):
        return float(value)
    raise TypeError(
        f"{what} must be int, float or a scalar tensor/array, got {type(value).__name__}"
    )


class Metric:
    """Values collected for one metric, with the aggregation that turns them into one number.

    ``append`` takes int, float, numpy scalars, 1-element ndarrays or tensors (a ``.item()`` host
    sync for tensors), or another Metric (its values are added; same aggregation required).
    A multi-element tensor or array raises ``ValueError`` (verl accepts multi-element ndarrays;
    ppoflow rejects them, since they would silently change the denominator).

    Example:
        >>> metric = Metric("mean", [1.0, 2.0])
        >>> metric.append(torch.tensor(3.0))
        >>> metric.aggregate()
        2.0
        >>> Metric.aggregate_dp([Metric("max", [1, 7]), Metric("max", [5, 2])])
        7.0
    """

    def __init__(
        self, aggregation: str | AggregationType, value: Numeric | Metric | list | None = None
    ) -> None:
        try:
            self.aggregation = AggregationType(aggregation)
        except ValueError:
            known = [member.value for member in AggregationType]
            raise ValueError(f"unknown aggregation {aggregation!r}; known: {known}") from None
        self.values: list[float] = []
        if isinstance(value, list | tuple):
            self.extend(value)
        elif value is not None:
            self.append(value)

    def __repr__(self) -> str:
        return f"Metric({self.aggregation.value!r}, {self.values!r})"

    def append(self, value: Numeric | Metric) -> None:
        """Add one scalar value, or every value of another Metric with the same aggregation."""
        if isinstance(value, Metric):
            self.extend(value)
            return
        self.values.append(to_scalar(value, f"{self.aggregation.value} metric value"))

    def extend(self, values: Metric | Iterable[Numeric]) -> None:
        """Add several values; a Metric must have the same aggregation."""
        if isinstance(values, Metric):
            if values.aggregation is not self.aggregation:
                raise ValueError(
                    f"cannot extend a {self.aggregation.value!r} metric with a "
                    f"{values.aggregation.value!r} one; aggregations must match"
                )
            values = values.values
        for value in values:
            self.append(value)

    def aggregate(self) -> float:
        """The aggregation over all values; raises ``ValueError`` when there are none."""
        if not self.values:
            raise ValueError(f"cannot aggregate an empty {self.aggregation.value!r} metric")
        return float(_REDUCERS[self.aggregation](self.values))

    @classmethod
    def aggregate_dp(cls, metric_lists: list[Metric]) -> float:
        """Combine one Metric per data-parallel rank, each holding one value per micro-batch.

        The values form a [dp, micro] matrix (every rank must hold the same count). SUM and MEAN
        take the mean over ranks first, then sum / mean over micro-batches (a loss already divided
        by the global token count sums over micro-batches); MIN and MAX reduce over all values.

        Example:
            >>> ranks = [Metric("sum", [1.0, 2.0]), Metric("sum", [3.0, 4.0])]
            >>> Metric.aggregate_dp(ranks)  # mean over ranks [2, 3], then sum
            5.0
        """
        if not metric_lists:
            raise ValueError("aggregate_dp needs at least one Metric (one per DP rank), got none")
        aggregations = {metric.aggregation for metric in metric_lists}
        if len(aggregations) > 1:
            found = sorted(a.value for a in aggregations)
            raise ValueError(f"aggregate_dp needs one aggregation across ranks, got {found}")
        counts = [len(metric.values) for metric in metric_lists]
        if len(set(counts)) > 1 or counts[0] == 0:
            raise ValueError(
                f"aggregate_dp needs the same non-zero number of values on every rank, got {counts}"
            )
        matrix = np.array([metric.values for metric in metric_lists])  # [dp, micro]
        aggregation = metric_lists[0].aggregation
        if aggregation in (AggregationType.SUM, AggregationType.MEAN):
            return float(_REDUCERS[aggregation](matrix.mean(axis=0)))
        return float(_REDUCERS[aggregation](matrix))

    @classmethod
    def from_dict(
        cls, data: dict[str, Numeric], aggregation: str | AggregationType
    ) -> dict[str, Metric]:
        """One Metric per key, all with ``aggregation``."""
        return {key: cls(aggregation, value) for key, value in data.items()}

    def init_list(self) -> Metric:
        """An empty Metric with the same aggregation."""
        return Metric(self.aggregation)


def _fallback_reducer(key: str):
    if "max" in key:
        return np.max
    if "min" in key:
        return np.min
    return np.mean


def pool_metrics(key: str, items: list) -> Metric:
    """One Metric of the common aggregation of ``items``, a list of Metrics (one per micro-batch).

    ``items`` holds at least one Metric; numbers beside them are values of that aggregation.
    Different aggregations, or no values at all, raise ``ValueError`` naming ``key``.
    """
    aggregations = {item.aggregation for item in items if isinstance(item, Metric)}
    if len(aggregations) > 1:
        found = sorted(aggregation.value for aggregation in aggregations)
        raise ValueError(
            f"metric {key!r} holds Metric objects with different aggregations {found}; "
            "one key needs one aggregation"
        )
    combined = Metric(aggregations.pop())
    for item in items:  # a number is one more value of the Metrics' aggregation
        combined.append(
            item if isinstance(item, Metric) else to_scalar(item, f"metric {key!r} value")
        )
    if not combined.values:
        raise ValueError(f"metric {key!r} holds {len(items)} Metric objects with no values")
    return combined


def reduce_metrics(metrics: dict[str, Metric | list | tuple | Numeric]) -> dict[str, float]:
    """One float per key: a Metric by its own aggregation, a plain list by the key's substrings.

    Each value may be:

    - a :class:`Metric`: its ``aggregate()``;
    - a list (or tuple) of Metric objects, as verl's ``append_to_dict`` builds one per
      micro-batch: their values are combined into one Metric of their common aggregation, so
      SUM partial losses (each already divided by the global token count) add up to the global
      mean, MEAN is the mean of all values, MIN / MAX are over all values. Different aggregations
      in one list raise ``ValueError``. Plain numbers in such a list are taken as values of the
      Metrics' aggregation (as ``Metric.append`` takes them). This reduces one rank's
      micro-batches; one Metric per DP rank goes through :meth:`Metric.aggregate_dp` instead;
    - a plain list of numbers: verl's fallback, np.max if the key contains the substring
      ``"max"``, else np.min if it contains ``"min"``, else np.mean. It is a substring test, so
      ``actor/perf/max_memory_allocated_gb`` is a max and ``admin/requests`` is a *min* ("admin"
      contains "min"). Wrap a value in a Metric to choose its aggregation explicitly;
    - an empty list: NaN, verl's result (np.mean of an empty list), without numpy's warning;
    - a scalar: taken as a one-element list.

    An empty Metric (or a list of Metrics with no values at all) still raises ``ValueError``.
    Unlike verl, the input dict is not modified; a new dict is returned.

    Example:
        >>> reduce_metrics({"loss": [1.0, 3.0], "max_len": [4, 9], "admin/x": [5, 2],
        ...                 "actor/pg_loss": Metric("sum", [0.5, 0.25])})
        {'loss': 2.0, 'max_len': 9.0, 'admin/x': 2.0, 'actor/pg_loss': 0.75}

        Two micro-batches with token sums 3 and 5 over 8 global tokens, and an empty list:

        >>> reduce_metrics({"actor/pg_loss": [Metric("sum", 3 / 8), Metric("sum", 5 / 8)],
        ...                 "actor/kl_loss": []})
        {'actor/pg_loss': 1.0, 'actor/kl_loss': nan}
    """
    reduced = {}
    for key, value in metrics.items():
        if isinstance(value, Metric):
            reduced[key] = value.aggregate()
            continue
        items = list(value) if isinstance(value, list | tuple) else [value]
        if not items:
            reduced[key] = float("nan")
        elif any(isinstance(item, Metric) for item in items):
            reduced[key] = pool_metrics(key, items).aggregate()
        else:
            scalars = [to_scalar(item, f"metric {key!r} value") for item in items]
            reduced[key] = float(_fallback_reducer(key)(scalars))
    return reduced
