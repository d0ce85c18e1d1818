"""What ``ppoflow inspect RUN_DIR`` shows: a run's steps and stages, as text or as JSON data.

Everything here reads a :class:`~flows.runs.store.RunStore` (a local path or any fsspec URL) and
returns a string or a dict; nothing prints. Three text views:

- :func:`run_table`: one row per step, one column per stage that ran or was cached in some step
  (``ran`` / ``cached`` / ``skipped``; ``-`` where the step has no record of the stage yet), the
  step's score (``critic/score/mean``), time (``timing_s/step``) and artifact bytes, then totals.
- :func:`step_text`: one step's stage records (status, rows, size, seconds, fingerprint, reason),
  their artifact paths and the metrics each stage reported.
- :func:`stage_text`: one stage record in full plus the artifact's description (schema, statistics,
  token ledger; ``dataproto/report.py``).

:func:`run_json` is the machine-readable form: ``{"run_dir", "config", "steps": [{"step",
"status", "input_artifact", "input_fingerprint", "metrics", "stages": [{"stage", "status",
"reason", "artifact", "fingerprint", "cache_key", "rows", "nbytes", "timing_s", "metrics"}]}]}``;
each step is its journal's ``StepJournal.to_json()``, so fields the journal gains (``weights``)
appear too. ``config`` is None when the run has no ``config.json``; ``rerun`` is the
``rerun.json`` of a re-run branch (parent run, step, stages, overrides), None otherwise.
It is strict JSON (``json.dumps(..., allow_nan=False)`` accepts it): a NaN or ±inf metric or config
value is written as ``{"float": "nan"}`` / ``{"float": "inf"}`` / ``{"float": "-inf"}``, the
convention of ``run_store.encode_metrics`` (``run_store.decode_metrics`` reads it back).

Artifact paths are shown as the journal records them. A re-run branch reuses stages of its parent
run, so a ``cached`` stage's artifact may lie outside the run directory; the text views write
paths inside the run directory relative to it and every other path in full.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import Any, Literal

import fsspec

from dataproto.artifact import Verify, read_manifest
from dataproto.artifact_store import MANIFEST
from dataproto.report import describe_artifact
from flows.jsonable import jsonable
from flows.runs.derived_keys import from_step_input
from flows.runs.retention import RetentionPolicy, pruned_error
from flows.runs.store import (
    CONFIG_FILE,
    JOURNAL_FILE,
    RERUN_FILE,
    RunStore,
    StageRecord,
    StepJournal,
)

SCORE_METRIC = "critic/score/mean"
STEP_TIME_METRIC = "timing_s/step"
SHORT_FINGERPRINT = 12
# (label, dotted config key): shown in the run header when the config has them
CONFIG_SUMMARY = (
    ("experiment", "trainer.experiment_name"),
    ("estimator", "algorithm.adv_estimator"),
    ("total steps", "trainer.total_training_steps"),
)


class RunReportError(ValueError):
    """A path, step or stage that is not in the run; the message lists what exists."""


# --- what a path is ----------------------------------------------------------------------------


def path_kind(path: str | os.PathLike) -> Literal["run", "artifact"]:
    """``"artifact"`` when ``path`` holds ``manifest.json``, ``"run"`` when it holds ``config.json``
    or a ``step_<k>/journal.json``; otherwise :class:`RunReportError` naming both expectations."""
    url = os.fspath(path)
    fs, root = fsspec.core.url_to_fs(url)
    root = root.rstrip("/")
    if fs.isfile(f"{root}/{MANIFEST}"):
        return "artifact"
    if fs.isfile(f"{root}/{CONFIG_FILE}") or RunStore(url).steps():
        return "run"
    found = "is not a run or artifact directory" if fs.exists(root) else "does not exist"
    raise RunReportError(
        f"{url} {found}: expected a run directory (with {CONFIG_FILE} or step_<k>/journal.json, "
        f"as `ppoflow train` writes) or an artifact directory (with {MANIFEST})"
    )


# --- small formatting helpers ------------------------------------------------------------------


def format_bytes(nbytes: int | None) -> str:
    """Bytes in binary units.

    >>> [format_bytes(n) for n in (None, 594, 176674, 3 * 2**30)]
    ['-', '594 B', '172.5 KiB', '3.0 GiB']
    """
    if nbytes is None:
        return "-"
    value, unit = float(nbytes), "B"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            break
        value /= 1024
    return f"{nbytes} B" if unit == "B" else f"{value:.1f} {unit}"


def format_number(value: float | None) -> str:
    """``-`` for a missing value, ``nan`` / ``inf`` as such, else 4 significant digits.

    >>> [format_number(v) for v in (None, float("nan"), 0.123456, 1570.0)]
    ['-', 'nan', '0.1235', '1570']
    """
    return "-" if value is None else f"{value:.4g}"


def format_seconds(value: float | None) -> str:
    """Seconds with millisecond resolution; ``-`` when missing.

    >>> [format_seconds(v) for v in (None, 0.008519, 12.5)]
    ['-', '0.009', '12.500']
    """
    return "-" if value is None else f"{value:.3f}"


def format_steps(steps: Sequence[int]) -> str:
    """Step numbers as ranges.

    >>> format_steps([1, 2, 3, 5, 7, 8])
    '1-3, 5, 7-8'
    >>> format_steps([])
    'none'
    """
    if not steps:
        return "none"
    runs: list[list[int]] = []
    for step in steps:
        if runs and step == runs[-1][-1] + 1:
            runs[-1].append(step)
        else:
            runs.append([step])
    return ", ".join(str(r[0]) if len(r) == 1 else f"{r[0]}-{r[-1]}" for r in runs)


def _table(header: Sequence[str], rows: Sequence[Sequence[str]], numeric: set[int]) -> list[str]:
    """Columns padded to their widest cell; columns in ``numeric`` right-aligned."""
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]

    def line(row: Sequence[str]) -> str:
        cells = [
            cell.rjust(width) if i in numeric else cell.ljust(width)
            for i, (cell, width) in enumerate(zip(row, widths, strict=True))
        ]
        return "  ".join(cells).rstrip()

    return [line(header), *(line(row) for row in rows)]


def _display_path(store: RunStore, path: str | None) -> str:
    """``path`` relative to the run directory when inside it, in full otherwise."""
    if path is None:
        return "-"
    prefix = store.root.rstrip("/") + "/"
    return path[len(prefix) :] if path.startswith(prefix) else path


def _short(fingerprint: str | None) -> str:
    return "-" if fingerprint is None else fingerprint[:SHORT_FINGERPRINT]


# --- reading the run ---------------------------------------------------------------------------


def _config(store: RunStore) -> dict[str, Any] | None:
    """The saved config as strict JSON data, or None when the run has no ``config.json``."""
    try:
        return jsonable(store.load_config(), "config")
    except FileNotFoundError:
        return None


def _config_value(config: dict[str, Any], dotted: str) -> Any:
    value: Any = config
    for part in dotted.split("."):
        if not isinstance(value, dict) or part not in value:
            return None
        value = value[part]
    return value


def read_journals(store: RunStore, step: int | None = None) -> list[StepJournal]:
    """Every step's journal in step order, or only step ``step`` (error listing the steps)."""
    steps = store.steps()
    if step is None:
        return [store.read_journal(k) for k in steps]
    if step not in steps:
        raise RunReportError(
            f"{store.root}: no step {step} (steps with a journal: {format_steps(steps)})"
        )
    return [store.read_journal(step)]


