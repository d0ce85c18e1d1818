"""The experiment's headline charts: a saved MLflow chart view that opens on what a run is for.

MLflow's chart view groups a run's metrics by the name up to its last ``/`` and sorts the groups
alphabetically, so a training run opens on its ``actor/*`` charts and the score is a search away.
MLflow has no API for a run page's chart layout, but its experiment page reads a *saved view*
from an experiment tag ``mlflow.sharedViewState.<key>`` (what its *Views* menu saves and lists:
the chart cards, their sections and their order) when the address carries
``viewStateShareKey=<key>``.
ppoflow writes one such view, :data:`VIEW_KEY`, whose first section, *Headline*, holds one line
chart per headline metric in :data:`HEADLINE_PATTERNS` order; every other metric keeps its usual
section, the sections in name order after it. The *Views* menu of the experiment's runs page
lists it as :data:`VIEW_NAME`; :func:`view_address` is the page that opens it.

The view is pure data (:func:`shared_view_state`); the MLflow logger writes it
(flows/sinks/mlflow_logger.py) with the run description, which links to it.
"""

from __future__ import annotations

import base64
import json
import re
import zlib
from collections.abc import Iterable, Mapping
from typing import Any

VIEW_KEY = "ppoflow-headline"
VIEW_TAG = f"mlflow.sharedViewState.{VIEW_KEY}"
VIEW_NAME = "Headline charts (ppoflow)"
COMPRESSED_PREFIX = "deflate;"
HEADLINE_SECTION = "Headline"
#: the section MLflow files a metric without a ``/`` under, and its system metrics' section
UNGROUPED_SECTION, SYSTEM_SECTION = "Model metrics", "System metrics"

#: what a training run is judged by, in the order the view shows it: the training score, the
#: validation's core metric and reward, the response length and how often it hit the limit, the
#: policy's entropy, and the KL to the reference policy where there is one (in the loss, or in
#: the reward)
HEADLINE_PATTERNS = (
    r"critic/score/mean",
    r"val-core/.+/mean@\d+",
    r"val-aux/.+/reward/mean@\d+",
    r"response_length/mean",
    r"response_length/clip_ratio",
    r"actor/entropy",
    r"actor/kl_loss",
    r"actor/reward_kl_penalty",
)


def headline_metrics(names: Iterable[str]) -> list[str]:
    """The headline metrics among ``names`` (the names the run logs, as ppoflow names them), in
    :data:`HEADLINE_PATTERNS` order, names matching one pattern in name order.

    >>> headline_metrics(["actor/pg_loss", "actor/entropy", "val-core/a/acc/mean@1", "critic/score/mean"])
    ['critic/score/mean', 'val-core/a/acc/mean@1', 'actor/entropy']
    """
    unique = sorted(set(names))
    ordered: list[str] = []
    for pattern in HEADLINE_PATTERNS:
        ordered += [name for name in unique if re.fullmatch(pattern, name)]
    return ordered


def section_name(logged: str) -> str:
    """The chart section MLflow files a logged metric name under: the name up to its last
    ``/``, :data:`UNGROUPED_SECTION` without one, :data:`SYSTEM_SECTION` for ``system/…``.

    >>> section_name("critic/score/mean"), section_name("loss"), section_name("system/cpu_utilization_percentage")
    ('critic/score', 'Model metrics', 'System metrics')
    """
    prefix = logged.rsplit("/", 1)[0] if "/" in logged else ""
    if prefix == "":
        return UNGROUPED_SECTION
    return SYSTEM_SECTION if prefix == "system" else prefix


def line_chart(logged: str, section_uuid: str, index: int) -> dict[str, Any]:
    """One line chart of ``logged`` (its MLflow name) against the step, as MLflow's chart view
    stores a card."""
    return {
        "uuid": f"{VIEW_KEY}-{index}",
        "type": "LINE",
        "metricSectionId": section_uuid,
        "metricKey": logged,
        "selectedMetricKeys": [logged],
        "displayName": logged,
        "runsCountToCompare": 10,
        "deleted": False,
        "isGenerated": False,
        "lineSmoothness": 0,
        "xAxisScaleType": "linear",
        "scaleType": "linear",
        "range": {},
        "xAxisKey": "step",
        "selectedXAxisMetricKey": "",
        "yAxisKey": "metric",
        "yAxisExpressions": [],
        "ignoreOutliers": False,
        "useGlobalXaxisKey": True,
        "useGlobalLineSmoothing": True,
    }


