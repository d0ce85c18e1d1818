"""Step metrics: data, timing, throughput and validation statistics, reduction, names, descriptions.

Pure functions over DataProto batches and plain values; nothing here logs. The flow sends the
returned floats to MLflow once per step (names through :func:`sanitize_metric_name`).
verl's names are kept, including its ``compute_throughout_metrics`` spelling.

The names below are loaded from their submodule on first use (PEP 562), so a process that
needs only the catalog and the names (flows/mlflow_process.py) does not import torch.
"""

from __future__ import annotations

import importlib
from typing import Any

#: exported name → the submodule of this package that defines it
_EXPORTS = {
    "IS_PAD": "data",
    "METRICS": "catalog",
    "TOOL_CALL_COUNTS": "data",
    "AggregationType": "metric",
    "Metric": "metric",
    "MetricDoc": "catalog",
    "bootstrap_metric": "validation",
    "calc_maj_val": "validation",
    "compute_data_metrics": "data",
    "compute_throughout_metrics": "timing",
    "compute_throughput_metrics": "timing",
    "compute_timing_metrics": "timing",
    "describe_metric": "catalog",
    "escape_markdown_table": "naming",
    "explained_variance": "data",
    "find_metric_doc": "catalog",
    "kept_rows": "data",
    "markdown_table": "catalog",
    "masked_stats": "data",
    "process_validation_metrics": "validation",
    "reduce_metrics": "metric",
    "renamed_metrics": "naming",
    "resample_sizes": "validation",
    "response_lengths": "data",
    "restore_metric_name": "naming",
    "sanitize_metric_name": "naming",
    "sanitize_metrics": "naming",
    "split_val_core_aux": "validation",
    "timed": "timing",
    "to_floats": "data",
    "to_scalar": "metric",
}

__all__ = list(_EXPORTS)


def __getattr__(name: str) -> Any:
    """The exported ``name``, imported from its submodule the first time it is asked for."""
    submodule = _EXPORTS.get(name)
    if submodule is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{submodule}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})