def find_record(journal: StepJournal, stage: str) -> StageRecord:
    """The record of ``stage`` in ``journal``; :class:`RunReportError` listing the recorded ones."""
    for record in journal.stages:
        if record.stage == stage:
            return record
    recorded = ", ".join(r.stage for r in journal.stages) or "none yet"
    raise RunReportError(f"step {journal.step} has no stage {stage!r} (recorded: {recorded})")


def step_metrics(journal: StepJournal) -> dict[str, float]:
    """The stages' metrics overlaid by the step's (a running step has only the stages')."""
    merged: dict[str, float] = {}
    for record in journal.stages:
        merged.update(record.metrics)
    return {**merged, **journal.metrics}


# --- JSON --------------------------------------------------------------------------------------


def run_json(store: RunStore, step: int | None = None, stage: str | None = None) -> dict[str, Any]:
    """The run as strict JSON data (module docstring), filtered to ``step`` and ``stage``.

    Raises:
        ValueError: ``stage`` without ``step``.
        RunReportError: a step or stage the run does not have.
    """
    if stage is not None and step is None:
        raise ValueError(f"stage {stage!r} given without a step; name the step too (--step K)")
    steps = []
    for journal in read_journals(store, step):
        data = journal.to_json()
        if stage is not None:
            data["stages"] = [find_record(journal, stage).to_json()]
        steps.append(data)
    return {
        "run_dir": store.root,
        "config": _config(store),
        "rerun": _branch(store),
        "steps": steps,
    }


