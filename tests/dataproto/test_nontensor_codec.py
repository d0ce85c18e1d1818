"""dataproto.nontensor_codec: object arrays whose rows share objects."""

from __future__ import annotations

import copy

import numpy as np

from dataproto.nontensor_codec import decode_object_array, encode_object_array


def test_rows_sharing_one_object_encode_like_rows_holding_copies():
    """repeat(n, interleave) puts the same dict in n rows; each is encoded once, same bytes."""
    base = np.array(
        [
            {"ground_truth": str(i), "extra": {"k": [1, (2, 3)], "f": float("nan")}}
            for i in range(3)
        ],
        dtype=object,
    )
    shared = np.repeat(base, 4)
    copies = np.array([copy.deepcopy(item) for item in shared], dtype=object)
    assert shared[0] is shared[1] and copies[0] is not copies[1]
    data = encode_object_array("reward_model", shared)
    assert data == encode_object_array("reward_model", copies)
    back = decode_object_array(data)
    assert back[5]["extra"]["k"] == [1, (2, 3)] and back[5]["ground_truth"] == "1"
    assert back[4] is not back[5]  # decoded rows are independent objects again
