"""Prompt datasets in verl's layout, read from parquet and JSON Lines files.

One row per prompt, with the columns verl's RL datasets use:

| column         | type                                   | required |
|----------------|----------------------------------------|----------|
| ``prompt``     | list of chat messages ``{role, content}`` (name set by ``prompt_key``) | yes |
| ``data_source``| non-empty str: routes the scorer       | yes      |
| ``reward_model``| dict ``{style, ground_truth}`` (``style`` optional) | yes |
| ``ability``    | str                                    | no (None) |
| ``extra_info`` | dict                                   | no ({})  |
| ``uid``        | str: kept as the prompt group id       | no       |

Several files make one split: their rows are concatenated in the order given, and every row keeps
its origin (file, row number) so that an error names the exact place to fix. Other columns are
ignored. Message dicts keep their keys except those whose value is None (parquet fills the fields
a struct lacks in one row with nulls).

Files are opened with fsspec, so a path may be any fsspec URL as well as a local path.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

PARQUET_SUFFIXES = (".parquet",)
JSONL_SUFFIXES = (".jsonl", ".json")


@dataclass(frozen=True)
class RowOrigin:
    """Where a row came from: ``file``, its 0-based data ``row`` and, for JSON Lines, the ``line``."""

    file: str
    row: int
    line: int | None = None

    def __str__(self) -> str:
        where = f"{self.file!s}, row {self.row}"
        return where if self.line is None else f"{where} (line {self.line})"


@dataclass(frozen=True)
class PromptRow:
    """One validated prompt: the messages, the scorer routing and the ground truth."""

    prompt: list[dict[str, Any]]
    data_source: str
    reward_model: dict[str, Any]
    ability: str | None = None
    extra_info: dict[str, Any] = field(default_factory=dict)
    uid: str | None = None
    origin: RowOrigin | None = None

    def to_record(self, prompt_key: str = "prompt") -> dict[str, Any]:
        """The row as a verl-layout dict (what `write_prompt_rows` stores)."""
        record = {
            prompt_key: self.prompt,
            "data_source": self.data_source,
            "ability": self.ability,
            "reward_model": self.reward_model,
            "extra_info": self.extra_info,
        }
        if self.uid is not None:
            record["uid"] = self.uid
        return record


def _fail(origin: RowOrigin, column: str, expected: str, value: Any) -> ValueError:
    shown = repr(value)
    shown = shown if len(shown) <= 80 else shown[:77] + "..."
    return ValueError(
        f"{origin}: column {column!r} must be {expected}, got {type(value).__name__} {shown}"
    )


def _as_list(value: Any) -> list | None:
    """A list from a list, tuple or 1-D numpy array (pandas hands nested columns as arrays)."""
    if isinstance(value, (list, tuple)):
        return list(value)
    if isinstance(value, np.ndarray) and value.ndim == 1:
        return value.tolist()
    return None


def _validate_messages(value: Any, origin: RowOrigin, column: str) -> list[dict[str, Any]]:
    """Check a chat: a non-empty list of ``{role: str, content: str}`` dicts."""
    expected = "a non-empty list of chat messages {'role': str, 'content': str}"
    messages = _as_list(value)
    if not messages:
        raise _fail(origin, column, expected, value)
    checked = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise _fail(origin, f"{column}[{i}]", "a dict {'role': str, 'content': str}", message)
        for key in ("role", "content"):
            if not isinstance(message.get(key), str):
                raise _fail(origin, f"{column}[{i}].{key}", "a str", message.get(key))
        checked.append({k: v for k, v in message.items() if v is not None})
    return checked


def _validate_reward_model(value: Any, origin: RowOrigin) -> dict[str, Any]:
    expected = "a dict {'style': str, 'ground_truth': ...} with a non-null ground_truth"
    if not isinstance(value, dict) or value.get("ground_truth") is None:
        raise _fail(origin, "reward_model", expected, value)
    style = value.get("style")
    if style is not None and not isinstance(style, str):
        raise _fail(origin, "reward_model.style", "a str", style)
    return dict(value)


def _optional(record: dict, key: str, kind: type, origin: RowOrigin, expected: str) -> Any:
    value = record.get(key)
    if value is not None and not isinstance(value, kind):
        raise _fail(origin, key, expected, value)
    return value


def validate_record(record: dict[str, Any], origin: RowOrigin, prompt_key: str) -> PromptRow:
    """One raw row (a dict of column values) → a `PromptRow`, or an error naming origin and column."""
    for column in (prompt_key, "data_source", "reward_model"):
        if column not in record:
            raise ValueError(
                f"{origin}: missing required column {column!r} "
                f"(columns present: {sorted(record)}); the verl layout needs "
                f"{prompt_key!r}, 'data_source' and 'reward_model'"
            )
    data_source = record["data_source"]
    if not isinstance(data_source, str) or not data_source:
        raise _fail(origin, "data_source", "a non-empty str", data_source)
    return PromptRow(
        prompt=_validate_messages(record[prompt_key], origin, prompt_key),
        data_source=data_source,
        reward_model=_validate_reward_model(record["reward_model"], origin),
        ability=_optional(record, "ability", str, origin, "a str or null"),
        extra_info=dict(_optional(record, "extra_info", dict, origin, "a dict or null") or {}),
        uid=_optional(record, "uid", str, origin, "a str or null"),
        origin=origin,
    )


def _read_parquet(path: str) -> Iterable[tuple[RowOrigin, dict[str, Any]]]:
    with fsspec.open(path, "rb") as handle:
        table = pq.read_table(handle)
    for row, record in enumerate(table.to_pylist()):
        yield RowOrigin(path, row), record


def _read_jsonl(path: str) -> Iterable[tuple[RowOrigin, dict[str, Any]]]:
    with fsspec.open(path, "rt", encoding="utf-8") as handle:
        lines = handle.read().splitlines()
    row = 0
    for line_no, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        origin = RowOrigin(path, row, line_no)
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            raise ValueError(f"{origin}: not valid JSON ({err.msg} at column {err.colno})") from err
        if not isinstance(record, dict):
            raise ValueError(f"{origin}: a JSON Lines row must be an object, got {record!r:.80}")
        yield origin, record
        row += 1


def _reader(path: str):
    suffix = Path(path.split("?")[0]).suffix.lower()
    if suffix in PARQUET_SUFFIXES:
        return _read_parquet
    if suffix in JSONL_SUFFIXES:
        return _read_jsonl
    raise ValueError(
        f"data file {path!r}: unknown format {suffix!r}; expected one of "
        f"{list(PARQUET_SUFFIXES + JSONL_SUFFIXES)} (parquet or JSON Lines)"
    )


def as_path_list(paths: str | Path | Sequence[str | Path]) -> list[str]:
    """One path or a sequence of paths → a list of str (the files of one split, in order)."""
    if isinstance(paths, (str, Path)):
        return [str(paths)]
    listed = [str(p) for p in paths]
    if not listed:
        raise ValueError("no data files given: pass at least one parquet or JSON Lines path")
    return listed


def load_prompt_rows(
    paths: str | Path | Sequence[str | Path], *, prompt_key: str = "prompt"
) -> list[PromptRow]:
    """Read and validate the rows of one split, several files concatenated in order.

    Raises:
        FileNotFoundError: a file does not exist (named in the message).
        ValueError: unknown format, bad JSON, or a row with a missing column or a wrong type
            (the message names file, row and column, and what was expected).
    """
    rows: list[PromptRow] = []
    for path in as_path_list(paths):
        fs, fs_path = fsspec.core.url_to_fs(path)
        if not fs.exists(fs_path):
            raise FileNotFoundError(f"data file not found: {path!r}")
        read = _reader(path)
        rows.extend(validate_record(record, origin, prompt_key) for origin, record in read(path))
    return rows


def write_prompt_rows(
    path: str | Path, rows: Sequence[PromptRow | dict[str, Any]], *, prompt_key: str = "prompt"
) -> None:
    """Write rows in verl's layout as parquet or JSON Lines, chosen by the file suffix."""
    records = [r.to_record(prompt_key) if isinstance(r, PromptRow) else r for r in rows]
    path = str(path)
    if _reader(path) is _read_parquet:
        with fsspec.open(path, "wb") as handle:
            pq.write_table(pa.Table.from_pylist(records), handle)
        return
    with fsspec.open(path, "wt", encoding="utf-8") as handle:
        for record in records:
            handle.write(json.dumps(record, ensure_ascii=False) + "\n")
