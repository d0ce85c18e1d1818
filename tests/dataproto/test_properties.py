"""Hypothesis properties of DataProto row operations (row operations' laws).

Generated batches have 1–12 rows, a tensor layer that may be absent, a non-tensor layer that may
be empty, NaNs in float tensors, and object arrays of strings.
"""

from __future__ import annotations

import numpy as np
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from dataproto import DataProto, dataproto_equal, pad_dataproto_to_divisor, unpad_dataproto

SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def dataprotos(draw, min_rows: int = 1, max_rows: int = 12) -> DataProto:
    n = draw(st.integers(min_rows, max_rows))
    has_batch = draw(st.booleans())
    has_non_tensor = draw(st.booleans()) or not has_batch
    seed = draw(st.integers(0, 2**16))
    generator = torch.Generator().manual_seed(seed)
    tensors = {}
    if has_batch:
        width = draw(st.integers(1, 4))
        values = torch.randn(n, width, generator=generator)
        values[torch.rand(n, width, generator=generator) < 0.2] = float("nan")
        tensors = {"values": values, "ids": torch.arange(n) * 10}
    non_tensors = {}
    if has_non_tensor:
        non_tensors = {
            "uid": np.array([f"p{i}" for i in range(n)], dtype=object),
            "score": np.arange(n, dtype=np.float64) / 2,
        }
    meta = draw(st.sampled_from([{}, {"temperature": 1.0}]))
    return DataProto.from_dict(tensors, non_tensors, meta)


def row_ids(data: DataProto) -> list:
    """An identifier per row (ids tensor or uid), to check row order."""
    if data.batch is not None:
        return data.batch["ids"].tolist()
    return data.non_tensor_batch["uid"].tolist()


@SETTINGS
@given(dataprotos(), st.data())
def test_concat_of_chunks_is_identity(data, draw):
    divisors = [k for k in range(1, len(data) + 1) if len(data) % k == 0]
    chunks = draw.draw(st.sampled_from(divisors), label="chunks")
    pieces = data.chunk(chunks)
    assert len(pieces) == chunks and all(p.meta_info is data.meta_info for p in pieces)
    assert dataproto_equal(DataProto.concat(data.chunk(chunks)), data)


@SETTINGS
@given(dataprotos(), st.integers(1, 6))
def test_concat_of_auto_padded_chunks_is_identity(data, chunks):
    data.meta_info["_verl_auto_padding"] = True
    try:
        pieces = data.chunk(chunks)
    except ValueError:  # torch.chunk gives fewer pieces (e.g. 5 rows into 4): a documented error
        assume(False)
    assert len(pieces) == chunks
    assert dataproto_equal(DataProto.concat(pieces), data)


@SETTINGS
@given(dataprotos(), st.integers(1, 14))
def test_concat_of_splits_is_identity(data, split_size):
    pieces = data.split(split_size)
    assert all(len(p) == split_size for p in pieces[:-1]) and 0 < len(pieces[-1]) <= split_size
    assert dataproto_equal(DataProto.concat(pieces), data)


@SETTINGS
@given(dataprotos(), st.integers(1, 10))
def test_unpad_of_pad_is_identity(data, divisor):
    padded, pad_size = pad_dataproto_to_divisor(data, divisor)
    assert len(padded) % divisor == 0 and 0 <= pad_size < divisor
    assert row_ids(padded)[len(data) :] == [row_ids(data)[i % len(data)] for i in range(pad_size)]
    assert dataproto_equal(unpad_dataproto(padded, pad_size), data)


@SETTINGS
@given(dataprotos(), st.integers(1, 4))
def test_repeat_interleave_keeps_groups_contiguous_and_tile_cycles(data, group):
    n, ids = len(data), row_ids(data)
    interleaved = row_ids(data.repeat(group, interleave=True))
    assert interleaved == [ids[i // group] for i in range(n * group)]
    tiled = data.repeat(group, interleave=False)
    assert row_ids(tiled) == ids * group
    for copy_index in range(group):
        block = tiled[copy_index * n : (copy_index + 1) * n]
        assert dataproto_equal(block, data)


@SETTINGS
@given(dataprotos(), st.randoms(use_true_random=False))
def test_select_permutation_then_inverse_is_identity(data, rng):
    perm = list(range(len(data)))
    rng.shuffle(perm)
    inverse = np.argsort(perm)
    assert dataproto_equal(data.select_idxs(perm).select_idxs(inverse), data)
    assert dataproto_equal(data.select_idxs(torch.tensor(perm))[inverse], data)


@SETTINGS
@given(dataprotos(), st.data())
def test_select_idxs_matches_numpy_fancy_indexing(data, draw):
    n = len(data)
    index = draw.draw(st.lists(st.integers(-n, n - 1), max_size=2 * n), label="index")
    mask = np.array(draw.draw(st.lists(st.booleans(), min_size=n, max_size=n), label="mask"))
    by_position = np.arange(n)[np.array(index, dtype=np.int64)]  # numpy's own fancy indexing
    by_mask = np.arange(n)[mask]
    cases = [
        (index, by_position),
        (np.array(index, dtype=np.int64), by_position),
        (mask, by_mask),
        (torch.from_numpy(mask), by_mask),
    ]
    for selector, expected in cases:
        picked = data.select_idxs(selector)
        assert len(picked) == len(expected)
        if data.batch is not None:
            for key, tensor in data.batch.items():
                reference = tensor.numpy()[expected]
                np.testing.assert_array_equal(picked.batch[key].numpy(), reference)
        for key, array in data.non_tensor_batch.items():
            np.testing.assert_array_equal(picked.non_tensor_batch[key], array[expected])
