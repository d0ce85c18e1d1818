"""verl's FLOPs estimate, the peak table, and the MFU / memory metrics of a worker's pass."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest
import torch

from stages.engines.efficiency import PassMeter
from stages.metrics.flops import (
    DecoderShape,
    device_peak_flops,
    model_flops_utilization,
    training_flops,
)

#: Qwen2.5-0.5B's config sizes
QWEN_05B = SimpleNamespace(
    num_hidden_layers=24,
    hidden_size=896,
    intermediate_size=4864,
    vocab_size=151936,
    num_attention_heads=14,
    num_key_value_heads=2,
)


def test_qwen_05b_shape_counts_its_weights_as_verl_does():
    shape = DecoderShape.of(QWEN_05B)
    assert shape.head_dim == 64
    # 24·(3·896·4864 + 896·(2·896 + 2·128)) + 2·151936·896
    assert shape.weights == 24 * (13_074_432 + 1_835_008) + 272_269_312 == 630_095_872


def test_training_flops_add_the_attention_term_per_sequence():
    shape = DecoderShape.of(QWEN_05B)
    one = training_flops(shape, [1024])
    split = training_flops(shape, [512, 512])
    # same tokens: the 6·N part is equal, the attention part halves (Σ s² 1024² → 2·512²)
    attention_1024 = 12 * 24 * 14 * 64 * 1024**2
    assert one - split == pytest.approx(attention_1024 / 2)
    assert one == 6 * shape.weights * 1024 + attention_1024


def test_shape_of_configs_it_cannot_estimate_is_none():
    assert DecoderShape.of(SimpleNamespace(hidden_size=8)) is None
    assert DecoderShape.of(SimpleNamespace(**vars(QWEN_05B), num_experts=8)) is None


@pytest.mark.parametrize(
    ("name", "peak"),
    [
        ("NVIDIA H100 80GB HBM3", 989e12),
        ("NVIDIA H200", 989e12),  # not the H20's 148e12
        ("NVIDIA H20", 148e12),
        ("NVIDIA L40S", 362.05e12),  # not the L40's
        ("NVIDIA A100-SXM4-80GB", 312e12),
        ("NVIDIA GeForce RTX 4090", None),
    ],
)
def test_peak_table_takes_the_first_matching_entry(name, peak):
    assert device_peak_flops(name) == peak


def test_mfu_refuses_a_zero_time():
    with pytest.raises(ValueError, match="seconds"):
        model_flops_utilization(1.0, 0.0, 1e12)


def test_pass_meter_on_the_cpu_adds_nothing_by_default():
    meter = PassMeter("perf/mfu/actor", "actor", QWEN_05B, torch.device("cpu"), backward=True)
    metrics: dict[str, float] = {}
    with meter.measure(torch.ones(2, 8), metrics):
        pass
    assert metrics == {}


@pytest.mark.parametrize(("backward", "passes", "share"), [(True, 2, 2.0), (False, 1, 1 / 3)])
def test_pass_meter_divides_the_pass_flops_by_its_time_and_the_peak(backward, passes, share):
    peak = 1e15
    meter = PassMeter(
        "perf/mfu/x", "x", QWEN_05B, torch.device("cpu"), backward=backward, peak_flops=peak
    )
    mask = torch.tensor([[0, 1, 1, 1], [1, 1, 0, 0]])  # rows of 3 and 2 real tokens
    metrics: dict[str, float] = {}
    start = time.perf_counter()
    with meter.measure(mask, metrics, passes=passes):
        time.sleep(0.05)
    elapsed = time.perf_counter() - start
    flops = training_flops(DecoderShape.of(QWEN_05B), [3, 2]) * share
    # the meter's own seconds lie between the sleep and the whole with statement
    assert flops / elapsed / peak <= metrics["perf/mfu/x"] <= flops / 0.05 / peak
    assert set(metrics) == {"perf/mfu/x"}  # no device memory off CUDA
