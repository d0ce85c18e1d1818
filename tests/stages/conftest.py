"""A small hand-built rollout batch, fake engines and a config for the stage unit tests."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from tensordict import TensorDict

from dataproto import DataProto
from stages.config import load_config

REPO = Path(__file__).resolve().parents[2]


class FakeEngine:
    """A worker-group stand-in: ``call(method, batch)`` → ``methods[method](batch, **kwargs)``;
    every call is recorded in ``calls`` as (method, sorted batch keys)."""

    def __init__(self, **methods) -> None:
        self.methods = methods
        self.calls: list[tuple[str, list[str]]] = []

    def call(self, method: str, batch: DataProto, **kwargs) -> DataProto:
        keys = sorted(batch.batch.keys()) if batch.batch is not None else []
        self.calls.append((method, keys))
        return self.methods[method](batch, **kwargs)


def config(*overrides: str):
    return load_config(REPO / "configs" / "demo-cpu.yaml", list(overrides))


@pytest.fixture
def fake_engine():
    """The :class:`FakeEngine` class (conftest modules are not importable from tests)."""
    return FakeEngine


@pytest.fixture
def make_config():
    return config


@pytest.fixture
def rollout_batch() -> DataProto:
    """B = 4 rows (2 prompts × 2), P = 2, R = 3; row 3's response is empty (aborted)."""
    attention = torch.tensor(
        [[0, 1, 1, 1, 0], [1, 1, 1, 1, 1], [0, 1, 1, 0, 0], [1, 1, 0, 0, 0]], dtype=torch.long
    )
    input_ids = torch.arange(20).reshape(4, 5) * attention
    response_mask = attention[:, 2:]
    tensors = {
        "input_ids": input_ids,
        "attention_mask": attention,
        "position_ids": (attention.cumsum(-1) - 1).clamp(min=0),
        "prompts": input_ids[:, :2],
        "responses": input_ids[:, 2:],
        "response_mask": response_mask,
        "rollout_log_probs": torch.tensor(
            [[-1.0, -2.0, 0.0], [-0.5, -0.5, -0.5], [-3.0, 0.0, 0.0], [0.0, 0.0, 0.0]]
        ),
        "rm_scores": torch.tensor(
            [[0.0, 1.0, 0.0], [0.0, 0.0, 0.5], [0.25, 0.0, 0.0], [0.0, 0.0, 0.0]]
        ),
    }
    return DataProto(
        batch=TensorDict(tensors, batch_size=[4]),
        non_tensor_batch={"uid": np.array(["a", "a", "b", "b"], dtype=object)},
        meta_info={"temperature": 1.0},
    )
