"""DAPO's group filter (stages/algos/filter_groups.py): worked numbers, an oracle, the trim."""

from __future__ import annotations

import numpy as np
import pytest

from stages.algos.filter_groups import (
    first_groups_mask,
    group_ids,
    group_spread,
    kept_group_mask,
)


def test_worked_example_spread_zero_spread_and_singleton():
    # groups a = [1, 0] (std 0.5), b = [1, 1] (std 0), c = [0] (singleton), d = [.2, .2, .7]
    uid = np.array(["a", "a", "b", "b", "c", "d", "d", "d"], dtype=object)
    values = np.array([1.0, 0.0, 1.0, 1.0, 0.0, 0.2, 0.2, 0.7])
    std, sizes = group_spread(uid, values)
    assert sizes.tolist() == [2, 2, 1, 3]
    # d: mean 0.3667, population variance ((−.1667)² · 2 + .3333²) / 3 = 0.05556, std 0.2357
    assert std == pytest.approx([0.5, 0.0, 0.0, 0.2357], abs=1e-4)
    keep = kept_group_mask(uid, values)
    assert keep.tolist() == [True, True, False, False, True, True, True, True]


def test_groups_are_numbered_in_order_of_first_appearance_not_sorted():
    idx, sizes = group_ids(np.array(["z", "a", "z", "m"], dtype=object))
    assert idx.tolist() == [0, 1, 0, 2] and sizes.tolist() == [2, 1, 1]


def test_all_equal_groups_are_all_dropped_and_tiny_differences_kept():
    uid = np.repeat(np.arange(3), 4)
    values = np.array([0.0] * 4 + [1.0] * 4 + [1.0, 1.0, 1.0, 1.0 + 1e-9])
    assert kept_group_mask(uid, values).tolist() == [False] * 8 + [True] * 4


def test_matches_a_plain_loop_on_random_groups():
    rng = np.random.default_rng(0)
    uid = rng.integers(0, 30, size=200).astype(str).astype(object)
    values = rng.integers(0, 2, size=200).astype(float)  # 0/1 accuracies: many zero-spread groups
    expected = []
    for u in uid:
        group = values[uid == u]
        expected.append(len(group) == 1 or float(np.std(group)) > 0)
    assert kept_group_mask(uid, values).tolist() == expected


def test_trim_keeps_the_first_groups_whole():
    uid = np.array([5, 5, 7, 7, 9, 9])
    assert first_groups_mask(uid, 0).tolist() == [False] * 6
    assert first_groups_mask(uid, 3).tolist() == [True] * 6
    assert first_groups_mask(uid, 10).tolist() == [True] * 6
    with pytest.raises(ValueError, match="groups must be >= 0"):
        first_groups_mask(uid, -1)


def test_values_must_match_uid():
    with pytest.raises(ValueError, match=r"shape \(3,\)"):
        group_spread(np.array([1, 1, 2]), np.array([1.0, 2.0]))


def test_the_recipes_metric_names_read_the_sequence_score_and_an_extra():
    """``reward``, ``seq_reward`` and ``seq_final_reward`` (no KL in the reward) read Σ rm_scores;
    another name is a reward extra; a name that is neither is one error naming the extras."""
    import torch

    from dataproto import DataProto
    from dataproto import keys as K
    from stages.filter_metrics import FilterMetricError, filter_values

    batch = DataProto.from_dict(
        tensors={K.SEQ_SCORES: torch.tensor([1.0, 0.0, 0.5])},
        non_tensors={"acc": np.array([1, 0, 1], dtype=object)},
        meta_info={K.REWARD_EXTRA_KEYS: ["acc"]},
    )
    for name in ("reward", "seq_reward", "seq_final_reward"):
        assert filter_values(batch, name).tolist() == [1.0, 0.0, 0.5], name
    assert filter_values(batch, "acc").tolist() == [1.0, 0.0, 1.0]
    with pytest.raises(FilterMetricError, match=r"returned the extras \['acc'\]"):
        filter_values(batch, "pred")