# --- the run table -----------------------------------------------------------------------------


def _stage_columns(journals: Sequence[StepJournal]) -> tuple[list[str], dict[str, str]]:
    """Stages that ran or were cached in some step (first-seen order), and the always-skipped
    ones with the reason of their last record."""
    order: list[str] = []
    used: set[str] = set()
    reasons: dict[str, str] = {}
    for journal in journals:
        for record in journal.stages:
            if record.stage not in order:
                order.append(record.stage)
            if record.status == "skipped":
                reasons[record.stage] = record.reason
            else:
                used.add(record.stage)
    return [s for s in order if s in used], {s: reasons[s] for s in order if s not in used}


def _step_row(journal: StepJournal, columns: Sequence[str]) -> list[str]:
    status = {record.stage: record.status for record in journal.stages}
    metrics = step_metrics(journal)
    nbytes = sum(r.nbytes or 0 for r in journal.stages if r.status != "skipped")
    return [
        str(journal.step),
        journal.status,
        *(status.get(stage, "-") for stage in columns),
        format_number(metrics.get(SCORE_METRIC)),
        format_seconds(metrics.get(STEP_TIME_METRIC)),
        "pruned" if journal.pruned is not None else format_bytes(nbytes),
    ]


def _totals(journals: Sequence[StepJournal]) -> list[str]:
    records = [record for journal in journals for record in journal.stages]
    ran = [r for r in records if r.status == "ran"]
    cached = [r for r in records if r.status == "cached"]
    skipped = sum(r.status == "skipped" for r in records)
    return [
        f"stages: {len(ran)} ran, {len(cached)} cached (cache hits), {skipped} skipped",
        f"artifacts: {format_bytes(sum(r.nbytes or 0 for r in ran))} written by stages that ran, "
        f"{format_bytes(sum(r.nbytes or 0 for r in cached))} reused by cache hits",
    ]


def _run_header(store: RunStore, journals: Sequence[StepJournal]) -> list[str]:
    config = _config(store)
    done = sum(journal.status == "done" for journal in journals)
    lines = [f"run          {store.root}"]
    if config is None:
        lines.append(f"config       (no {CONFIG_FILE})")
    else:
        for label, key in CONFIG_SUMMARY:
            value = _config_value(config, key)
            if value is not None:
                lines.append(f"{label:<12} {value}")
    branch = _branch(store)
    if branch is not None:
        lines.append(
            f"re-run of    {branch.get('parent_run_dir')} step {branch.get('step')}, "
            f"from {branch.get('from')} to {branch.get('to')}, "
            f"overrides {branch.get('overrides') or 'none'}"
        )
    steps = format_steps([journal.step for journal in journals])
    lines.append(f"steps        {steps} ({done} done, {len(journals) - done} running)")
    pruned = [journal for journal in journals if journal.pruned is not None]
    if pruned:
        kept = format_steps([journal.step for journal in journals if journal.pruned is None])
        lines.append(
            f"artifacts    kept for steps {kept}; {len(pruned)} steps pruned by "
            f"{RetentionPolicy.from_settings(pruned[-1].pruned).describe()}"
        )
    return lines


