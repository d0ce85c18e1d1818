"""The weight stream to a rollout engine (stages/engines/weight_buckets.py) and the worker-side
checks of stages/engines/vllm_worker_ext.py that need no vLLM: buckets bounded, lazy, lossless."""

from __future__ import annotations

import pytest
import torch

from stages.engines.vllm_worker_ext import (
    WeightSyncExtension,
    check_reload_signature,
    checked_stream,
)
from stages.engines.weight_buckets import (
    bucket_names,
    named_tensors,
    safetensors_buckets,
    tensors_of,
)


def model_weights() -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    tied = torch.randn(8, 4)
    return {
        "embed.weight": tied,  # 128 bytes
        "layer.weight": torch.randn(4, 4),  # 64
        "layer.bias": torch.randn(4),  # 16
        "big.weight": torch.randn(64, 4),  # 1024: more than a bucket
        "lm_head.weight": tied,  # shares embed's storage
        "norm.weight": torch.ones(4, dtype=torch.bfloat16),  # 8
    }


def test_buckets_hold_at_most_the_budget_and_a_larger_tensor_alone():
    assert bucket_names(model_weights(), bucket_bytes=200) == [
        ["embed.weight", "layer.weight"],
        ["layer.bias"],
        ["big.weight"],
        ["lm_head.weight", "norm.weight"],
    ]
    assert bucket_names(model_weights(), bucket_bytes=1 << 20) == [list(model_weights())]


def test_buckets_round_trip_every_tensor_with_tied_ones_in_one_bucket():
    weights = model_weights()
    received = [
        pair for bucket in safetensors_buckets(weights, 1 << 20) for pair in tensors_of(bucket)
    ]
    assert sorted(name for name, _ in received) == sorted(weights)  # (safetensors sorts names)
    for name, tensor in received:
        assert tensor.dtype == weights[name].dtype and torch.equal(tensor, weights[name]), name


def test_buckets_are_made_as_they_are_read():
    read = []

    def stream():
        for name, tensor in model_weights().items():
            read.append(name)
            yield name, tensor

    buckets = safetensors_buckets(stream(), bucket_bytes=200)
    next(buckets)
    assert read == ["embed.weight", "layer.weight", "layer.bias"]  # the third closed the first


def test_the_in_process_stream_passes_tensors_as_they_are():
    weights = model_weights()
    for (name, sent), original in zip(named_tensors(weights), weights.values()):
        assert sent.data_ptr() == original.data_ptr(), name  # no copy


def test_bad_weights_are_named():
    with pytest.raises(TypeError, match="weight 'x' is a list"):
        list(named_tensors([("x", [1.0])]))
    with pytest.raises(ValueError, match="bucket_bytes must be at least 1"):
        next(safetensors_buckets(model_weights(), bucket_bytes=0))
    with pytest.raises(TypeError, match="payload must be safetensors bytes"):
        next(checked_stream("not bytes"))
    with pytest.raises(TypeError, match=r"item must be \(name, Tensor\)"):
        next(checked_stream([("x", 1.0)]))


def test_a_vllm_without_the_in_place_reload_is_refused():
    def old_reload(self) -> None: ...

    def reload(self, weights_iterator=None, weights_path=None, is_checkpoint_format=True): ...

    check_reload_signature(reload, "0.32.0")
    with pytest.raises(RuntimeError, match=r"vLLM 0\.10\.0's model runner .* vllm>=0\.32,<0\.34"):
        check_reload_signature(old_reload, "0.10.0")


class FakeWorker(WeightSyncExtension):
    """What the staging methods use of a vLLM worker: a model runner with a model."""

    def __init__(self, model: torch.nn.Module) -> None:
        model_runner = type("Runner", (), {"get_model": lambda _self: model})()
        self.model_runner = model_runner
        self.loaded: list[tuple[str, torch.Tensor]] | None = None

    def ppoflow_load_weights(self, payload):  # the reload itself needs vLLM: recorded here
        self.loaded = list(checked_stream(payload))
        return len(self.loaded)


def test_staged_buckets_load_once_and_are_dropped():
    worker = FakeWorker(torch.nn.Linear(2, 2))
    weights = model_weights()
    counts = [worker.ppoflow_stage_weights(b) for b in safetensors_buckets(weights, 200)]
    assert counts == [2, 3, 4, 6]
    assert worker.loaded is None, "nothing is loaded before the last bucket"
    assert worker.ppoflow_load_staged_weights() == len(weights)
    assert sorted(name for name, _ in worker.loaded) == sorted(weights)
    with pytest.raises(RuntimeError, match="no weights were staged"):
        worker.ppoflow_load_staged_weights()
