"""The MLflow run description: what the run is, and what each of its metrics means.

MLflow shows the tag ``mlflow.note.content`` as the run's description (markdown). ppoflow writes
there a header from the run's tags (run directory, ppoflow version and commit, config digest,
resumed step; flows/runs/identity.py), a link to the experiment's headline charts
(flows/sinks/headline_view.py) and a table of every metric the run logged, with what it
measures and its denominator from stages/metrics/catalog.py (the train flow's own metrics, such
as ``ppoflow/cache_hits``, from flows/runs/identity.py). Names of one catalog entry share a
row (``critic/score/max``, ``critic/score/mean`` and ``critic/score/min`` are one row), so the
table has one row per kind of metric.

MLflow caps a tag value at 8000 characters; a longer table ends early with a line saying how
many rows were left out and pointing at the run's ``metric_descriptions.json`` artifact, which
holds every name's description.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from mlflow.utils.validation import MAX_TAG_VAL_LENGTH

from flows.sinks.flow_metrics import FLOW_METRICS
from stages.metrics.catalog import MetricDoc, find_metric_doc

NOTE_TAG = "mlflow.note.content"
TABLE_HEAD = "| metric | what it measures | denominator |\n|---|---|---|"
HEADLINE_LINK = (
    "**Charts:** [the headline charts first]({}) (score, validation, response length, entropy, "
    "KL to the reference), every run of the experiment"
)
NO_DOC = "(no description in stages/metrics/catalog.py)"
HEADER_TAGS = (
    ("ppoflow.run_dir", "run directory", "`{}`"),
    ("ppoflow.version", "ppoflow", "{}"),
    ("ppoflow.commit", "commit", "`{}`"),
    ("ppoflow.config_digest", "config sha256", "`{:.16}…`"),
    ("ppoflow.resumed_from_step", "resumed from step", "{}"),
)


def metric_doc(name: str) -> MetricDoc | None:
    """The description of ``name``: the catalog's entry, else the train flow's own
    (flows/sinks/flow_metrics.py ``FLOW_METRICS``), else None.

    >>> metric_doc("ppoflow/cache_hits").denominator, metric_doc("actor/nope")
    ("none (a count of the step's stages)", None)
    """
    return find_metric_doc(name) or FLOW_METRICS.get(name)


def describe(name: str) -> str:
    """One line: what ``name`` measures and its denominator, or that nothing describes it.

    >>> describe("training/global_step")
    'The global step number (1-based). Denominator: none (a counter).'
    """
    doc = metric_doc(name)
    return NO_DOC if doc is None else doc.description()


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def metric_rows(names: Iterable[str]) -> list[str]:
    """One markdown row per catalog entry among ``names`` (or per unknown name), in name order.

    >>> for row in metric_rows(["critic/score/min", "critic/score/mean", "actor/nope"]):
    ...     print(row.split(" | ")[:2])
    ['| `actor/nope`', '(no description in stages/metrics/catalog.py)']
    ['| `critic/score/mean`, `critic/score/min`', 'Sequence score Σ_t token_level_scores (reward before any KL penalty) per row: mean, max or min.']
    """
    groups: dict[str, tuple[list[str], str, str]] = {}
    for name in sorted(set(names)):
        doc = metric_doc(name)
        key, what, denominator = (
            (name, NO_DOC, "") if doc is None else (doc.pattern, doc.what, doc.denominator)
        )
        groups.setdefault(key, ([], what, denominator))[0].append(name)
    rows = []
    for members, what, denominator in groups.values():
        listed = ", ".join(f"`{name}`" for name in members)
        rows.append(f"| {_cell(listed)} | {_cell(what)} | {_cell(denominator)} |")
    return rows


def header_line(tags: Mapping[str, str], run_name: str | None = None) -> str:
    """The description's first line, from the tags in :data:`HEADER_TAGS` that are set.

    >>> header_line({"ppoflow.version": "0.1.0", "ppoflow.resumed_from_step": "2"}, "grpo")
    '**grpo** · ppoflow 0.1.0 · resumed from step 2'
    """
    parts = [f"**{run_name}**"] if run_name else []
    for tag, label, form in HEADER_TAGS:
        if tags.get(tag):
            parts.append(f"{label} {form.format(tags[tag])}")
    return " · ".join(parts)


def description_markdown(
    names: Iterable[str],
    tags: Mapping[str, str],
    run_name: str | None = None,
    limit: int = MAX_TAG_VAL_LENGTH,
    headline_address: str | None = None,
) -> str:
    """The run description (module docstring), at most ``limit`` characters; with
    ``headline_address``, a line under the header links the experiment's headline charts
    (flows/sinks/headline_view.py).

    >>> text = description_markdown(["training/global_step"], {"ppoflow.version": "0.1"}, "r")
    >>> print(text)
    **r** · ppoflow 0.1
    <BLANKLINE>
    | metric | what it measures | denominator |
    |---|---|---|
    | `training/global_step` | The global step number (1-based). | none (a counter) |
    >>> len(description_markdown([f"timing_s/s{i}" for i in range(400)], {}, limit=1000)) <= 1000
    True
    """
    head = header_line(tags, run_name)
    if headline_address:
        head += f"\n\n{HEADLINE_LINK.format(headline_address)}"
    head += f"\n\n{TABLE_HEAD}"
    rows = metric_rows(names)
    kept: list[str] = []
    size = len(head)
    for index, row in enumerate(rows):
        left = len(rows) - index - 1
        footer = f"\n\n… {left + 1} more row(s): see the artifact metric_descriptions.json"
        if size + 1 + len(row) + (len(footer) if left else 0) > limit:
            return "\n".join([head, *kept]) + footer
        kept.append(row)
        size += 1 + len(row)
    return "\n".join([head, *kept])


__all__ = [
    "NOTE_TAG",
    "describe",
    "description_markdown",
    "header_line",
    "metric_doc",
    "metric_rows",
]
