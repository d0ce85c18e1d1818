"""The data.* keys that shape a split: max_samples, reward_fn_key, return_raw_chat,
filter_overlong_prompts_workers, and validation_shuffle's order."""

from __future__ import annotations

import numpy as np
import pytest

from dataproto import keys
from dataproto.equality import dataproto_equal
from flows.validate import validation_order
from stages.config import ConfigError, load_config
from stages.data.dataset import load_prompt_rows, max_samples_indices, write_prompt_rows
from stages.data.from_config import load_split, train_loader
from stages.data.tokenize import build_prompt_dataset, encode_prompts

NUM_ROWS = 10


@pytest.fixture
def split_files(tmp_path, make_record):
    """train.jsonl / val.jsonl with 10 rows each; row i has task "t<i>" and the content
    3i x's + " i" (3i + 4 tokens with the chat template's role tokens)."""
    rows = [make_record(i, content="x" * (3 * i), task=f"t{i}") for i in range(NUM_ROWS)]
    for name in ("train", "val"):
        write_prompt_rows(tmp_path / f"{name}.jsonl", rows)
    return tmp_path


def _cfg(files, *overrides: str):
    return load_config(
        None,
        [
            f"data.train_files=[{files}/train.jsonl]",
            f"data.val_files=[{files}/val.jsonl]",
            "data.max_prompt_length=64",
            "data.train_batch_size=2",
            "actor_rollout_ref.actor.ppo_mini_batch_size=2",
            "trainer.n_gpus_per_node=1",
            "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
            *overrides,
        ],
    )


def _indices(dataset) -> list[int]:
    return [row.extra_info["index"] for row in dataset.rows]


# --- train_max_samples / val_max_samples ------------------------------------------------------


def test_max_samples_takes_the_first_rows_without_shuffle(split_files, tiny_tokenizer):
    cfg = _cfg(
        split_files, "data.train_max_samples=3", "data.val_max_samples=4", "data.shuffle=false"
    )
    assert _indices(load_split(cfg.data, tiny_tokenizer, "train")) == [0, 1, 2]
    assert _indices(load_split(cfg.data, tiny_tokenizer, "val")) == [0, 1, 2, 3]


def test_max_samples_with_shuffle_is_verls_seeded_choice(split_files, tiny_tokenizer):
    cfg = _cfg(split_files, "data.train_max_samples=4", "data.seed=11")
    expected = np.random.default_rng(11).choice(NUM_ROWS, size=4, replace=False).tolist()
    assert _indices(load_split(cfg.data, tiny_tokenizer, "train")) == expected
    assert len(load_split(cfg.data, tiny_tokenizer, "val")) == NUM_ROWS  # val_max_samples -1


def test_max_samples_caps_before_the_overlong_filter(split_files, tiny_tokenizer):
    """As verl: sample first, then filter. Row i has 3i + 4 tokens, so of the first 7 rows only
    row 6 (22 tokens) is longer than 20 and is dropped."""
    cfg = _cfg(
        split_files,
        "data.train_max_samples=7",
        "data.shuffle=false",
        "data.max_prompt_length=20",
        "data.filter_overlong_prompts=true",
    )
    dataset = load_split(cfg.data, tiny_tokenizer, "train")
    assert _indices(dataset) == [0, 1, 2, 3, 4, 5] and dataset.num_filtered == 1


@pytest.mark.parametrize("value", ["null", "-1"])
def test_null_or_minus_one_keeps_every_row(split_files, tiny_tokenizer, value):
    cfg = _cfg(split_files, f"data.train_max_samples={value}")
    assert cfg.data.train_max_samples == -1
    assert len(load_split(cfg.data, tiny_tokenizer, "train")) == NUM_ROWS


def test_zero_max_samples_is_an_error_naming_the_key():
    with pytest.raises(ConfigError, match="val_max_samples"):
        load_config(None, ["data.val_max_samples=0"])


def test_max_samples_indices_cases():
    assert max_samples_indices(3, 5, shuffle=True, seed=0).tolist() == [0, 1, 2]
    drawn = max_samples_indices(100, 10, shuffle=True, seed=3)
    assert len(set(drawn.tolist())) == 10 and drawn.tolist() != sorted(drawn.tolist())


# --- reward_fn_key -----------------------------------------------------------------------------