def _branch(store: RunStore) -> dict[str, Any] | None:
    """The ``rerun.json`` of a re-run branch (flows/rerun.py), or None for a trained run."""
    return store.load_json(RERUN_FILE) if store.exists(RERUN_FILE) else None


def run_table(store: RunStore) -> str:
    """The run overview (module docstring): header, steps × stages table, totals."""
    journals = read_journals(store)
    lines = _run_header(store, journals)
    if not journals:
        return "\n".join([*lines, "", "no step has a journal yet"])
    columns, always_skipped = _stage_columns(journals)
    header = ["step", "status", *columns, "score", "step_s", "bytes"]
    numeric = {0, len(header) - 3, len(header) - 2, len(header) - 1}
    rows = [_step_row(journal, columns) for journal in journals]
    lines += ["", *_table(header, rows, numeric)]
    if always_skipped:
        lines += ["", "skipped in every step"]
        lines += [f"  {stage}: {reason}" for stage, reason in always_skipped.items()]
    lines += ["", *_totals(journals)]
    lines.append(f"score = {SCORE_METRIC}, step_s = {STEP_TIME_METRIC}")
    return "\n".join(lines)


# --- one step ----------------------------------------------------------------------------------


def _record_row(record: StageRecord) -> list[str]:
    return [
        record.stage,
        record.status,
        "-" if record.rows is None else str(record.rows),
        format_bytes(record.nbytes),
        format_seconds(record.timing_s),
        _short(record.fingerprint),
        record.reason,
    ]


def _metric_lines(metrics: dict[str, float], indent: str) -> list[str]:
    width = max((len(name) for name in metrics), default=0)
    return [f"{indent}{name:<{width}}  {format_number(metrics[name])}" for name in sorted(metrics)]


def step_text(store: RunStore, step: int) -> str:
    """One step: its input, a table of stage records, artifact paths, metrics by stage."""
    (journal,) = read_journals(store, step)
    metrics = step_metrics(journal)
    pruned = "" if journal.pruned is None else ", artifacts pruned by retention"
    lines = [
        f"step         {journal.step} ({journal.status}{pruned})",
        f"input        {_display_path(store, journal.input_artifact)} "
        f"({_short(journal.input_fingerprint)})",
        f"time         {format_seconds(metrics.get(STEP_TIME_METRIC))} s",
        "",
    ]
    header = ["stage", "status", "rows", "size", "seconds", "fingerprint", "reason"]
    lines += _table(header, [_record_row(r) for r in journal.stages], {2, 3, 4})
    with_artifact = [r for r in journal.stages if r.artifact is not None]
    if with_artifact:
        width = max(len(r.stage) for r in with_artifact)
        lines += ["", "artifacts"]
        lines += [
            f"  {r.stage:<{width}}  {_display_path(store, r.artifact)}" for r in with_artifact
        ]
    reported: set[str] = set()
    for record in journal.stages:
        if record.metrics:
            lines += ["", f"metrics of {record.stage}", *_metric_lines(record.metrics, "  ")]
            reported |= set(record.metrics)
    others = {name: value for name, value in journal.metrics.items() if name not in reported}
    if others:
        lines += ["", "other step metrics", *_metric_lines(others, "  ")]
    return "\n".join(lines)


# --- one stage ---------------------------------------------------------------------------------


def record_lines(step: int, record: StageRecord) -> list[str]:
    """Every field of one stage record, one per line."""
    lines = [
        f"step         {step}",
        f"stage        {record.stage}",
        f"status       {record.status} ({record.reason})",
        f"artifact     {record.artifact or '-'}",
        f"fingerprint  {record.fingerprint or '-'}",
        f"cache key    {record.cache_key or '-'}",
        f"rows         {'-' if record.rows is None else record.rows}",
        f"size         {format_bytes(record.nbytes)}",
        f"seconds      {format_seconds(record.timing_s)}",
    ]
    if record.metrics:
        lines += ["metrics", *_metric_lines(record.metrics, "  ")]
    if record.key_parts:
        lines += ["cache key parts", *key_part_lines(record.key_parts)]
    return lines