def shared_view_state(logged_names: Mapping[str, str]) -> dict[str, Any]:
    """The saved view (module docstring) for a run whose metrics are ``logged_names``
    (MLflow name → ppoflow name: MLflow's names replace characters it refuses, ``mean@1`` is
    logged as ``mean_at_1``): the *Headline* section with one line chart per headline metric,
    then one section per other group of names, in name order. MLflow files each metric without a
    chart here under its section by name, so only the headline charts are listed; a headline
    metric is not drawn twice.

    >>> view = shared_view_state({"critic/score/mean": "critic/score/mean", "actor/pg_loss": "actor/pg_loss"})
    >>> [s["name"] for s in view["compareRunSections"]], [c["metricKey"] for c in view["compareRunCharts"]]
    (['Headline', 'actor', 'critic/score'], ['critic/score/mean'])
    """
    logged_of = {ours: logged for logged, ours in logged_names.items()}
    headline = [logged_of[name] for name in headline_metrics(logged_of)]
    sections = [
        {"uuid": f"{VIEW_KEY}-section", "name": HEADLINE_SECTION, "display": True}
        | {"isReordered": True, "deleted": False, "isGenerated": False}
    ]
    for name in sorted({section_name(logged) for logged in logged_names}):
        sections.append(
            {"uuid": f"{VIEW_KEY}-section-{name}", "name": name, "display": True}
            | {"isReordered": False, "deleted": False, "isGenerated": True}
        )
    return {
        "compareRunCharts": [
            line_chart(logged, sections[0]["uuid"], index) for index, logged in enumerate(headline)
        ],
        "compareRunSections": sections,
        "isAccordionReordered": True,
        "hideEmptyCharts": True,
    }


def view_tag_value(state: Mapping[str, Any], created_ms: int, updated_ms: int) -> str:
    """The tag's text for the view ``state``: MLflow's saved-view envelope, JSON with the name
    the *Views* menu lists (:data:`VIEW_NAME`), the times in milliseconds, and the state as
    MLflow compresses it (``deflate;`` + base64 of the zlib-deflated JSON), so a view of many
    sections fits a tag's 8000 characters.

    >>> import base64, json, zlib
    >>> envelope = json.loads(view_tag_value({"compareRunCharts": []}, 1, 2))
    >>> envelope["name"], envelope["createdAt"], envelope["updatedAt"]
    ('Headline charts (ppoflow)', 1, 2)
    >>> json.loads(zlib.decompress(base64.b64decode(envelope["state"].removeprefix("deflate;"))))
    {'compareRunCharts': []}
    """
    text = json.dumps(state, separators=(",", ":"))
    packed = COMPRESSED_PREFIX + base64.b64encode(zlib.compress(text.encode())).decode()
    envelope = {"name": VIEW_NAME, "createdAt": created_ms, "updatedAt": updated_ms}
    return json.dumps(envelope | {"state": packed}, separators=(",", ":"))


def view_address(experiment_id: str) -> str:
    """The MLflow UI address (after the server's root) of the experiment's runs page in its
    chart mode with the headline view loaded, in MLflow 3's model-training mode (which its UI
    does not take from the experiment: docs/dashboards.md).

    >>> view_address("3")
    '#/experiments/3/runs?compareRunsMode=CHART&viewStateShareKey=ppoflow-headline&workflowType=machine_learning'
    """
    return (
        f"#/experiments/{experiment_id}/runs?compareRunsMode=CHART"
        f"&viewStateShareKey={VIEW_KEY}&workflowType=machine_learning"
    )


__all__ = [
    "HEADLINE_PATTERNS",
    "VIEW_KEY",
    "VIEW_NAME",
    "VIEW_TAG",
    "headline_metrics",
    "section_name",
    "shared_view_state",
    "view_address",
    "view_tag_value",
]
