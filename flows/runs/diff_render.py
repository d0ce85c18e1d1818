"""How ``ppoflow diff`` prints what :mod:`flows.runs.diff` found: plain text, one section per
finding, or the same as one JSON document (``--json``).

Text sections, in order: the two runs and how they are related; the steps compared and which
differ; the notes (a tokenizer that could not be loaded, pruned artifacts); then for the first
step that differs: its stages in run order with each side's status and the verdict, the keys
that differ in the first differing stage (layer, dtype and shape per side, rows that differ),
the first differing generation row (uid, the keys that differ in it, the prompt and response of
each run, decoded with that run's tokenizer, and the first response token that differs), and
the largest per-token differences of the token-level keys. Identical runs print the header and
one line saying so.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict
from typing import Any

from flows.jsonable import jsonable
from flows.runs.diff import RowFinding, RowSide, RunDiff, StageVerdict, StepDiff
from flows.runs.diff_rows import KeyDiff, TokenKeyDiff
from flows.runs.report import format_steps
from flows.runs.samples import Decoder

SHORT = 12


def _table(header: Sequence[str], rows: Sequence[Sequence[str]], numeric: set[int]) -> list[str]:
    """Columns padded to their widest cell; columns in ``numeric`` right-aligned, indented 2."""
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]

    def line(row: Sequence[str]) -> str:
        cells = [c.rjust(w) if i in numeric else c.ljust(w) for i, (c, w) in
                 enumerate(zip(row, widths, strict=True))]  # fmt: skip
        return ("  " + "  ".join(cells)).rstrip()

    return [line(header), *(line(row) for row in rows)]


def _indented(text: str, indent: str = "    ") -> list[str]:
    return [f"{indent}{line}" for line in text.splitlines()] or [indent.rstrip()]


def _number(value: float | None) -> str:
    return "-" if value is None else f"{value:.6g}"


# --- text --------------------------------------------------------------------------------------


def _header(found: RunDiff) -> list[str]:
    steps = f"compared {format_steps(found.compared)}"
    if found.only_a:
        steps += f"; only in a (not compared): {format_steps(found.only_a)}"
    if found.only_b:
        steps += f"; only in b (not compared): {format_steps(found.only_b)}"
    lines = [f"a         {found.a}", f"b         {found.b}", f"relation  {found.relation}"]
    lines.append(f"steps     {steps}")
    if found.stage is not None:
        lines.append(f"stage     {found.stage} only (--stage)")
    return lines


def _identical_line(found: RunDiff) -> str:
    verdicts = [v for step in found.steps for v in step.stages]
    same = sum(v.verdict == "same" for v in verdicts)
    skipped = sum(v.verdict == "skipped" for v in verdicts)
    one_side = sum(v.verdict.startswith("only in") for v in verdicts)
    what = f"stage {found.stage}" if found.stage else "every stage both runs recorded"
    line = (
        f"identical: {what} at step{'s' if len(found.compared) > 1 else ''} "
        f"{format_steps(found.compared)} has the same artifact fingerprint ({same} artifacts "
        f"compared, {skipped} stages skipped by both"
    )
    if one_side:
        line += f", {one_side} recorded by one run only and not compared"
    return line + ")"


def _verdict_row(verdict: StageVerdict) -> list[str]:
    shown = verdict.verdict
    if shown == "differs":
        fa, fb = verdict.fingerprint_a, verdict.fingerprint_b
        shown += f"  {(fa or 'no artifact')[:SHORT]} → {(fb or 'no artifact')[:SHORT]}"
    return [verdict.stage, verdict.status_a or "-", verdict.status_b or "-", shown]


def _stage_lines(step: StepDiff) -> list[str]:
    rows = [_verdict_row(v) for v in step.stages]
    return [
        f"stages of step {step.step} in run order",
        *_table(["stage", "a", "b", "verdict"], rows, set()),
    ]


def _side(dtype: str | None, shape: list[int] | None) -> str:
    if dtype is None:
        return "absent"
    return dtype if shape is None else f"{dtype} {tuple(shape)}"


def _key_row(key: KeyDiff, rows: int | None) -> list[str]:
    if key.rows is not None and rows is not None:
        differing = f"{len(key.rows)} of {rows}" if key.rows else "none (dtype differs)"
    else:
        differing = "-"
    return [key.key, key.layer, _side(key.dtype_a, key.shape_a), _side(key.dtype_b, key.shape_b),
            differing]  # fmt: skip


def _key_lines(step: StepDiff) -> list[str]:
    found = step.artifact
    if found is None:
        return []
    header = ["key", "layer", "a", "b", "rows differing"]
    rows = [_key_row(key, found.rows) for key in found.keys]
    title = f"keys that differ in {step.first_stage}"
    if found.rows is not None:
        title += f" ({found.rows} rows, compared in generation order)"
    if not rows:
        return [title, "  none: the same keys and values (the artifacts differ in layout only)"]
    return [title, *_table(header, rows, set())]


def _text_block(name: str, ids_a: list[int] | None, ids_b: list[int] | None,
                decoders: Mapping[str, Decoder]) -> list[str]:  # fmt: skip
    """The prompt or response of both runs: once when the ids and the decoders' texts agree."""
    if ids_a is None and ids_b is None:
        return [f"  {name}: no artifact of the step holds it"]
    shown_a = None if ids_a is None else decoders["a"].show(ids_a)
    shown_b = None if ids_b is None else decoders["b"].show(ids_b)
    if ids_a == ids_b and shown_a == shown_b:
        return [f"  {name} (a and b, {len(ids_a)} tokens)", *_indented(shown_a)]
    lines = []
    for label, ids, shown in (("a", ids_a, shown_a), ("b", ids_b, shown_b)):
        if ids is None:
            lines.append(f"  {name} {label}: none")
        else:
            lines += [f"  {name} {label} ({len(ids)} tokens)", *_indented(shown)]
    return lines


