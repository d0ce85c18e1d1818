"""Toy stages for the orchestration tests, and one Prefect test harness for the whole session.

The toy step (x is the input tensor, uid the input group ids):

    produce   y = x + toy.offset                       config: toy.offset
    double    z = toy.factor * y                        config: toy.factor
    score     s = w * z, w = engines["model"].weight    reads weights
    critic    v = z (disabled unless toy.use_critic)
    total     total = Σ_row s (non-tensor); metric toy/total_mean = mean(total)

Every stage function counts its calls in ``calls`` so a test can prove a cache hit did no work.
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass

import numpy as np
import pytest
import torch
from pydantic import BaseModel

from dataproto import DataProto
from stages.stage import Stage, StageContext, non_tensor, tensor


class ToyConfig(BaseModel):
    offset: float = 1.0
    factor: float = 2.0
    use_critic: bool = False


class ToyRunConfig(BaseModel):
    toy: ToyConfig = ToyConfig()


@dataclass
class ToyModel:
    weight: float


def uses_critic(config: ToyRunConfig) -> bool:
    return config.toy.use_critic


def make_stages(calls: Counter) -> list[Stage]:
    def produce(batch: DataProto, ctx: StageContext) -> DataProto:
        calls["produce"] += 1
        return DataProto.from_dict({"y": batch.batch["x"] + ctx.config.toy.offset})

    def double(batch: DataProto, ctx: StageContext) -> DataProto:
        calls["double"] += 1
        return DataProto.from_dict({"z": batch.batch["y"] * ctx.config.toy.factor})

    def score(batch: DataProto, ctx: StageContext) -> DataProto:
        calls["score"] += 1
        return DataProto.from_dict({"s": batch.batch["z"] * ctx.engines["model"].weight})

    def critic(batch: DataProto, ctx: StageContext) -> DataProto:
        calls["critic"] += 1
        return DataProto.from_dict({"v": batch.batch["z"].clone()})

    def total(batch: DataProto, ctx: StageContext) -> DataProto:
        calls["total"] += 1
        sums = batch.batch["s"].sum(dim=-1)
        ctx.metrics["toy/total_mean"] = float(sums.mean())
        return DataProto.from_dict(non_tensors={"total": sums.numpy().astype(np.float64)})

    return [
        Stage("produce", 1, (tensor("x"),), (tensor("y"),), produce, config_keys=("toy.offset",)),
        Stage("double", 1, (tensor("y"),), (tensor("z"),), double, config_keys=("toy.factor",)),
        Stage("score", 1, (tensor("z"),), (tensor("s"),), score, reads_weights=True),
        Stage("critic", 1, (tensor("z"),), (tensor("v"),), critic, when=uses_critic),
        Stage("total", 1, (tensor("s"), non_tensor("uid")), (non_tensor("total"),), total),
    ]


@pytest.fixture
def calls() -> Counter:
    return Counter()


@pytest.fixture
def toy_stages(calls: Counter) -> list[Stage]:
    return make_stages(calls)


@pytest.fixture
def make_config():
    """``make_config(factor=3.0)`` → a ToyRunConfig with those ``toy`` fields."""
    return lambda **toy: ToyRunConfig(toy=ToyConfig(**toy))


@pytest.fixture
def toy_batch() -> DataProto:
    x = torch.arange(12, dtype=torch.float32).reshape(4, 3)
    return DataProto.from_dict({"x": x}, {"uid": np.array(["a", "a", "b", "b"], dtype=object)})


@pytest.fixture
def toy_ctx() -> StageContext:
    return StageContext(config=ToyRunConfig(), engines={"model": ToyModel(weight=0.5)})


@pytest.fixture(scope="session")
def prefect_harness():
    """One temporary Prefect server and database for every test that runs real flows (~10 s).

    Flow-run heartbeats are off: their thread sleeps in 1 s steps and is joined when a flow run
    ends, which adds about 0.9 s to every flow run (Prefect 3.9).
    """
    from prefect.settings import PREFECT_FLOWS_HEARTBEAT_FREQUENCY, temporary_settings
    from prefect.testing.utilities import prefect_test_harness

    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")  # no telemetry calls
    with (
        prefect_test_harness(server_startup_timeout=120),
        temporary_settings(updates={PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}),
    ):
        yield