def key_part_lines(parts: dict) -> list[str]:
    """The parts a cache key was hashed from (flows/cache/keys.py), one per line: code and
    weights fingerprints shortened, every config value, file digest and input fingerprint.

    >>> key_part_lines({"code": "ab" * 32, "config": {"a.b": 0.2}, "weights": None})
    ['  code         abababababababab…', '  weights      -', '  config       a.b = 0.2']
    """
    lines = []
    for name in ("code", "version", "weights", "seed"):
        if name in parts:
            value = parts[name]
            shown = f"{value[:16]}…" if isinstance(value, str) and len(value) > 16 else value
            lines.append(f"  {name:<12} {'-' if value is None else shown}")
    for name in ("config", "files", "inputs", "optional"):
        for key, value in sorted((parts.get(name) or {}).items()):
            shown = f"{value[:23]}…" if isinstance(value, str) and len(value) > 24 else value
            lines.append(f"  {name:<12} {key} = {json.dumps(shown, ensure_ascii=False)}")
    return lines


def check_recorded_artifact(store: RunStore, step: int, record: StageRecord) -> None:
    """Check that ``record.artifact`` holds what the journal recorded, as ``ppoflow rerun`` does
    before it reuses one: its manifest names the record's stage and holds its fingerprint (so
    an artifact folder swapped with another stage's, or another step's, is refused).

    Raises:
        ArtifactError: the manifest is missing or unreadable (named by read_manifest).
        RunReportError: the manifest names another stage or fingerprint (one line naming the
            artifact and the journal).
    """
    manifest = read_manifest(record.artifact)
    journal = f"{store.step_dir(step)}/{JOURNAL_FILE}"
    held_stage, held = manifest.get("stage"), str(manifest.get("fingerprint"))
    if held_stage is not None and held_stage != record.stage:
        raise RunReportError(
            f"{record.artifact}: holds an artifact of stage {held_stage!r} (fingerprint "
            f"{held[:16]}…), but {journal} records it for stage {record.stage!r} (the artifact "
            "folder was swapped or replaced); restore it, or re-run the step"
        )
    if record.fingerprint is not None and held != record.fingerprint:
        raise RunReportError(
            f"{record.artifact}: holds fingerprint {held[:16]}…, but {journal} records "
            f"{record.fingerprint[:16]}… for stage {record.stage!r} (the artifact folder was "
            "swapped with another step's or replaced); restore it, or re-run the step"
        )


def stage_text(store: RunStore, step: int, stage: str, *, verify: Verify = "full") -> str:
    """One stage of one step: its record, then its artifact's description (schema, statistics,
    token ledger). A skipped stage has no artifact and shows its record only.

    Raises:
        RunReportError: no such step or stage; the artifact holds another stage's or step's
            output than the journal records.
        ValueError: the journal names an artifact outside the run (and the runs it branched
            from; ``RunStore.check_journal_paths``).
        ArtifactError: the artifact is missing or fails verification (``verify``).
    """
    (journal,) = read_journals(store, step)
    record = find_record(journal, stage)
    lines = record_lines(step, record)
    if record.artifact is None:
        return "\n".join([*lines, "", f"no artifact: the stage was {record.status}"])
    if journal.pruned is not None:
        raise RunReportError(str(pruned_error(journal, store.root)))
    store.check_journal_paths(journal, [stage])
    check_recorded_artifact(store, step, record)
    from stages.ppo import PPO_STAGES

    complete = from_step_input(record.artifact, verify, PPO_STAGES)
    return "\n".join(
        [*lines, "", describe_artifact(record.artifact, verify=verify, complete=complete)]
    )
