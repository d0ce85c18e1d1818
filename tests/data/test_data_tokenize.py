"""Prompt tokenisation: templates, truncation, overlong filtering, the left-padded prompt batch."""

from __future__ import annotations

import copy
import logging
import re

import numpy as np
import pytest
import torch

from dataproto import keys
from stages.data.dataset import PromptRow, RowOrigin
from stages.data.tokenize import (
    INDEX,
    build_prompt_dataset,
    encode_prompt,
    left_pad,
    plain_template,
    render_prompt,
    truncate_prompt_ids,
)
from stages.data.tokenizer import BYTE_OFFSET


def _row(content: str, i: int = 0, **kwargs) -> PromptRow:
    return PromptRow(
        prompt=[{"role": "user", "content": content}],
        data_source="test/source",
        reward_model={"style": "rule", "ground_truth": str(i)},
        extra_info=kwargs.pop("extra_info", {"index": i}),
        origin=RowOrigin("train.parquet", i),
        **kwargs,
    )


def _byte_ids(text: str) -> list[int]:
    return [BYTE_OFFSET + b for b in text.encode()]


@pytest.fixture
def plain_tokenizer(tiny_tokenizer):
    """The tiny tokenizer without a chat template."""
    tokenizer = copy.deepcopy(tiny_tokenizer)
    tokenizer.chat_template = None
    return tokenizer


def test_chat_template_is_applied_with_generation_prompt(tiny_tokenizer):
    messages = [{"role": "system", "content": "s"}, {"role": "user", "content": "ab"}]
    assert render_prompt(tiny_tokenizer, messages) == "<|system|>s<|user|>ab<|assistant|>"
    user, assistant = (
        tiny_tokenizer.convert_tokens_to_ids(t) for t in ("<|user|>", "<|assistant|>")
    )
    ids = encode_prompt(tiny_tokenizer, messages[1:])
    assert ids == [user, *_byte_ids("ab"), assistant]


def test_plain_template_without_chat_template(plain_tokenizer):
    messages = [{"role": "user", "content": "ab"}]
    assert render_prompt(plain_tokenizer, messages) == "user: ab\nassistant: "
    assert encode_prompt(plain_tokenizer, messages) == _byte_ids("user: ab\nassistant: ")
    assert plain_template([]) == "assistant: "


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("left", [4, 5, 6, 7, 8, 9]),
        ("right", [0, 1, 2, 3, 4, 5]),
        ("middle", [0, 1, 2, 7, 8, 9]),
    ],
)
def test_truncation_modes_hand_example(mode, expected):
    assert truncate_prompt_ids(list(range(10)), 6, mode) == expected
    assert truncate_prompt_ids(list(range(4)), 6, mode) == [0, 1, 2, 3]


def test_middle_truncation_odd_limit_keeps_more_of_the_end():
    assert truncate_prompt_ids(list(range(10)), 5, "middle") == [0, 1, 7, 8, 9]
    assert truncate_prompt_ids(list(range(10)), 1, "middle") == [9]


def test_truncation_error_names_row_length_and_limit(plain_tokenizer):
    rows = [_row("a", 0), _row("abcdefghij", 1)]
    length = len(_byte_ids("user: abcdefghij\nassistant: "))
    with pytest.raises(ValueError) as info:
        build_prompt_dataset(rows, plain_tokenizer, max_prompt_length=20, truncation="error")
    message = str(info.value)
    assert "train.parquet, row 1" in message
    assert f"{length} tokens" in message and "max_prompt_length=20" in message


def test_truncation_applied_in_dataset(plain_tokenizer):
    rows = [_row("abcdefghij")]
    full = encode_prompt(plain_tokenizer, rows[0].prompt)
    for mode in ("left", "right", "middle"):
        dataset = build_prompt_dataset(rows, plain_tokenizer, max_prompt_length=8, truncation=mode)
        assert dataset.token_ids[0] == truncate_prompt_ids(full, 8, mode)
        assert dataset.collate([0]).batch[keys.INPUT_IDS].shape == (1, 8)


def test_filter_overlong_prompts_counts_and_logs(plain_tokenizer, caplog):
    rows = [_row("a" * n, i) for i, n in enumerate([1, 30, 2, 40, 3])]
    limit = len(encode_prompt(plain_tokenizer, rows[4].prompt))
    with caplog.at_level(logging.INFO, logger="stages.data.tokenize"):
        dataset = build_prompt_dataset(
            rows, plain_tokenizer, max_prompt_length=limit, filter_overlong_prompts=True
        )
    assert dataset.num_filtered == 2
    assert [r.extra_info["index"] for r in dataset.rows] == [0, 2, 4]
    assert "dropped 2 of 5 prompts longer than" in caplog.text
    kept = build_prompt_dataset(rows, plain_tokenizer, max_prompt_length=100)
    assert kept.num_filtered == 0 and len(kept) == 5


