"""A hand-built PPO batch with known lengths, scores and an aborted row, for the metric tests.

Rows (P = 3 prompt columns, R = 4 response columns):

| row | prompt len | response len | score | note |
|-----|-----------|--------------|-------|------|
| 0   | 3         | 4 (= R)      | 1.0   | clipped response |
| 1   | 2         | 2            | 0.0   | |
| 2   | 1         | 0            | 5.0*  | aborted; score sits in the padding column (verl's −1 index) |
| 3   | 3         | 1            | 0.5   | |
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from tensordict import TensorDict

from dataproto.protocol import DataProto

PROMPT_LENGTHS = [3, 2, 1, 3]
RESPONSE_LENGTHS = [4, 2, 0, 1]
P, R = 3, 4


def _masks() -> tuple[torch.Tensor, torch.Tensor]:
    prompt_mask = torch.tensor([[0] * (P - n) + [1] * n for n in PROMPT_LENGTHS])  # left-padded
    response_mask = torch.tensor(
        [[1] * n + [0] * (R - n) for n in RESPONSE_LENGTHS]
    )  # right-padded
    return prompt_mask, response_mask


def build_batch(use_critic: bool = True) -> DataProto:
    """The table above as a DataProto with every key compute_data_metrics reads."""
    prompt_mask, response_mask = _masks()
    scores = torch.zeros(4, R)
    for row, (length, score) in enumerate(zip(RESPONSE_LENGTHS, [1.0, 0.0, 5.0, 0.5])):
        scores[row, length - 1] = score  # length 0 → index −1: the padding column
    rewards = scores.clone()
    rewards[1, 0] = -0.1  # a KL-like term on row 1: reward sums [1, −0.1, 5, 0.5]
    generator = torch.Generator().manual_seed(0)
    tensors = {
        "prompts": torch.ones(4, P, dtype=torch.long),
        "responses": torch.ones(4, R, dtype=torch.long),
        "attention_mask": torch.cat([prompt_mask, response_mask], dim=1),
        "response_mask": response_mask,
        "token_level_scores": scores,
        "token_level_rewards": rewards,
        "advantages": torch.randn(4, R, generator=generator),
        "returns": torch.randn(4, R, generator=generator),
    }
    if use_critic:
        tensors["values"] = torch.randn(4, R, generator=generator)
    non_tensors = {
        "__num_turns__": np.array([2, 3, 1, 4], dtype=object),
        "tool_call_counts": np.array([0, 1, 0, 2]),
    }
    return DataProto(TensorDict(tensors, batch_size=[4]), non_tensors, {})


def pad_with_duplicates(batch: DataProto, rows: list[int], flag_layer: str | None) -> DataProto:
    """Append copies of ``rows`` (as pad_dataproto_to_divisor does) and flag them in a layer."""
    index = list(range(len(batch.batch))) + rows
    tensors = {key: value[index] for key, value in batch.batch.items()}
    non_tensors = {key: value[index] for key, value in batch.non_tensor_batch.items()}
    is_pad = [False] * len(batch.batch) + [True] * len(rows)
    if flag_layer == "tensor":
        tensors["is_pad"] = torch.tensor(is_pad)
    elif flag_layer == "numpy":
        non_tensors["is_pad"] = np.array(is_pad)
    return DataProto(
        TensorDict(tensors, batch_size=[len(index)]), non_tensors, dict(batch.meta_info)
    )


@pytest.fixture
def batch() -> DataProto:
    return build_batch()


@pytest.fixture
def make_batch():
    return build_batch


@pytest.fixture
def pad_rows():
    return pad_with_duplicates
