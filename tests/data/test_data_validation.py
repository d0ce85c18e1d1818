"""Rows validated when a split loads, before step 1: empty files, fields the scorers read, and
every row's route against the scorer that will score it — for the training and the validation
split alike."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from stages.config import load_config
from stages.data.dataset import load_prompt_rows, write_prompt_rows
from stages.data.from_config import load_split
from stages.data.routes import check_routes

SPLITS = ("train", "val")


def _cfg(tmp_path, *overrides: str):
    return load_config(
        None,
        [
            f"data.train_files=[{tmp_path}/train.jsonl]",
            f"data.val_files=[{tmp_path}/val.jsonl]",
            "data.max_prompt_length=64",
            "data.train_batch_size=2",
            "actor_rollout_ref.actor.ppo_mini_batch_size=2",
            "trainer.n_gpus_per_node=1",
            "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
            *overrides,
        ],
    )


def _write_splits(tmp_path, make_record, *, bad_split: str | None = None, **bad) -> None:
    """train.jsonl / val.jsonl with 4 gsm8k rows each; row 2 of ``bad_split`` gets ``bad``."""
    for split in SPLITS:
        rows = [make_record(i, data_source="openai/gsm8k") for i in range(4)]
        if split == bad_split:
            rows[2] = make_record(2, **bad)
        write_prompt_rows(tmp_path / f"{split}.jsonl", rows)


# --- empty files ---------------------------------------------------------------------------


@pytest.mark.parametrize("split", SPLITS)
def test_an_empty_split_file_is_one_line_naming_it(tmp_path, make_record, tiny_tokenizer, split):
    _write_splits(tmp_path, make_record)
    (tmp_path / f"{split}.jsonl").write_text("\n\n")  # blank lines only: no rows
    cfg = _cfg(tmp_path)
    with pytest.raises(ValueError) as info:
        load_split(cfg.data, tiny_tokenizer, split, cfg.reward)
    message = str(info.value)
    assert f"data file '{tmp_path}/{split}.jsonl' holds no rows" in message
    assert "\n" not in message and "range()" not in message


def test_an_empty_parquet_file_is_named_even_among_other_files(tmp_path, make_record):
    full, empty = tmp_path / "full.jsonl", tmp_path / "empty.parquet"
    write_prompt_rows(full, [make_record(0)])
    pq.write_table(pa.table({"prompt": pa.array([], pa.string())}), empty)
    with pytest.raises(ValueError, match=r"empty\.parquet' holds no rows"):
        load_prompt_rows([full, empty])


def test_a_split_emptied_by_the_overlong_filter_names_its_files(tmp_path, make_record):
    from stages.data.tokenizer import build_tiny_tokenizer

    write_prompt_rows(tmp_path / "train.jsonl", [make_record(i) for i in range(4)])
    write_prompt_rows(tmp_path / "val.jsonl", [make_record(i, content="x" * 200) for i in range(2)])
    cfg = _cfg(tmp_path, "data.filter_overlong_prompts=true")
    with pytest.raises(ValueError, match=r"every one of the 2 prompts of \[.*val\.jsonl'\]"):
        load_split(cfg.data, build_tiny_tokenizer(), "val", cfg.reward)


# --- fields the scorers read ---------------------------------------------------------------


@pytest.mark.parametrize("split", SPLITS)
@pytest.mark.parametrize(
    ("bad", "expected"),
    [
        ({"reward_model": {"style": "rule"}}, "column 'reward_model' must be a dict"),
        ({"prompt": []}, "column 'prompt' must be a non-empty list of chat messages"),
        ({"data_source": ""}, "column 'data_source' must be a non-empty str"),
    ],
)
def test_a_row_without_what_the_scorer_reads_fails_at_load_naming_file_and_row(
    tmp_path, make_record, tiny_tokenizer, split, bad, expected
):
    _write_splits(tmp_path, make_record, bad_split=split, **bad)
    cfg = _cfg(tmp_path)
    with pytest.raises(ValueError) as info:
        load_split(cfg.data, tiny_tokenizer, split, cfg.reward)
    assert f"{split}.jsonl, row 2 (line 3)" in str(info.value) and expected in str(info.value)


# --- every route has a scorer --------------------------------------------------------------


@pytest.mark.parametrize("split", SPLITS)
def test_an_unknown_data_source_fails_at_load_naming_file_row_and_the_known_ones(
    tmp_path, make_record, tiny_tokenizer, split
):
    _write_splits(tmp_path, make_record, bad_split=split, data_source="my/unknown")
    cfg = _cfg(tmp_path)
    with pytest.raises(KeyError) as info:
        load_split(cfg.data, tiny_tokenizer, split, cfg.reward)
    message = info.value.args[0]
    assert message.startswith(
        f"{tmp_path}/{split}.jsonl, row 2 (line 3): column 'data_source' = 'my/unknown' has no "
        "reward scorer"
    )
    assert "openai/gsm8k" in message and "reward.custom_reward_function.path" in message
    other = "val" if split == "train" else "train"
    assert len(load_split(cfg.data, tiny_tokenizer, other, cfg.reward)) == 4


def test_a_verl_data_source_ppoflow_does_not_ship_fails_at_load(
    tmp_path, make_record, tiny_tokenizer
):
    _write_splits(tmp_path, make_record, bad_split="val", data_source="hiyouga/geometry3k")
    cfg = _cfg(tmp_path)
    with pytest.raises(NotImplementedError, match=r"val\.jsonl, row 2 .* verl's geo3k scorer"):
        load_split(cfg.data, tiny_tokenizer, "val", cfg.reward)


def test_the_reward_fn_key_column_is_the_route_checked(tmp_path, make_record, tiny_tokenizer):
    rows = [make_record(i, data_source="my/label", task="openai/gsm8k") for i in range(3)]
    rows.append(make_record(3, data_source="openai/gsm8k", task="my/unknown"))
    for split in SPLITS:
        write_prompt_rows(tmp_path / f"{split}.jsonl", rows, reward_fn_key="task")
    cfg = _cfg(tmp_path, "data.reward_fn_key=task")
    with pytest.raises(KeyError, match=r"row 3 .*column 'task' = 'my/unknown'"):
        load_split(cfg.data, tiny_tokenizer, "train", cfg.reward)


def test_routes_are_not_checked_when_the_router_does_not_score(
    tmp_path, make_record, tiny_tokenizer
):
    _write_splits(tmp_path, make_record, bad_split="train", data_source="my/unknown")
    scorer = tmp_path / "mine.py"
    scorer.write_text("def compute_score(**kwargs):\n    return 1.0\n")
    custom = _cfg(tmp_path, f"reward.custom_reward_function.path={scorer}")
    assert len(load_split(custom.data, tiny_tokenizer, "train", custom.reward)) == 4
    model_only = _cfg(
        tmp_path, "reward.reward_model.enable=true", "reward.reward_model.model_path=rm"
    )
    assert len(load_split(model_only.data, tiny_tokenizer, "train", model_only.reward)) == 4
    summed = _cfg(
        tmp_path,
        "reward.reward_model.enable=true",
        "reward.reward_model.model_path=rm",
        "reward.reward_model.combine=sum",
    )
    with pytest.raises(KeyError, match="my/unknown"):
        load_split(summed.data, tiny_tokenizer, "train", summed.reward)


def test_check_routes_reports_the_first_row_of_a_bad_route(make_record, tmp_path):
    rows = [make_record(i, data_source="openai/gsm8k") for i in range(5)]
    rows[3]["data_source"] = rows[4]["data_source"] = "my/task"
    write_prompt_rows(tmp_path / "t.jsonl", rows)
    loaded = load_prompt_rows(tmp_path / "t.jsonl")
    check_routes(loaded[:3])
    with pytest.raises(KeyError, match=r"t\.jsonl, row 3 \(line 4\)"):
        check_routes(loaded)
