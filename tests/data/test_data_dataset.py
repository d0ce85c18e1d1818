"""Loading verl-layout parquet / JSON Lines files: round trips, concatenation, error messages."""

from __future__ import annotations

import re

import numpy as np
import pytest

from stages.data.dataset import PromptRow, RowOrigin, load_prompt_rows, write_prompt_rows


@pytest.mark.parametrize("suffix", [".parquet", ".jsonl"])
def test_round_trip(tmp_path, suffix, make_record):
    records = [make_record(i) for i in range(4)]
    records[1]["extra_info"] = {"index": 1, "split": "train", "note": "x"}
    path = tmp_path / f"train{suffix}"
    write_prompt_rows(path, records)
    rows = load_prompt_rows(path)
    assert [r.prompt for r in rows] == [rec["prompt"] for rec in records]
    assert [r.reward_model for r in rows] == [rec["reward_model"] for rec in records]
    assert [r.data_source for r in rows] == ["test/source"] * 4
    assert [r.ability for r in rows] == ["test"] * 4
    assert rows[1].extra_info["note"] == "x"
    assert [r.extra_info["index"] for r in rows] == [0, 1, 2, 3]
    assert rows[2].origin == RowOrigin(str(path), 2, 3 if suffix == ".jsonl" else None)


def test_several_files_concatenated_in_order_with_origins(tmp_path, make_record):
    first, second = tmp_path / "a.parquet", tmp_path / "b.jsonl"
    write_prompt_rows(first, [make_record(i) for i in range(3)])
    write_prompt_rows(second, [make_record(i) for i in range(3, 5)])
    rows = load_prompt_rows([first, second])
    assert [r.extra_info["index"] for r in rows] == [0, 1, 2, 3, 4]
    assert [(r.origin.file, r.origin.row) for r in rows] == [
        (str(first), 0),
        (str(first), 1),
        (str(first), 2),
        (str(second), 0),
        (str(second), 1),
    ]


def test_optional_columns_default_and_prompt_key(tmp_path, make_record):
    record = make_record(0)
    record["question"] = record.pop("prompt")
    del record["ability"], record["extra_info"]
    record["uid"] = "u0"
    path = tmp_path / "q.jsonl"
    write_prompt_rows(path, [record])
    (row,) = load_prompt_rows(path, prompt_key="question")
    assert row.ability is None and row.extra_info == {} and row.uid == "u0"
    with pytest.raises(ValueError, match="missing required column 'prompt'"):
        load_prompt_rows(path)


def test_numpy_message_arrays_are_accepted(tmp_path, make_record):
    """pandas hands list columns as numpy object arrays; they validate like lists."""
    from stages.data.dataset import validate_record

    record = make_record(0)
    record["prompt"] = np.array(record["prompt"], dtype=object)
    row = validate_record(record, RowOrigin("f", 0), "prompt")
    assert row.prompt == [{"role": "user", "content": "hi 0"}]


BAD_RECORDS = {
    "missing column": (lambda r: r.pop("reward_model"), "missing required column 'reward_model'"),
    "prompt not a list": (lambda r: r.update(prompt="hello"), "column 'prompt' must be"),
    "empty prompt": (lambda r: r.update(prompt=[]), "column 'prompt' must be a non-empty list"),
    "message not a dict": (lambda r: r.update(prompt=["hello"]), "column 'prompt\\[0\\]' must be"),
    "message without content": (
        lambda r: r.update(prompt=[{"role": "user"}]),
        "column 'prompt\\[0\\].content' must be a str",
    ),
    "role not a str": (
        lambda r: r.update(prompt=[{"role": 3, "content": "x"}]),
        "column 'prompt\\[0\\].role' must be a str, got int 3",
    ),
    "data_source not a str": (lambda r: r.update(data_source=7), "column 'data_source' must be"),
    "reward_model not a dict": (
        lambda r: r.update(reward_model=["a"]),
        "column 'reward_model' must be a dict",
    ),
    "reward_model without ground_truth": (
        lambda r: r.update(reward_model={"style": "rule"}),
        "column 'reward_model' must be a dict .* ground_truth",
    ),
    "extra_info not a dict": (lambda r: r.update(extra_info="x"), "column 'extra_info' must be"),
}


@pytest.mark.parametrize("case", sorted(BAD_RECORDS))
def test_malformed_row_names_file_row_and_column(tmp_path, case, make_record):
    break_record, message = BAD_RECORDS[case]
    records = [make_record(i) for i in range(3)]
    break_record(records[2])
    path = tmp_path / "bad.jsonl"
    write_prompt_rows(path, records)
    with pytest.raises(ValueError) as info:
        load_prompt_rows(path)
    text = str(info.value)
    assert text.startswith(f"{path}, row 2 (line 3):"), text
    assert re.search(message, text), text


def test_malformed_parquet_row_names_row(tmp_path, make_record):
    records = [make_record(i) for i in range(3)]
    records[1]["data_source"] = ""
    path = tmp_path / "bad.parquet"
    write_prompt_rows(path, records)
    with pytest.raises(ValueError, match=re.escape(f"{path}, row 1: column 'data_source' must be")):
        load_prompt_rows(path)


def test_missing_file_is_named(tmp_path, make_record):
    good = tmp_path / "a.parquet"
    write_prompt_rows(good, [make_record(0)])
    missing = tmp_path / "nope.parquet"
    with pytest.raises(FileNotFoundError, match=re.escape(str(missing))):
        load_prompt_rows([good, missing])


def test_bad_json_and_unknown_suffix(tmp_path, make_record):
    path = tmp_path / "x.jsonl"
    write_prompt_rows(path, [make_record(0)])
    path.write_text(path.read_text() + "\n{broken\n")
    with pytest.raises(ValueError, match=r"row 1 \(line 3\): not valid JSON"):
        load_prompt_rows(path)
    other = tmp_path / "x.csv"
    other.write_text("a,b\n")
    with pytest.raises(ValueError, match=re.escape("unknown format '.csv'")):
        load_prompt_rows(other)
    with pytest.raises(ValueError, match="no data files"):
        load_prompt_rows([])


def test_prompt_row_to_record_round_trip(tmp_path):
    row = PromptRow(
        prompt=[{"role": "user", "content": "x"}],
        data_source="s",
        reward_model={"style": "rule", "ground_truth": "1"},
        uid="u",
    )
    path = tmp_path / "r.jsonl"
    write_prompt_rows(path, [row])
    (loaded,) = load_prompt_rows(path)
    assert (loaded.prompt, loaded.uid, loaded.reward_model) == (row.prompt, "u", row.reward_model)