def _first_token_line(row: RowFinding, decoders: Mapping[str, Decoder]) -> list[str]:
    position = row.first_token
    if position is None:
        return []
    cells = []
    for label, side in (("a", row.a), ("b", row.b)):
        ids = side.response_ids or []
        if position < len(ids):
            cells.append(f"{ids[position]} {decoders[label].show([ids[position]])!r} in {label}")
        else:
            cells.append(f"end of response in {label}")
    return [f"  first differing response token: position {position}: {', '.join(cells)}"]


def _row_lines(row: RowFinding, decoders: Mapping[str, Decoder]) -> list[str]:
    uid = row.a.uid if row.a.uid == row.b.uid else f"{row.a.uid} (a), {row.b.uid} (b)"
    lines = [
        f"first differing row: {row.row} (generation order; batch row {row.a.batch_row} in a, "
        f"{row.b.batch_row} in b)",
        f"  uid          {uid}",
        f"  differs in   {', '.join(row.keys)}",
    ]
    lines += _text_block("prompt", row.a.prompt_ids, row.b.prompt_ids, decoders)
    lines += _text_block("response", row.a.response_ids, row.b.response_ids, decoders)
    return lines + _first_token_line(row, decoders)


def _token_lines(tokens: Sequence[TokenKeyDiff]) -> list[str]:
    if not tokens:
        return []
    lines = [
        "largest per-token differences over both runs' response_mask (row = generation row, "
        "token = response position)"
    ]
    for key in tokens:
        lines.append(f"  {key.key}: {key.differing} of {key.compared} tokens differ")
        ratio = any(t.ratio is not None for t in key.top)
        header = ["row", "token", "a", "b", "|Δ|", *(["exp(b−a)"] if ratio else [])]
        rows = [
            [str(t.row), str(t.token) if t.last == t.token else f"{t.token}-{t.last}",
             _number(t.a), _number(t.b), _number(t.delta),
             *([_number(t.ratio)] if ratio else [])]
            for t in key.top
        ]  # fmt: skip
        if rows:
            lines += ["  " + line for line in _table(header, rows, set(range(len(header))))]
    return lines


