"""The MLflow run description (flows/sinks/run_description.py): header, one row per catalog entry,
and the cut at MLflow's tag length that says what was left out."""

from __future__ import annotations

from flows.runs.identity import CACHE_HITS, FLOW_METRICS
from flows.sinks.run_description import (
    NO_DOC,
    describe,
    description_markdown,
    header_line,
    metric_rows,
)
from stages.metrics.catalog import find_metric_doc, step_metric_names

FLAGS = dict(
    use_critic=True,
    use_reference_policy=True,
    balance_batch=True,
    use_kl_in_reward=True,
    use_kl_loss=True,
)


def test_every_row_is_a_catalog_entry_with_its_denominator():
    names = step_metric_names(**FLAGS)
    rows = metric_rows(names)
    patterns = {find_metric_doc(name).pattern for name in names}
    assert len(rows) == len(patterns) < len(names)  # names of one entry share a row
    for name in names:
        doc = find_metric_doc(name)
        (row,) = [row for row in rows if f"`{name}`" in row]
        assert row.endswith(f"| {doc.what.replace('|', chr(92) + '|')} | {doc.denominator} |")


def test_an_unknown_metric_gets_a_row_saying_so():
    (row,) = metric_rows(["my_plugin/thing"])
    assert row == f"| `my_plugin/thing` | {NO_DOC} |  |"
    assert describe("my_plugin/thing") == NO_DOC


def test_the_flows_own_metrics_are_described_without_entering_the_catalog():
    assert find_metric_doc(CACHE_HITS) is None  # docs/metrics.md is the catalog's alone
    (row,) = metric_rows([CACHE_HITS])
    doc = FLOW_METRICS[CACHE_HITS]
    assert row == f"| `{CACHE_HITS}` | {doc.what} | {doc.denominator} |"
    assert describe(CACHE_HITS) == doc.description()


def test_the_header_shows_only_the_tags_that_are_set():
    tags = {"ppoflow.run_dir": "/r", "ppoflow.config_digest": "ab" * 32, "other": "x"}
    assert (
        header_line(tags, "exp")
        == "**exp** · run directory `/r` · config sha256 `abababababababab…`"
    )
    assert header_line({}) == ""


def test_a_long_table_is_cut_at_the_limit_and_says_how_many_rows_are_left_out():
    names = [*step_metric_names(**FLAGS), *(f"timing_s/stage_{i}" for i in range(5))]
    whole = description_markdown(names, {}, "exp", limit=10**6)
    assert "more row(s)" not in whole
    cut = description_markdown(names, {}, "exp", limit=2000)
    assert len(cut) <= 2000
    kept = [line for line in cut.splitlines() if line.startswith("| `")]
    total = [line for line in whole.splitlines() if line.startswith("| `")]
    left = len(total) - len(kept)
    assert left > 0 and cut.endswith(
        f"… {left} more row(s): see the artifact metric_descriptions.json"
    )
    assert whole.startswith(cut.rsplit("\n\n…", 1)[0])