def test_reward_fn_key_column_travels_as_reward_route(split_files, tiny_tokenizer):
    cfg = _cfg(split_files, "data.reward_fn_key=task")
    batch = load_split(cfg.data, tiny_tokenizer, "train").collate([3, 1])
    assert batch.non_tensor_batch[keys.REWARD_ROUTE].tolist() == ["t3", "t1"]
    assert batch.non_tensor_batch[keys.DATA_SOURCE].tolist() == ["test/source"] * 2
    default = load_split(_cfg(split_files).data, tiny_tokenizer, "train").collate([0])
    assert keys.REWARD_ROUTE not in default.non_tensor_batch


def test_a_missing_reward_fn_key_column_names_file_row_and_key(tmp_path, make_record):
    write_prompt_rows(tmp_path / "a.jsonl", [make_record(0)])
    with pytest.raises(ValueError, match=r"a\.jsonl, row 0.*'task' named by data\.reward_fn_key"):
        load_prompt_rows(tmp_path / "a.jsonl", reward_fn_key="task")


def test_reward_route_round_trips_through_write(tmp_path, make_record):
    rows = load_prompt_rows_with_task(tmp_path, make_record)
    write_prompt_rows(tmp_path / "b.parquet", rows, reward_fn_key="task")
    again = load_prompt_rows(tmp_path / "b.parquet", reward_fn_key="task")
    assert [r.reward_route for r in again] == ["t0", "t1"]


def load_prompt_rows_with_task(tmp_path, make_record):
    write_prompt_rows(tmp_path / "a.jsonl", [make_record(i, task=f"t{i}") for i in range(2)])
    return load_prompt_rows(tmp_path / "a.jsonl", reward_fn_key="task")


# --- return_raw_chat ---------------------------------------------------------------------------


@pytest.mark.parametrize("flag", [True, False])
def test_return_raw_chat_decides_whether_raw_prompt_is_in_the_batch(
    split_files, tiny_tokenizer, flag
):
    cfg = _cfg(split_files, f"data.return_raw_chat={str(flag).lower()}")
    batch = load_split(cfg.data, tiny_tokenizer, "train").collate([2])
    assert (keys.RAW_PROMPT in batch.non_tensor_batch) is flag
    if flag:
        assert batch.non_tensor_batch[keys.RAW_PROMPT][0] == [
            {"role": "user", "content": "x" * 6 + " 2"}
        ]


# --- filter_overlong_prompts_workers -----------------------------------------------------------


def test_encoding_in_two_processes_equals_the_serial_pass(split_files, tiny_tokenizer):
    """One pool start-up: the pooled dataset's ids and filtering equal the serial pass's."""
    rows = load_prompt_rows(split_files / "train.jsonl")
    options = dict(max_prompt_length=20, filter_overlong_prompts=True)
    serial = build_prompt_dataset(rows, tiny_tokenizer, **options)
    pooled = build_prompt_dataset(rows, tiny_tokenizer, num_workers=2, **options)
    assert pooled.token_ids == serial.token_ids and pooled.num_filtered == serial.num_filtered == 4
    assert dataproto_equal(pooled.collate(range(5)), serial.collate(range(5)))


def test_encoding_workers_must_be_positive(tiny_tokenizer):
    with pytest.raises(ValueError, match="num_workers must be >= 1"):
        encode_prompts(tiny_tokenizer, [], 0)


# --- the train loader and validation_shuffle ----------------------------------------------------


def test_train_loader_reads_the_data_keys(split_files, tiny_tokenizer):
    cfg = _cfg(split_files, "data.dataloader_num_workers=3", "data.shuffle=false")
    loader = train_loader(cfg.data, load_split(cfg.data, tiny_tokenizer, "train"))
    assert (loader.batch_size, loader.shuffle, loader.seed, loader.num_workers) == (2, False, 42, 3)


def test_validation_order_is_seeded_and_fresh_each_validation():
    first = validation_order(20, shuffle=True, seed=1, step=5).tolist()
    assert first == validation_order(20, shuffle=True, seed=1, step=5).tolist()
    assert first != validation_order(20, shuffle=True, seed=1, step=10).tolist()
    assert sorted(first) == list(range(20)) and first != list(range(20))
    assert validation_order(4, shuffle=False, seed=1, step=5).tolist() == [0, 1, 2, 3]
