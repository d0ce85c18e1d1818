"""agg_loss: fact-sheet numbers, global denominators, errors, empty batches, loop oracle."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.testing import assert_close

from stages.algos.aggregation import (
    AGG_LOSS_MODES,
    LOCAL_BATCH,
    GlobalBatchInfo,
    agg_loss,
    aggregate_loss,
)

LOSS = torch.tensor([[1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 7.0, 8.0]], dtype=torch.float64)
MASK = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]])
ALL_MODES = [
    "token-mean",
    "token-sum",
    "seq-mean-token-sum",
    "seq-mean-token-mean",
    "seq-mean-token-sum-norm",
]


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("token-mean", 3.5),
        ("token-sum", 21.0),
        ("seq-mean-token-sum", 10.5),
        ("seq-mean-token-mean", 4.0),
        ("seq-mean-token-sum-norm", 2.625),
    ],
)
def test_fact_sheet_example(mode: str, expected: float) -> None:
    assert agg_loss(LOSS, MASK, mode).item() == pytest.approx(expected)
    assert aggregate_loss(LOSS, MASK.bool(), mode).item() == pytest.approx(expected)
    assert aggregate_loss(LOSS, MASK.double(), mode, {"dp_size": 1}).item() == pytest.approx(
        expected
    )


def test_registry_holds_exactly_the_five_modes() -> None:
    assert sorted(ALL_MODES) == AGG_LOSS_MODES.names()


def test_global_denominators_and_dp_factor() -> None:
    # this rank holds 6 of 12 tokens and 2 of 5 sequences of the mini-batch, DP size 3
    info = GlobalBatchInfo(
        dp_size=3, batch_num_tokens=12, global_batch_size=5, loss_scale_factor=2.0
    )
    assert aggregate_loss(LOSS, MASK, "token-mean", info).item() == pytest.approx(21 / 12 * 3)
    assert aggregate_loss(LOSS, MASK, "token-sum", info).item() == pytest.approx(21 * 3)
    assert aggregate_loss(LOSS, MASK, "seq-mean-token-sum", info).item() == pytest.approx(
        21 / 5 * 3
    )
    assert aggregate_loss(LOSS, MASK, "seq-mean-token-mean", info).item() == pytest.approx(
        (2.5 + 5.5) / 5 * 3
    )
    assert aggregate_loss(LOSS, MASK, "seq-mean-token-sum-norm", info).item() == pytest.approx(
        21 / 5 * 3 / 2
    )
    # the verl keyword form is the same function
    assert agg_loss(LOSS, MASK, "token-mean", **info.as_kwargs()).item() == pytest.approx(
        21 / 12 * 3
    )


def test_device_tensor_counts_are_accepted() -> None:
    info = GlobalBatchInfo(
        dp_size=2, batch_num_tokens=torch.tensor(12), global_batch_size=torch.tensor(4)
    )
    assert aggregate_loss(LOSS, MASK, "token-mean", info).item() == pytest.approx(21 / 12 * 2)
    assert aggregate_loss(LOSS, MASK, "seq-mean-token-sum", info).item() == pytest.approx(
        21 / 4 * 2
    )


@pytest.mark.parametrize(
    ("mode", "needed"),
    [
        ("token-mean", "batch_num_tokens"),
        ("seq-mean-token-sum", "global_batch_size"),
        ("seq-mean-token-mean", "global_batch_size"),
        ("seq-mean-token-sum-norm", "global_batch_size"),
    ],
)
def test_dp_without_global_count_raises_naming_the_count(mode: str, needed: str) -> None:
    with pytest.raises(ValueError, match=rf"{mode}.*dp_size=2.*{needed}"):
        agg_loss(LOSS, MASK, mode, dp_size=2)


def test_token_sum_needs_no_global_count() -> None:
    assert agg_loss(LOSS, MASK, "token-sum", dp_size=2).item() == pytest.approx(42.0)


def test_unknown_mode_lists_modes() -> None:
    with pytest.raises(KeyError, match=r"unknown loss_agg_mode 'seq-mean'.*token-mean"):
        agg_loss(LOSS, MASK, "seq-mean")


def test_shape_mismatch_raises() -> None:
    with pytest.raises(ValueError, match=r"loss_mat shape \(2, 4\).*loss_mask shape \(2, 3\)"):
        agg_loss(LOSS, MASK[:, :3], "token-mean")


@pytest.mark.parametrize("bad", [0, -1, True, 1.5])
def test_dp_size_validated(bad: object) -> None:
    with pytest.raises(ValueError, match="dp_size must be an int"):
        GlobalBatchInfo(dp_size=bad)  # type: ignore[arg-type]


def test_coerce_accepts_verl_dict_and_rejects_unknown_keys() -> None:
    verl_dict = {
        "dp_size": 2,
        "batch_num_tokens": 8,
        "global_batch_size": None,
        "loss_scale_factor": None,
    }
    assert GlobalBatchInfo.coerce(verl_dict) == GlobalBatchInfo(dp_size=2, batch_num_tokens=8)
    assert GlobalBatchInfo.coerce(None) is LOCAL_BATCH
    with pytest.raises(KeyError, match="batch_tokens"):
        GlobalBatchInfo.coerce({"batch_tokens": 8})
    with pytest.raises(TypeError, match="list"):
        GlobalBatchInfo.coerce([2, 8])  # type: ignore[arg-type]


def test_for_mini_batch_counts_all_sequences() -> None:
    info = GlobalBatchInfo.for_mini_batch(torch.tensor([[1, 1], [0, 0], [1, 0]]), dp_size=2)
    assert int(info.batch_num_tokens) == 3
    assert info.global_batch_size == 3
    assert info.dp_size == 2


def test_empty_rows_excluded_from_local_sequence_count() -> None:
    mask = torch.tensor([[1, 1, 0, 0], [0, 0, 0, 0]])
    assert agg_loss(LOSS, mask, "seq-mean-token-sum").item() == pytest.approx(3.0)
    assert agg_loss(LOSS, mask, "seq-mean-token-mean").item() == pytest.approx(1.5)
    # verl's trainer passes all sequences of the mini-batch: the empty row then dilutes the mean
    assert agg_loss(LOSS, mask, "seq-mean-token-sum", global_batch_size=2).item() == pytest.approx(
        1.5
    )


@pytest.mark.parametrize("mode", ALL_MODES)
def test_all_masked_batch_gives_zero_loss_and_zero_gradient(mode: str) -> None:
    """Deliberate difference: verl gives 0/0 = NaN here (token-mean and seq-mean modes)."""
    loss_mat = LOSS.clone().requires_grad_(True)
    loss = agg_loss(loss_mat, torch.zeros_like(MASK), mode)
    loss.backward()
    assert loss.item() == 0.0
    assert torch.equal(loss_mat.grad, torch.zeros_like(LOSS))


@pytest.mark.parametrize("mode", ALL_MODES)
def test_values_under_mask_do_not_matter(mode: str) -> None:
    garbage = LOSS.clone()
    garbage[1, 2:] = torch.tensor([float("nan"), float("inf")])
    base = LOSS.clone().requires_grad_(True)
    dirty = garbage.clone().requires_grad_(True)
    agg_loss(base, MASK, mode).backward()
    out = agg_loss(dirty, MASK, mode)
    out.backward()
    assert out.item() == pytest.approx(agg_loss(LOSS, MASK, mode).item())
    assert_close(dirty.grad, base.grad)
    assert torch.equal(dirty.grad[1, 2:], torch.zeros(2, dtype=torch.float64))


def _loop_oracle(loss_mat: torch.Tensor, mask: torch.Tensor, mode: str) -> float:
    """Plain Python version of the local-count formulas (empty batch → 0)."""
    rows = [
        [float(v) for v, m in zip(row, mrow, strict=True) if m]
        for row, mrow in zip(loss_mat, mask, strict=True)
    ]
    tokens = [v for row in rows for v in row]
    non_empty = [row for row in rows if row]
    if mode == "token-mean":
        return sum(tokens) / max(len(tokens), 1)
    if mode == "token-sum":
        return sum(tokens)
    if mode == "seq-mean-token-mean":
        return sum(sum(row) / len(row) for row in non_empty) / max(len(non_empty), 1)
    seq_mean_sum = sum(sum(row) for row in non_empty) / max(len(non_empty), 1)
    return seq_mean_sum / loss_mat.shape[-1] if mode == "seq-mean-token-sum-norm" else seq_mean_sum


@pytest.mark.parametrize("mode", ALL_MODES)
def test_matches_loop_oracle_on_random_inputs(mode: str) -> None:
    generator = torch.Generator().manual_seed(7)
    for _ in range(20):
        loss_mat = torch.randn(5, 6, generator=generator, dtype=torch.float64)
        mask = torch.rand(5, 6, generator=generator) < 0.5
        assert agg_loss(loss_mat, mask, mode).item() == pytest.approx(
            _loop_oracle(loss_mat, mask, mode), abs=1e-6
        )


def test_numpy_integer_dp_size_is_accepted() -> None:
    info = GlobalBatchInfo(dp_size=np.int64(2), batch_num_tokens=12)
    assert info.dp_size == 2 and type(info.dp_size) is int
