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
| ``agent_name`` | str: the row's agent loop (``single_turn_agent``, ``tool_agent``; verl's) | no |
| ``<reward_fn_key>`` | non-empty str: routes the scorer instead of ``data_source`` | when ``reward_fn_key`` is not ``data_source`` |

``reward_fn_key`` is verl's ``data.reward_fn_key``: the column whose value is handed to the scorer
as its ``data_source`` argument. By default that is ``data_source`` itself; naming another column
keeps its value as the row's ``reward_route`` (``data_source`` still labels the row in metrics).

``data.train_max_samples`` / ``data.val_max_samples`` cap a split (`max_samples_indices`): the
first N rows, or with ``data.shuffle`` N rows drawn without replacement by
``numpy.random.default_rng(seed)``, in the drawn order (verl's rule).

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
DATA_SOURCE = "data_source"  # the default reward_fn_key
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
    #: the ``reward_fn_key`` column's value when that column is not ``data_source`` (else None)
    reward_route: str | None = None
    #: the row's agent loop (a name in ``stages.agent.agents.AGENT_LOOPS``; None: the default)
    agent_name: str | None = None

    def to_record(
        self, prompt_key: str = "prompt", reward_fn_key: str = DATA_SOURCE
    ) -> dict[str, Any]:
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
        if self.reward_route is not None and reward_fn_key != DATA_SOURCE:
            record[reward_fn_key] = self.reward_route
        if self.agent_name is not None:
            record["agent_name"] = self.agent_name
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


def _agent_name(record: dict[str, Any], origin: RowOrigin) -> str | None:
    """The ``agent_name`` column's value, checked against ``AGENT_LOOPS`` (None when absent)."""
    from stages.agent.agents import AGENT_LOOPS

    name = _optional(record, "agent_name", str, origin, "a str or null")
    if name is not None and name not in AGENT_LOOPS:
        raise _fail(origin, "agent_name", f"one of {AGENT_LOOPS.names()}", name)
    return name


def _route(record: dict[str, Any], origin: RowOrigin, reward_fn_key: str) -> str | None:
    """The ``reward_fn_key`` column's value (None when that column is ``data_source``)."""
    if reward_fn_key == DATA_SOURCE:
        return None
    if reward_fn_key not in record:
        raise ValueError(
            f"{origin}: missing column {reward_fn_key!r} named by data.reward_fn_key "
            f"(columns present: {sorted(record)}); add it or set data.reward_fn_key to one of them"
        )
    value = record[reward_fn_key]
    if not isinstance(value, str) or not value:
        raise _fail(origin, f"{reward_fn_key} (data.reward_fn_key)", "a non-empty str", value)
    return value


def validate_record(
    record: dict[str, Any], origin: RowOrigin, prompt_key: str, reward_fn_key: str = DATA_SOURCE
) -> PromptRow:
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
        reward_route=_route(record, origin, reward_fn_key),
        agent_name=_agent_name(record, origin),
    )


def _read_parquet(path: str) -> Iterable[tuple[RowOrigin, dict[str, Any]]]:
    """The rows of one parquet file. Read with ``ParquetFile``, not ``read_table``: for a single
    file both give the same table, but ``read_table`` imports pyarrow's dataset layer and pandas
    (a noticeable part of a run's start)."""
    with fsspec.open(path, "rb") as handle:
        try:
            table = pq.ParquetFile(handle).read()
        except pa.ArrowException as err:  # names the buffer, not the file
            detail = " ".join(str(err).split())
            raise ValueError(
                f"data file {path!r} is not a readable parquet file ({detail}); write it with "
                "pandas.DataFrame.to_parquet or pyarrow.parquet.write_table, or give a .jsonl file"
            ) from None
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


