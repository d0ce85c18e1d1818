"""Bad datasets: every row of both splits is checked when they load, before the engines and
before step 1, so each case is one line naming the file (and row and column) and what would be
right, exit status 1, with no step, checkpoint or MLflow run made.

The run directory a failed start leaves holds only what the start wrote before the data phase
(config.json, the lock and the library log ppoflow.log, which the error line names).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

pytestmark = pytest.mark.usefixtures("prefect_harness")

#: what a start that failed in the data phase leaves in a new run directory
START_FILES = {"config.json", ".lock", "ppoflow.log"}


def with_column(source: Path, target: Path, name: str, change: Callable[[list], list]) -> Path:
    """``source``'s table with column ``name`` replaced by ``change(values)``, at ``target``."""
    table = pq.read_table(source)
    values = change(table.column(name).to_pylist())
    index = table.schema.get_field_index(name)
    pq.write_table(table.set_column(index, name, pa.array(values)), target)
    return target


def row(values: list, at: int, value: Any) -> list:
    values[at] = value
    return values


def no_ground_truth(values: list) -> list:
    return row(values, 2, {"style": "rule", "ground_truth": None})


def jsonl(target: Path, lines: list[str]) -> Path:
    target.write_text("\n".join(lines) + "\n")
    return target


def record(i: int, **fields: Any) -> str:
    base = {
        "data_source": "ppoflow/demo-copy",
        "prompt": [{"role": "user", "content": "copy: a"}],
        "reward_model": {"style": "rule", "ground_truth": "a"},
    }
    return json.dumps({**base, **fields})


# (test id, what the input is, split, make(demo, dir) -> file, needles after the file's path)
CASES = [
    ("missing-file", "a data file that does not exist", "train",
     lambda d, t: t / "none.parquet",
     ["data file not found: ", "data.train_files / data.val_files must list existing"]),
    ("missing-val-file", "a validation file that does not exist", "val",
     lambda d, t: t / "none.parquet", ["data file not found: "]),
    ("not-parquet", "a text file named .parquet", "train",
     lambda d, t: (t / "x.parquet").write_text("hello") and t / "x.parquet",
     ["is not a readable parquet file", "write it with pandas.DataFrame.to_parquet"]),
    ("unknown-format", "a .csv file", "train",
     lambda d, t: (t / "x.csv").write_text("a,b\n") and t / "x.csv",
     ["unknown format '.csv'; expected one of ['.parquet'"]),
    ("directory", "a directory given as a data file", "train",
     lambda d, t: (t / "data").mkdir() or t / "data",
     ["is a directory; data.train_files / data.val_files must list files, each a parquet or "
      "JSON Lines file (.parquet, .jsonl, .json)"]),
    ("directory-of-parquet-files", "a directory of parquet files given as a data file", "val",
     lambda d, t: (t / "x.parquet").mkdir() or pq.write_table(pq.read_table(d.val),
                                                               t / "x.parquet" / "part-0.parquet")
     or t / "x.parquet",
     ["is a directory; data.train_files / data.val_files must list files", "it holds 1 such file "
      "(part-0.parquet): list those"]),
    ("missing-prompt-column", "a file without the prompt column", "train",
     lambda d, t: pq.write_table(pq.read_table(d.train).drop(["prompt"]), t / "x.parquet")
     or t / "x.parquet",
     [", row 0: missing required column 'prompt' (columns present: ['ability'",
      "the verl layout needs 'prompt', 'data_source' and 'reward_model'"]),
    ("empty-file", "a training file with no rows", "train",
     lambda d, t: pq.write_table(pq.read_table(d.train).slice(0, 0), t / "x.parquet")
     or t / "x.parquet",
     ["holds no rows; every data file of a split needs at least one prompt row"]),
    ("empty-val-file", "a validation file with no rows", "val",
     lambda d, t: pq.write_table(pq.read_table(d.val).slice(0, 0), t / "x.parquet")
     or t / "x.parquet", ["holds no rows"]),
    ("unknown-data-source", "a row whose data_source has no scorer", "train",
     lambda d, t: with_column(d.train, t / "x.parquet", "data_source",
                              lambda v: row(v, 3, "my/unknown")),
     [", row 3: column 'data_source' = 'my/unknown' has no reward scorer; known: [",
      "'ppoflow/demo-copy'", "reward.custom_reward_function.path"]),
    ("unknown-data-source-val", "a validation row whose data_source has no scorer", "val",
     lambda d, t: with_column(d.val, t / "x.parquet", "data_source",
                              lambda v: row(v, 5, "my/unknown")),
     [", row 5: column 'data_source' = 'my/unknown' has no reward scorer"]),
    ("empty-data-source", "a row with an empty data_source", "train",
     lambda d, t: with_column(d.train, t / "x.parquet", "data_source", lambda v: row(v, 1, "")),
     [", row 1: column 'data_source' must be a non-empty str"]),
    ("prompt-is-text", "a prompt that is a string, not chat messages", "train",
     lambda d, t: with_column(d.train, t / "x.parquet", "prompt", lambda v: [str(p) for p in v]),
     [", row 0: column 'prompt' must be a non-empty list of chat messages"]),
    ("message-without-content", "a chat message without content", "train",
     lambda d, t: jsonl(t / "x.jsonl", [record(0), record(1, prompt=[{"role": "user"}])]),
     [", row 1 (line 2): column 'prompt[0].content' must be a str, got NoneType None"]),
    ("no-ground-truth", "a row without reward_model.ground_truth", "train",
     lambda d, t: with_column(d.train, t / "x.parquet", "reward_model", no_ground_truth),
     [", row 2: column 'reward_model' must be a dict {'style': str, 'ground_truth': ...} with a "
      "non-null ground_truth"]),
    ("jsonl-bad-line", "a JSON Lines file with a broken line", "train",
     lambda d, t: jsonl(t / "x.jsonl", [record(0), '{"prompt": [']),
     [", row 1 (line 2): not valid JSON"]),
    ("jsonl-not-an-object", "a JSON Lines row that is not an object", "train",
     lambda d, t: jsonl(t / "x.jsonl", [record(0), "[1, 2]"]),
     [", row 1 (line 2): a JSON Lines row must be an object"]),
]  # fmt: skip


@pytest.mark.parametrize(
    ("described", "split", "make", "needles"), [pytest.param(*c[1:], id=c[0]) for c in CASES]
)
def test_a_bad_data_file_stops_the_start_naming_it(
    ppoflow, expect, demo, tmp_path, described, split, make, needles
):
    bad = make(demo, tmp_path)
    files = {"train": demo.train, "val": demo.val, split: bad}
    result = ppoflow(
        "train", "demo-cpu",
        *demo.overrides(tmp_path, f"data.train_files=[{files['train']}]",
                        f"data.val_files=[{files['val']}]"),
        "--run-dir", tmp_path / "run",
    )  # fmt: skip
    line = expect(result, 1, str(bad), *needles, input=described)
    assert f"library messages: {tmp_path / 'run' / 'ppoflow.log'}" in result.output, line
    assert {p.name for p in (tmp_path / "run").iterdir()} <= START_FILES  # no step, no run_info
    assert not (tmp_path / "checkpoints").exists()
    assert not (tmp_path / "mlflow.db").exists()
