"""The training-generations table (flows/sinks/train_generations.py): which rows, and each value
on worked numbers; the end-to-end table in MLflow is in tests/flows/test_mlflow_run_contents.py."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dataproto import DataProto
from dataproto import keys as K
from flows.sinks.train_generations import train_generation_rows


class LetterTokenizer:
    """Token id t decodes to the letter chr(ord('a') + t); id 0 is a special token (skipped)."""

    def batch_decode(self, rows, skip_special_tokens=True):
        return ["".join(chr(ord("a") + t) for t in row if t != 0) for row in rows]


def final_batch() -> DataProto:
    """Three groups in balanced (not generation) order: b, a, b, c, a, c; prompts of 2 tokens
    (left-padded), responses of 3 (right-padded)."""
    uid = np.array(["b", "a", "b", "c", "a", "c"], dtype=object)
    prompts = torch.tensor([[0, 1], [2, 3], [0, 1], [4, 5], [2, 3], [4, 5]])
    prompt_mask = (prompts != 0).long()
    responses = torch.tensor([[6, 7, 0], [8, 0, 0], [6, 0, 0], [9, 9, 9], [0, 0, 0], [7, 7, 0]])
    response_mask = (responses != 0).long()
    scores = torch.zeros(6, 3)
    scores[torch.arange(6), (response_mask.sum(-1) - 1).clamp(min=0)] = torch.tensor(
        [1.0, 0.0, 0.5, 1.0, 0.0, 0.25]
    )
    advantages = torch.tensor([[1.0, 3.0, 9.0], [-1.0, 5.0, 5.0], [0.5, 7, 7], [2.0, 2.0, 2.0],
                               [4.0, 4.0, 4.0], [0.0, 1.0, 8.0]])  # fmt: skip
    return DataProto.from_dict(
        tensors={
            K.PROMPTS: prompts,
            K.RESPONSES: responses,
            K.RESPONSE_MASK: response_mask,
            K.ATTENTION_MASK: torch.cat([prompt_mask, response_mask], dim=1),
            K.TOKEN_LEVEL_SCORES: scores,
            K.ADVANTAGES: advantages * response_mask,
        },
        non_tensors={
            K.UID: uid,
            K.REWARD_MODEL: np.array([{"ground_truth": g} for g in "BABCAC"], dtype=object),
            "acc": np.array([1.0, 0.0, 0.0, 1.0, 0.0, 0.0], dtype=object),
        },
        meta_info={K.REWARD_EXTRA_KEYS: ["acc"]},
    )


def test_the_first_groups_are_taken_whole_with_each_rows_own_values():
    rows = train_generation_rows(final_batch(), LetterTokenizer(), step=7, groups=2)
    assert [(r["uid"], r["input"], r["output"]) for r in rows] == [
        ("b", "b", "gh"),  # batch rows 0 and 2: group b first (its first row comes first)
        ("b", "b", "g"),
        ("a", "cd", "i"),  # rows 1 and 4: group a; c (rows 3, 5) is the third group: left out
        ("a", "cd", ""),
    ]
    assert [r["score"] for r in rows] == [1.0, 0.5, 0.0, 0.0]
    # the mean over the response mask: (1 + 3) / 2, 0.5 / 1, -1 / 1, none for an empty response
    assert [r["advantage"] for r in rows] == [2.0, 0.5, -1.0, None]
    assert [r["response_length"] for r in rows] == [2, 1, 1, 0]
    assert [r["ground_truth"] for r in rows] == ["B", "B", "A", "A"]
    assert [r["acc"] for r in rows] == [1.0, 0.0, 0.0, 0.0]
    assert {r["step"] for r in rows} == {7}
    assert list(rows[0]) == ["step", "uid", "input", "output", "score", "advantage",
                             "response_length", "ground_truth", "acc"]  # fmt: skip


@pytest.mark.parametrize("groups", [0, -1])
def test_no_groups_is_no_table(groups):
    assert train_generation_rows(final_batch(), LetterTokenizer(), step=1, groups=groups) == []


def test_more_groups_than_the_batch_has_is_the_whole_batch():
    rows = train_generation_rows(final_batch(), LetterTokenizer(), step=1, groups=10)
    assert [r["uid"] for r in rows] == ["b", "b", "a", "a", "c", "c"]
