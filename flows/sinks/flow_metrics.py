"""The train flow's own metrics and what they measure (flows/runs/identity.py computes them).

A module of its own, importing only the metric catalog, so a process that only logs
(flows/sinks/mlflow_process.py) can describe them without torch.
"""

from __future__ import annotations

from stages.metrics.catalog import MetricDoc

CACHE_HITS = "ppoflow/cache_hits"
#: what the train flow's own metrics measure, beside stages/metrics/catalog.py's (which documents
#: the stages' metrics and generates docs/metrics.md): looked up by flows/sinks/run_description.py
FLOW_METRICS = {
    CACHE_HITS: MetricDoc(
        CACHE_HITS,
        "Stages of the step whose output was taken from the cache (a stored artifact with the same "
        "cache key) instead of computed; weight updates always compute.",
        "none (a count of the step's stages)",
        "train flow",
    ),
}