def directory_given(path: str, fs: Any, fs_path: str) -> str:
    """The line for a directory given as a data file: what is expected, and the data files it
    holds (the first few), which are what to list instead."""
    suffixes = PARQUET_SUFFIXES + JSONL_SUFFIXES
    try:
        inside = sorted(
            entry.rstrip("/").rsplit("/", 1)[-1]
            for entry in fs.ls(fs_path, detail=False)
            if Path(entry.rstrip("/")).suffix.lower() in suffixes
        )
    except OSError:
        inside = []
    holds = (
        f"; it holds {len(inside)} such file{'s' if len(inside) != 1 else ''} "
        f"({', '.join(inside[:3])}{', …' if len(inside) > 3 else ''}): list those"
        if inside
        else ""
    )
    return (
        f"data file {path!r} is a directory; data.train_files / data.val_files must list files, "
        f"each a parquet or JSON Lines file ({', '.join(suffixes)}){holds}"
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
    paths: str | Path | Sequence[str | Path],
    *,
    prompt_key: str = "prompt",
    reward_fn_key: str = DATA_SOURCE,
) -> list[PromptRow]:
    """Read and validate the rows of one split, several files concatenated in order.

    ``reward_fn_key`` names the column that routes the scorer (module docstring).

    Raises:
        FileNotFoundError: a file does not exist (named in the message).
        IsADirectoryError: a path is a directory (named, with the data files it holds).
        ValueError: unknown format, bad JSON, a file with no rows (named), or a row with a
            missing column or a wrong type (the message names file, row and column, and what
            was expected).
    """
    rows: list[PromptRow] = []
    for path in as_path_list(paths):
        fs, fs_path = fsspec.core.url_to_fs(path)
        if not fs.exists(fs_path):
            raise FileNotFoundError(
                f"data file not found: {path!r}; data.train_files / data.val_files must list "
                "existing parquet or JSON Lines files"
            )
        if fs.isdir(fs_path):
            raise IsADirectoryError(directory_given(path, fs, fs_path))
        read = _reader(path)
        before = len(rows)
        rows.extend(
            validate_record(record, origin, prompt_key, reward_fn_key)
            for origin, record in read(path)
        )
        if len(rows) == before:
            raise ValueError(
                f"data file {path!r} holds no rows; every data file of a split needs at least "
                "one prompt row (fill it, or remove it from data.train_files / data.val_files)"
            )
    return rows


def max_samples_indices(
    num_rows: int, max_samples: int, *, shuffle: bool, seed: int | None
) -> np.ndarray:
    """(N',) int64 rows kept by ``data.{train,val}_max_samples`` (verl's ``RLHFDataset`` rule).

    ``max_samples`` ≤ 0 or ≥ ``num_rows`` keeps every row in order. Otherwise: the first
    ``max_samples`` rows, or with ``shuffle`` ``default_rng(seed).choice(num_rows, max_samples,
    replace=False)`` (a seeded sample, in the drawn order; ``seed=None`` is unseeded, as verl).

    Example:
        >>> max_samples_indices(5, 2, shuffle=False, seed=0).tolist()
        [0, 1]
        >>> max_samples_indices(5, -1, shuffle=True, seed=0).tolist()
        [0, 1, 2, 3, 4]
        >>> max_samples_indices(10, 3, shuffle=True, seed=1).tolist()
        [4, 3, 7]
    """
    if max_samples <= 0 or max_samples >= num_rows:
        return np.arange(num_rows, dtype=np.int64)
    if not shuffle:
        return np.arange(max_samples, dtype=np.int64)
    rng = np.random.default_rng(*(() if seed is None else (seed,)))
    return rng.choice(num_rows, size=max_samples, replace=False).astype(np.int64)


def write_prompt_rows(
    path: str | Path,
    rows: Sequence[PromptRow | dict[str, Any]],
    *,
    prompt_key: str = "prompt",
    reward_fn_key: str = DATA_SOURCE,
) -> None:
    """Write rows in verl's layout as parquet or JSON Lines, chosen by the file suffix."""
    records = [
        r.to_record(prompt_key, reward_fn_key) if isinstance(r, PromptRow) else r for r in rows
    ]
    path = str(path)
    if _reader(path) is _read_parquet:
        with fsspec.open(path, "wb") as handle:
            pq.write_table(pa.Table.from_pylist(records), handle)
        return
    with fsspec.open(path, "wt", encoding="utf-8") as handle:
        for record in records:
            handle.write(json.dumps(record, ensure_ascii=False) + "\n")
