"""Step metrics: data, timing, throughput and validation statistics, reduction, names, descriptions.

Pure functions over DataProto batches and plain values; nothing here logs. The flow sends the
returned floats to MLflow once per step (names through :func:`sanitize_metric_name`).
verl's names are kept, including its ``compute_throughout_metrics`` spelling.

The names below are loaded from their submodule on first use (PEP 562), so a process that
needs only the catalog and the names (flows/sinks/mlflow_process.py) does not import torch.
"""

from __future__ import annotations

from stages.lazy_exports import lazy_exports

#: exported name → the module that defines it
_EXPORTS = {
    "IS_PAD": "stages.metrics.data",
    "METRICS": "stages.metrics.catalog",
    "TOOL_CALL_COUNTS": "stages.metrics.data",
    "AggregationType": "stages.metrics.metric",
    "Metric": "stages.metrics.metric",
    "MetricDoc": "stages.metrics.catalog",
    "bootstrap_metric": "stages.metrics.validation",
    "calc_maj_val": "stages.metrics.validation",
    "compute_data_metrics": "stages.metrics.data",
    "compute_throughout_metrics": "stages.metrics.timing",
    "compute_throughput_metrics": "stages.metrics.timing",
    "compute_timing_metrics": "stages.metrics.timing",
    "describe_metric": "stages.metrics.catalog",
    "escape_markdown_table": "stages.metrics.naming",
    "explained_variance": "stages.metrics.data",
    "find_metric_doc": "stages.metrics.catalog",
    "kept_rows": "stages.metrics.data",
    "markdown_table": "stages.metrics.catalog",
    "masked_stats": "stages.metrics.data",
    "process_validation_metrics": "stages.metrics.validation",
    "reduce_metrics": "stages.metrics.metric",
    "renamed_metrics": "stages.metrics.naming",
    "resample_sizes": "stages.metrics.validation",
    "response_lengths": "stages.metrics.data",
    "restore_metric_name": "stages.metrics.naming",
    "sanitize_metric_name": "stages.metrics.naming",
    "sanitize_metrics": "stages.metrics.naming",
    "split_val_core_aux": "stages.metrics.validation",
    "timed": "stages.metrics.timing",
    "to_floats": "stages.metrics.data",
    "to_scalar": "stages.metrics.metric",
}

__all__ = list(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
