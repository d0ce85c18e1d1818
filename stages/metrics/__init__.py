"""Step metrics: data, timing, throughput and validation statistics, reduction, names, descriptions.

Pure functions over DataProto batches and plain values; nothing here logs. The flow sends the
returned floats to MLflow once per step (names through :func:`sanitize_metric_name`).
verl's names are kept, including its ``compute_throughout_metrics`` spelling.
"""

from stages.metrics.catalog import (
    METRICS,
    MetricDoc,
    describe_metric,
    find_metric_doc,
    markdown_table,
)
from stages.metrics.data import (
    IS_PAD,
    TOOL_CALL_COUNTS,
    compute_data_metrics,
    explained_variance,
    kept_rows,
    masked_stats,
    response_lengths,
    to_floats,
)
from stages.metrics.metric import AggregationType, Metric, reduce_metrics, to_scalar
from stages.metrics.naming import (
    escape_markdown_table,
    renamed_metrics,
    restore_metric_name,
    sanitize_metric_name,
    sanitize_metrics,
)
from stages.metrics.timing import (
    compute_throughout_metrics,
    compute_throughput_metrics,
    compute_timing_metrics,
    timed,
)
from stages.metrics.validation import (
    bootstrap_metric,
    calc_maj_val,
    process_validation_metrics,
    resample_sizes,
    split_val_core_aux,
)

__all__ = [
    "IS_PAD",
    "METRICS",
    "TOOL_CALL_COUNTS",
    "AggregationType",
    "Metric",
    "MetricDoc",
    "bootstrap_metric",
    "calc_maj_val",
    "compute_data_metrics",
    "compute_throughout_metrics",
    "compute_throughput_metrics",
    "compute_timing_metrics",
    "describe_metric",
    "escape_markdown_table",
    "explained_variance",
    "find_metric_doc",
    "kept_rows",
    "markdown_table",
    "masked_stats",
    "process_validation_metrics",
    "reduce_metrics",
    "renamed_metrics",
    "resample_sizes",
    "response_lengths",
    "restore_metric_name",
    "sanitize_metric_name",
    "sanitize_metrics",
    "split_val_core_aux",
    "timed",
    "to_floats",
    "to_scalar",
]