def diff_text(found: RunDiff, decoders: Mapping[str, Decoder], notes: Sequence[str] = ()) -> str:
    """The report (module docstring); ``decoders``: label → the run's tokenizer (used for the
    first differing row); ``notes``: lines about them (why one could not be loaded)."""
    lines = _header(found)
    step = found.finding
    if step is None:
        return "\n".join([*lines, *notes, "", _identical_line(found)])
    differing = found.differing_steps
    first = f"first at stage {step.first_stage}"
    if len(differing) > 1:
        first = f"steps {format_steps(differing)} differ; the first, step {step.step}, {first}"
    else:
        first = f"step {step.step} differs, {first}"
    lines.append(f"result    {first}")
    lines += [*notes, *(f"note: {note}" for note in step.notes)]
    sections = [_stage_lines(step), _key_lines(step)]
    if step.row is not None:
        sections.append(_row_lines(step.row, decoders))
    if step.artifact is not None:
        sections.append(_token_lines(step.artifact.tokens))
    for section in sections:
        if section:
            lines += ["", *section]
    return "\n".join(lines)


# --- JSON --------------------------------------------------------------------------------------


def _side_json(side: RowSide, decoder: Decoder) -> dict[str, Any]:
    response = side.response_ids
    return {
        "batch_row": side.batch_row,
        "uid": side.uid,
        "prompt": decoder.text(side.prompt_ids),
        "prompt_ids": side.prompt_ids,
        "response": None if response is None else decoder.text(response),
        "response_ids": response,
    }


def _verdict_json(verdict: StageVerdict) -> dict[str, Any]:
    return {
        "stage": verdict.stage,
        "a": verdict.status_a,
        "b": verdict.status_b,
        "verdict": verdict.verdict,
        "fingerprint_a": verdict.fingerprint_a,
        "fingerprint_b": verdict.fingerprint_b,
    }


def _row_json(row: RowFinding | None, decoders: Mapping[str, Decoder]) -> dict[str, Any] | None:
    if row is None:
        return None
    return {
        "row": row.row,
        "keys": row.keys,
        "first_token": row.first_token,
        "a": _side_json(row.a, decoders["a"]),
        "b": _side_json(row.b, decoders["b"]),
    }


def _step_json(step: StepDiff, decoders: Mapping[str, Decoder]) -> dict[str, Any]:
    found = step.artifact
    return {
        "step": step.step,
        "first_stage": step.first_stage,
        "stages": [_verdict_json(verdict) for verdict in step.stages],
        "rows": None if found is None else found.rows,
        "keys": None if found is None else [asdict(key) for key in found.keys],
        "row": _row_json(step.row, decoders),
        "tokens": None if found is None else [asdict(tokens) for tokens in found.tokens],
        "notes": step.notes,
    }


def diff_json(
    found: RunDiff, decoders: Mapping[str, Decoder], notes: Sequence[str] = ()
) -> dict[str, Any]:
    """The same as :func:`diff_text` as strict JSON data (NaN as ``{"float": "nan"}``); texts
    are None where a run's tokenizer could not be loaded (the ids are always there)."""
    return jsonable(
        {
            "a": found.a,
            "b": found.b,
            "relation": found.relation,
            "compared_steps": found.compared,
            "only_in_a": found.only_a,
            "only_in_b": found.only_b,
            "stage": found.stage,
            "identical": found.identical,
            "differing_steps": found.differing_steps,
            "steps": [{"step": s.step, "first_stage": s.first_stage} for s in found.steps],
            "finding": None if found.finding is None else _step_json(found.finding, decoders),
            "notes": list(notes),
        },
        "diff",
    )


__all__ = ["diff_json", "diff_text"]