def test_left_padding_mask_and_position_ids(plain_tokenizer):
    rows = [_row("a", 0), _row("abc", 1)]
    dataset = build_prompt_dataset(rows, plain_tokenizer, max_prompt_length=32)
    batch = dataset.collate([1, 0])
    ids, mask, pos = (
        batch.batch[k] for k in (keys.INPUT_IDS, keys.ATTENTION_MASK, keys.POSITION_IDS)
    )
    assert ids.shape == mask.shape == pos.shape == (2, 32)
    assert ids.dtype == mask.dtype == pos.dtype == torch.int64
    for row, source in enumerate([1, 0]):
        length = len(dataset.token_ids[source])
        assert mask[row].tolist() == [0] * (32 - length) + [1] * length
        assert ids[row, 32 - length :].tolist() == dataset.token_ids[source]
        assert (ids[row, : 32 - length] == plain_tokenizer.pad_token_id).all()
        assert pos[row].tolist() == [0] * (32 - length) + list(range(length))


def test_pad_to_longest_in_batch(plain_tokenizer):
    rows = [_row("a", 0), _row("abc", 1)]
    dataset = build_prompt_dataset(
        rows, plain_tokenizer, max_prompt_length=32, pad_to_max_length=False
    )
    batch = dataset.collate([0, 1])
    assert batch.batch[keys.INPUT_IDS].shape == (2, len(dataset.token_ids[1]))
    assert batch.batch[keys.ATTENTION_MASK][1].all()


def test_left_pad_doc_example_and_too_long():
    ids, mask, pos = left_pad([[7, 8, 9], [5]], pad_token_id=0, length=4)
    assert ids.tolist() == [[0, 7, 8, 9], [0, 0, 0, 5]]
    assert mask.tolist() == [[0, 1, 1, 1], [0, 0, 0, 1]]
    assert pos.tolist() == [[0, 0, 1, 2], [0, 0, 0, 0]]
    with pytest.raises(ValueError, match="more than the padded length 2"):
        left_pad([[1, 2, 3]], pad_token_id=0, length=2)


def test_non_tensor_layer(tiny_tokenizer):
    rows = [_row("a", 0, ability="copy"), _row("b", 1, extra_info={})]
    batch = build_prompt_dataset(rows, tiny_tokenizer, max_prompt_length=16).collate([0, 1])
    nt = batch.non_tensor_batch
    assert set(nt) == {
        keys.RAW_PROMPT,
        keys.DATA_SOURCE,
        keys.REWARD_MODEL,
        keys.EXTRA_INFO,
        keys.ABILITY,
        INDEX,
    }
    for value in nt.values():
        assert isinstance(value, np.ndarray) and value.dtype == object and value.shape == (2,)
    assert nt[keys.RAW_PROMPT][0] == [{"role": "user", "content": "a"}]
    assert nt[keys.REWARD_MODEL][1] == {"style": "rule", "ground_truth": "1"}
    assert nt[keys.ABILITY].tolist() == ["copy", None]
    assert nt[INDEX].tolist() == [0, 0]  # extra_info["index"], 0 when absent (verl)
    assert batch.meta_info == {}


def test_uid_kept_only_when_every_row_has_one(tiny_tokenizer):
    with_uid = [_row("a", 0, uid="u0"), _row("b", 1, uid="u1")]
    batch = build_prompt_dataset(with_uid, tiny_tokenizer, max_prompt_length=16).collate([1])
    assert batch.non_tensor_batch[keys.UID].tolist() == ["u1"]
    mixed = [_row("a", 0, uid="u0"), _row("b", 1)]
    batch = build_prompt_dataset(mixed, tiny_tokenizer, max_prompt_length=16).collate([0])
    assert keys.UID not in batch.non_tensor_batch


def test_bad_arguments(tiny_tokenizer):
    rows = [_row("a")]
    with pytest.raises(ValueError, match=re.escape("truncation='sideways' is not one of")):
        build_prompt_dataset(rows, tiny_tokenizer, max_prompt_length=8, truncation="sideways")
    with pytest.raises(ValueError, match="max_prompt_length must be >= 1"):
        build_prompt_dataset(rows, tiny_tokenizer, max_prompt_length=0)
    no_pad = copy.deepcopy(tiny_tokenizer)
    no_pad.pad_token = None
    with pytest.raises(ValueError, match="no pad token"):
        build_prompt_dataset(rows, no_pad, max_prompt_length=8)
