"""compute_data_metrics: every key and its denominator on the hand-built batch of conftest.py."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from tensordict import TensorDict

from dataproto.protocol import DataProto
from stages.metrics import compute_data_metrics, explained_variance, response_lengths

APPROX = {"rel": 1e-6, "abs": 1e-6}


def _masked_tokens(batch: DataProto, key: str) -> list[float]:
    """Loop oracle: the values of ``key`` at response_mask == 1, row by row."""
    values, mask = batch.batch[key], batch.batch["response_mask"]
    return [
        float(values[i, t])
        for i in range(values.shape[0])
        for t in range(values.shape[1])
        if mask[i, t]
    ]


def test_response_length_includes_aborted_rows(batch):
    metrics = compute_data_metrics(batch)
    assert metrics["response_length/mean"] == pytest.approx(7 / 4)  # (4 + 2 + 0 + 1) / 4 rows
    assert metrics["response_length/max"] == 4.0
    assert metrics["response_length/min"] == 0.0
    assert metrics["response_length/clip_ratio"] == pytest.approx(1 / 4)  # row 0 hits R = 4


def test_non_aborted_lengths_exclude_zero_length_rows(batch):
    metrics = compute_data_metrics(batch)
    assert metrics["response_length_non_aborted/mean"] == pytest.approx(7 / 3)
    assert metrics["response_length_non_aborted/min"] == 1.0
    assert metrics["response_length_non_aborted/max"] == 4.0
    assert metrics["response_length_non_aborted/clip_ratio"] == pytest.approx(1 / 3)
    assert metrics["response/aborted_ratio"] == pytest.approx(1 / 4)


def test_prompt_length_clip_against_prompt_width(batch):
    metrics = compute_data_metrics(batch)
    assert metrics["prompt_length/mean"] == pytest.approx(9 / 4)
    assert (metrics["prompt_length/max"], metrics["prompt_length/min"]) == (3.0, 1.0)
    assert metrics["prompt_length/clip_ratio"] == pytest.approx(2 / 4)  # rows 0 and 3 fill P = 3


def test_score_and_reward_over_non_aborted_rows(batch):
    metrics = compute_data_metrics(batch)
    # the aborted row's 5.0 (written into the padding column) must not count
    assert metrics["critic/score/mean"] == pytest.approx(1.5 / 3)
    assert (metrics["critic/score/max"], metrics["critic/score/min"]) == (1.0, 0.0)
    assert metrics["critic/rewards/mean"] == pytest.approx((1.0 - 0.1 + 0.5) / 3)
    assert metrics["critic/rewards/min"] == pytest.approx(-0.1)


@pytest.mark.parametrize("key", ["advantages", "returns", "values"])
def test_token_statistics_match_loop_oracle(batch, key):
    metrics = compute_data_metrics(batch)
    expected = _masked_tokens(batch, key)
    prefix = f"critic/{key}"
    assert metrics[f"{prefix}/mean"] == pytest.approx(sum(expected) / len(expected), **APPROX)
    assert metrics[f"{prefix}/max"] == pytest.approx(max(expected), **APPROX)
    assert metrics[f"{prefix}/min"] == pytest.approx(min(expected), **APPROX)


def test_explained_variance_uses_unbiased_variances(batch):
    returns = np.array(_masked_tokens(batch, "returns"))
    values = np.array(_masked_tokens(batch, "values"))
    expected = 1 - np.var(returns - values, ddof=1) / (np.var(returns, ddof=1) + 1e-5)
    assert compute_data_metrics(batch)["critic/vf_explained_var"] == pytest.approx(
        expected, rel=1e-5
    )


def test_explained_variance_is_nan_below_two_tokens():
    one = torch.tensor([1.0, 2.0])
    assert math.isnan(explained_variance(one, one, torch.tensor([1, 0])).item())
    assert math.isnan(explained_variance(one, one, torch.tensor([0, 0])).item())


def test_changing_values_under_the_mask_changes_nothing(batch):
    before = compute_data_metrics(batch)
    hidden = batch.batch["response_mask"] == 0
    for key in ["advantages", "returns", "values"]:
        batch.batch[key] = torch.where(
            hidden, torch.full_like(batch.batch[key], float("nan")), batch.batch[key]
        )
    after = compute_data_metrics(batch)
    assert after == pytest.approx(before, nan_ok=True)


def test_multi_turn_and_tool_counts(batch):
    metrics = compute_data_metrics(batch)
    assert (metrics["num_turns/min"], metrics["num_turns/max"], metrics["num_turns/mean"]) == (
        1.0,
        4.0,
        2.5,
    )
    assert metrics["tool_call_counts/max"] == 2.0
    assert metrics["tool_call_counts/mean"] == pytest.approx(0.75)
    del batch.non_tensor_batch["__num_turns__"], batch.non_tensor_batch["tool_call_counts"]
    assert not any(
        key.startswith(("num_turns", "tool_call")) for key in compute_data_metrics(batch)
    )


def test_without_critic_there_are_no_value_keys(make_batch):
    metrics = compute_data_metrics(make_batch(use_critic=False), use_critic=False)
    assert not any(key.startswith("critic/values") for key in metrics)
    assert "critic/vf_explained_var" not in metrics
    assert "critic/advantages/mean" in metrics


def test_every_value_is_a_python_float(batch):
    assert all(type(value) is float for value in compute_data_metrics(batch).values())


def test_all_aborted_gives_nan_not_an_error(batch):
    batch.batch["attention_mask"][:, 3:] = 0
    batch.batch["response_mask"][:] = 0
    metrics = compute_data_metrics(batch)
    for key in [
        "critic/score/mean",
        "critic/rewards/max",
        "critic/advantages/mean",
        "critic/values/min",
        "critic/vf_explained_var",
        "response_length_non_aborted/mean",
        "response_length_non_aborted/clip_ratio",
    ]:
        assert math.isnan(metrics[key]), key
    assert metrics["response_length/mean"] == 0.0
    assert metrics["response/aborted_ratio"] == 1.0


def test_precomputed_length_tensors_replace_the_attention_mask(batch):
    batch.batch["prompt_length"] = torch.tensor([1.0, 1.0, 1.0, 1.0])
    batch.batch["response_length"] = torch.tensor([4.0, 4.0, 4.0, 0.0])
    prompt_length, response_length = response_lengths(batch)
    assert prompt_length.tolist() == [1.0] * 4 and response_length.tolist() == [4.0, 4.0, 4.0, 0.0]
    metrics = compute_data_metrics(batch)
    assert metrics["response_length/clip_ratio"] == pytest.approx(3 / 4)
    assert metrics["prompt_length/mean"] == 1.0


def test_missing_key_names_the_key(batch):
    del batch.batch["advantages"]
    with pytest.raises(KeyError, match="advantages"):
        compute_data_metrics(batch)
    with pytest.raises(KeyError, match="values"):
        compute_data_metrics(DataProto(TensorDict({}, batch_size=[4])), use_critic=True)


# --- deliberate difference 2: padding rows are excluded -------------------------------------


@pytest.mark.parametrize("layer", ["tensor", "numpy"])
def test_padding_rows_do_not_change_any_metric(batch, pad_rows, layer):
    padded = pad_rows(batch, [0, 1, 0], flag_layer=layer)
    assert compute_data_metrics(padded) == pytest.approx(compute_data_metrics(batch), nan_ok=True)


def test_unflagged_padding_would_bias_the_metrics(batch, pad_rows):
    padded = pad_rows(batch, [0, 1, 0], flag_layer=None)
    assert compute_data_metrics(padded)["critic/score/mean"] != pytest.approx(
        compute_data_metrics(batch)["critic/score/mean"]
    )


def test_padding_flag_with_wrong_length_is_rejected(batch):
    batch.non_tensor_batch["is_pad"] = np.array([False, True])
    with pytest.raises(ValueError, match=r"is_pad.*\(4,\)"):
        compute_data_metrics(batch)


def test_only_padding_rows_gives_nan(batch):
    batch.batch["is_pad"] = torch.ones(4, dtype=torch.bool)
    metrics = compute_data_metrics(batch)
    assert math.isnan(metrics["response_length/mean"]) and math.isnan(metrics["num_turns/max"])


@pytest.mark.gpu
def test_cuda_batch_gives_the_cpu_numbers(batch, pad_rows):
    padded = pad_rows(batch, [0, 1], flag_layer="numpy")  # numpy flags meet CUDA tensors
    on_gpu = DataProto(padded.batch.to("cuda"), padded.non_tensor_batch, padded.meta_info)
    assert compute_data_metrics(on_gpu) == pytest.approx(
        compute_data_metrics(batch), rel=1e-5, nan_ok=True
    )
