"""How ``ppoflow inspect RUN --step K --samples N`` prints the samples :mod:`flows.runs.samples`
joined and chose: text (one block per sample; an agent rollout's sample turn by turn) or one JSON
document (``--json``)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from dataproto import keys as K
from flows.jsonable import jsonable
from flows.runs.samples import (
    ADVANTAGE_RULE,
    Decoder,
    Sample,
    SortKey,
    StepSamples,
    column_values,
)
from stages.agent.trajectory import AGENT_STOP_REASON
from stages.schedules import POLICY_VERSION, staleness

# --- text --------------------------------------------------------------------------------------


def _number(value: float | None) -> str:
    return "-" if value is None else f"{value:.6g}"


def _count(n: int, noun: str) -> str:
    """``n`` and the noun, plural unless n is 1.

    >>> _count(1, "turn"), _count(3, "turn")
    ('1 turn', '3 turns')
    """
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _indented(text: str, indent: str) -> list[str]:
    return [f"{indent}{line}" for line in text.splitlines()]


def _mask_kind(mask: Sequence[int]) -> str:
    """``model`` (every id sampled), ``tool`` (none), else how many of them were.

    >>> _mask_kind([1, 1]), _mask_kind([0, 0]), _mask_kind([1, 0, 0])
    ('model', 'tool', 'mixed (1/3 model)')
    """
    if not mask:
        return "-"
    if all(mask):
        return "model"
    return "tool" if not any(mask) else f"mixed ({sum(mask)}/{len(mask)} model)"


def _turn_span(sample: Sample, turn: dict[str, Any]) -> tuple[int, int]:
    """The turn's span in the sample's response ids (cut to the stored response width)."""
    width = len(sample.response_ids)
    return min(int(turn["start"]), width), min(int(turn["end"]), width)


def _turn_lines(sample: Sample, decoder: Decoder) -> list[str]:
    """Each turn: role, tokens, mask, time; its decoded span; its calls and results."""
    lines = []
    for k, turn in enumerate(sample.turns or [], 1):
        start, end = _turn_span(sample, turn)
        mask = _mask_kind(sample.response_mask[start:end])
        lines.append(
            f"    turn {k}  {turn['role']}  {end - start} tokens  mask {mask}  "
            f"{turn['seconds']:.3f} s"
        )
        lines += _indented(decoder.show(sample.response_ids[start:end]), "      ")
        for call in turn["calls"]:
            dropped = " (dropped)" if call.get("dropped") else ""
            lines.append(f"      call {call['name']} {call['arguments']}{dropped}")
        if turn["malformed"]:
            lines.append(f"      malformed calls: {turn['malformed']}")
        for result in turn["results"]:
            text = json.dumps(result["text"], ensure_ascii=False)
            lines.append(
                f"      result {result['name']}: {result['status']}, reward {result['reward']}, "
                f"{result['seconds']:.3f} s, text {text}"
            )
    return lines


def lineage(sample: Sample, step: int) -> tuple[int | None, int | None]:
    """(policy version, staleness) of a sample trained at ``step``: the version of the weights
    that generated it (the step input's ``policy_version``) and ``step − 1 − version``
    (``stages.schedules``); (None, None) for a run older than the column."""
    version = sample.columns.get(POLICY_VERSION)
    if version is None:
        return None, None
    return int(version), staleness(step, int(version))


def _lineage_text(sample: Sample, step: int) -> str:
    version, age = lineage(sample, step)
    if version is None:
        return "-"
    return f"version {version}, trained at step {step}: staleness {age}"


def _sample_lines(sample: Sample, n: int, total: int, decoder: Decoder, step: int) -> list[str]:
    extras = "  ".join(
        f"{name}={value!r}" if isinstance(value, str) else f"{name}={value}"
        for name, value in sample.extras.items()
    )
    fields = [
        ("uid", sample.columns.get(K.UID, "-")),
        ("data_source", sample.columns.get(K.DATA_SOURCE, "-")),
        ("score", _number(sample.score)),
        ("advantage", _number(sample.advantage)),
        ("extras", extras or "-"),
        ("policy", _lineage_text(sample, step)),
    ]
    lines = ["", f"sample {n}/{total}  row {sample.row}  batch row {sample.batch_row}"]
    lines += [f"  {name:<11}  {value}" for name, value in fields]
    lines.append(f"  prompt ({len(sample.prompt_ids)} tokens)")
    lines += _indented(decoder.show(sample.prompt_ids), "    ")
    if sample.turns is None:
        lines.append(f"  response ({len(sample.response_ids)} tokens)")
        return lines + _indented(decoder.show(sample.response_ids), "    ")
    stop = sample.columns.get(AGENT_STOP_REASON, "-")
    turns = _count(len(sample.turns), "turn")
    lines.append(f"  response ({len(sample.response_ids)} tokens, {turns}, stop {stop})")
    return lines + _turn_lines(sample, decoder)


def _condition(where: Sequence[tuple[str, str]]) -> str:
    return " and ".join(f"{key}={value}" for key, value in where)


def samples_text(
    found: StepSamples,
    shown: Sequence[Sample],
    matched: int,
    where: Sequence[tuple[str, str]],
    sort: SortKey | None,
    decoder: Decoder,
) -> str:
    """The header (what was chosen, the row orders, what score and advantage are, the
    tokenizer's note) and one block per sample: fields, prompt, response or turns."""
    chosen = f"{len(found.samples)} samples"
    if where:
        chosen += f", {matched} where {_condition(where)}"
    chosen += f"; showing {len(shown)} " + (f"by {sort}, highest first" if sort else "in row order")
    moved = " then ".join(found.reordered_by)
    batch = f"the order after {moved} (reward, advantage)" if moved else "row (nothing reordered)"
    lines = [
        f"step {found.step} of {found.run_dir}: {chosen}",
        f"row = generation order (step input, rollout); batch row = {batch}",
        f"score = {found.score_source}; advantage = {ADVANTAGE_RULE}",
    ]
    if decoder.note is not None:
        lines.append(decoder.note)
    if where and not matched:
        for key, _ in where:
            lines.append(f"{key} values: {', '.join(column_values(found, key))}")
    for n, sample in enumerate(shown, 1):
        lines += _sample_lines(sample, n, len(shown), decoder, found.step)
    return "\n".join(lines)


# --- JSON --------------------------------------------------------------------------------------


def _turn_json(sample: Sample, turn: dict[str, Any], decoder: Decoder) -> dict[str, Any]:
    start, end = _turn_span(sample, turn)
    span = sample.response_ids[start:end]
    return {
        **turn,
        "tokens": end - start,
        "mask": _mask_kind(sample.response_mask[start:end]),
        "text": decoder.text(span),
    }


def sample_json(sample: Sample, decoder: Decoder, step: int) -> dict[str, Any]:
    """One sample of step ``step`` as JSON data (texts None without a tokenizer; ids always)."""
    version, age = lineage(sample, step)
    turns = None
    if sample.turns is not None:
        turns = [_turn_json(sample, turn, decoder) for turn in sample.turns]
    return {
        "row": sample.row,
        "batch_row": sample.batch_row,
        "uid": sample.columns.get(K.UID),
        "data_source": sample.columns.get(K.DATA_SOURCE),
        "score": sample.score,
        "advantage": sample.advantage,
        "extras": sample.extras,
        "policy_version": version,
        "staleness": age,
        "prompt": decoder.text(sample.prompt_ids),
        "prompt_ids": sample.prompt_ids,
        "response": decoder.text(sample.response_ids),
        "response_ids": sample.response_ids,
        "response_mask": sample.response_mask,
        "stop_reason": sample.columns.get(AGENT_STOP_REASON),
        "turns": turns,
    }


def samples_json(
    found: StepSamples,
    shown: Sequence[Sample],
    matched: int,
    where: Sequence[tuple[str, str]],
    sort: SortKey | None,
    decoder: Decoder,
) -> dict[str, Any]:
    """The same as :func:`samples_text` as strict JSON data (NaN as ``{"float": "nan"}``)."""
    return jsonable(
        {
            "run_dir": found.run_dir,
            "step": found.step,
            "rows": len(found.samples),
            "matched": matched,
            "where": [[key, value] for key, value in where],
            "sort": sort,
            "reordered_by": found.reordered_by,
            "score": found.score_source,
            "advantage": ADVANTAGE_RULE,
            "tokenizer": decoder.path if decoder.tokenizer is not None else None,
            "note": decoder.note,
            "samples": [sample_json(sample, decoder, found.step) for sample in shown],
        },
        "samples",
    )
