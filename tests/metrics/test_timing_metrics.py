"""Timing, per-token timing, throughput and the accumulating timer."""

from __future__ import annotations

import pytest

from dataproto.protocol import DataProto
from stages.metrics import (
    compute_throughout_metrics,
    compute_throughput_metrics,
    compute_timing_metrics,
    timed,
)
from stages.metrics import timing as timing_module

# conftest batch: prompt tokens 3 + 2 + 1 + 3 = 9, response tokens 4 + 2 + 0 + 1 = 7


def test_per_token_timing_uses_the_right_token_counts(batch):
    timing_raw = {
        "gen": 0.7,
        "ref": 0.32,
        "values": 0.16,
        "adv": 0.016,
        "update_critic": 1.6,
        "update_actor": 3.2,
        "reward": 0.5,
        "step": 8.0,
    }
    metrics = compute_timing_metrics(batch, timing_raw)
    assert metrics["timing_per_token_ms/gen"] == pytest.approx(
        0.7 * 1000 / 7
    )  # response tokens only
    for name in ["ref", "values", "adv", "update_critic", "update_actor"]:
        assert metrics[f"timing_per_token_ms/{name}"] == pytest.approx(timing_raw[name] * 1000 / 16)
    assert {f"timing_s/{name}" for name in timing_raw} <= set(metrics)
    assert metrics["timing_s/step"] == 8.0
    assert "timing_per_token_ms/reward" not in metrics and "timing_per_token_ms/step" not in metrics


def test_per_token_timing_is_zero_without_tokens(batch):
    batch.batch["attention_mask"][:] = 0
    metrics = compute_timing_metrics(batch, {"gen": 1.0, "update_actor": 2.0})
    assert metrics["timing_per_token_ms/gen"] == 0.0
    assert metrics["timing_per_token_ms/update_actor"] == 0.0


def test_timer_names_with_slashes_pass_through(batch):
    metrics = compute_timing_metrics(batch, {"agent_loop/generate_sequences": 1.5})
    assert metrics == {"timing_s/agent_loop/generate_sequences": 1.5}


def test_throughput_worked_example():
    # two sequences, P = 5, r1 = 3, r2 = 7: tokens 2·5 + 3 + 7 = 20; 2 s on 4 devices
    batch = DataProto(meta_info={"global_token_num": [8, 12]})
    metrics = compute_throughput_metrics(batch, {"step": 2.0, "gen": 1.0}, n_gpus=4)
    assert metrics == {
        "perf/total_num_tokens": 20.0,
        "perf/time_per_step": 2.0,
        "perf/throughput": 2.5,
    }


def test_verl_spelling_is_the_same_function():
    assert compute_throughout_metrics is compute_throughput_metrics


def test_throughput_errors_name_what_is_missing():
    with pytest.raises(KeyError, match="global_token_num"):
        compute_throughput_metrics(DataProto(), {"step": 1.0}, n_gpus=1)
    batch = DataProto(meta_info={"global_token_num": [1]})
    with pytest.raises(KeyError, match="'step'"):
        compute_throughput_metrics(batch, {"gen": 1.0}, n_gpus=1)
    with pytest.raises(ValueError, match="n_gpus"):
        compute_throughput_metrics(batch, {"step": 1.0}, n_gpus=0)
    with pytest.raises(ValueError, match="> 0 seconds"):
        compute_throughput_metrics(batch, {"step": 0.0}, n_gpus=1)


class _FakeClock:
    def __init__(self, ticks):
        self.ticks = iter(ticks)

    def __call__(self):
        return next(self.ticks)


def test_timer_accumulates_on_repeated_names(monkeypatch):
    monkeypatch.setattr(
        timing_module.time, "perf_counter", _FakeClock([10.0, 10.5, 20.0, 20.25, 30.0, 31.0])
    )
    timing_raw: dict[str, float] = {}
    with timed("gen", timing_raw):
        pass
    with timed("gen", timing_raw):
        pass
    with timed("adv", timing_raw):
        pass
    assert timing_raw == {"gen": 0.75, "adv": 1.0}


def test_timer_records_time_when_the_body_raises(monkeypatch):
    monkeypatch.setattr(timing_module.time, "perf_counter", _FakeClock([1.0, 3.0]))
    timing_raw: dict[str, float] = {}
    with pytest.raises(RuntimeError), timed("update_actor", timing_raw):
        raise RuntimeError("boom")
    assert timing_raw == {"update_actor": 2.0}
