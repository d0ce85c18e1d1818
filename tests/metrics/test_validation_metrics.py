"""process_validation_metrics, bootstrap, majority vote and the val-core / val-aux split."""

from __future__ import annotations

import numpy as np
import pytest

from stages.metrics import (
    bootstrap_metric,
    calc_maj_val,
    process_validation_metrics,
    split_val_core_aux,
)
from stages.metrics.validation import majority_values, resample_indices, resample_sizes


def _one_prompt(values, **extra):
    n = len(values)
    return process_validation_metrics(["ds"] * n, ["q"] * n, {"acc": values, **extra})["ds"]


def _loop_oracle(values, preds, k, seed=42):
    """verl's loop: reseed the global RNG, resample, reduce each resample in Python."""
    np.random.seed(seed)
    indices = np.random.choice(len(values), size=(1000, k), replace=True)
    best = [max(values[i] for i in row) for row in indices]
    worst = [min(values[i] for i in row) for row in indices]
    maj = [
        calc_maj_val([{"pred": preds[i], "val": values[i]} for i in row], "pred", "val")
        for row in indices
    ]
    return {
        name: (np.mean(x), np.std(x))
        for name, x in [("best", best), ("worst", worst), ("maj", maj)]
    }


def test_n_equals_one_gives_only_mean():
    assert _one_prompt([1.0]) == {"acc": {"mean@1": 1.0}}


def test_n_equals_four_key_set():
    keys = set(_one_prompt([1.0, 0.0, 1.0, 0.0])["acc"])
    bootstrap = {
        f"{kind}@{k}/{stat}"
        for kind in ["best", "worst"]
        for k in [2, 4]
        for stat in ["mean", "std"]
    }
    assert keys == {"mean@4", "std@4"} | bootstrap


def test_std_is_the_population_std():
    metrics = _one_prompt([1, 0, 1, 1, 0])["acc"]
    assert metrics["std@5"] == pytest.approx(0.4899, abs=1e-4)  # sqrt(0.24); ddof=1 would be 0.5477
    assert metrics["mean@5"] == pytest.approx(0.6)
    assert {key.split("/")[0] for key in metrics if "@" in key} >= {"best@2", "best@4", "best@5"}


def test_resample_sizes():
    assert [resample_sizes(n) for n in [0, 1, 2, 3, 8, 9]] == [
        [],
        [],
        [2],
        [2, 3],
        [2, 4, 8],
        [2, 4, 8, 9],
    ]


def test_bootstrap_matches_verl_loop_with_global_seed():
    values = [0.0, 1.0, 0.5, 1.0, 0.0, 0.25]
    preds = ["a", "b", "a", "c", "b", "a"]
    metrics = _one_prompt(values, pred=preds)["acc"]
    for k in resample_sizes(len(values)):
        oracle = _loop_oracle(values, preds, k)
        for name, (mean, std) in oracle.items():
            assert metrics[f"{name}@{k}/mean"] == pytest.approx(mean, abs=1e-12)
            assert metrics[f"{name}@{k}/std"] == pytest.approx(std, abs=1e-12)


def test_bootstrap_is_deterministic_and_leaves_global_rng_alone():
    np.random.seed(7)
    expected_next = np.random.rand()
    np.random.seed(7)
    first = bootstrap_metric([0.1, 0.9, 0.4], 2, [np.max, np.min])
    assert np.random.rand() == expected_next  # the global stream was not reseeded
    assert bootstrap_metric([0.1, 0.9, 0.4], 2, [np.max, np.min]) == first
    assert bootstrap_metric([0.1, 0.9, 0.4], 2, [np.max], seed=1) != first[:1]


def test_bootstrap_generic_reducers_agree_with_vectorized_max():
    values = np.array([3.0, 1.0, 4.0, 1.0, 5.0])
    [(mean, std)] = bootstrap_metric(list(values), 3, [np.max])
    drawn = values[resample_indices(5, 3, 1000, 42)].max(axis=1)
    assert (mean, std) == (pytest.approx(drawn.mean()), pytest.approx(drawn.std()))


def test_majority_tie_goes_to_first_inserted():
    data = [
        {"pred": "x", "val": 0.0},
        {"pred": "y", "val": 1.0},
        {"pred": "y", "val": 2.0},
        {"pred": "x", "val": 3.0},
    ]
    assert calc_maj_val(data, "pred", "val") == 0.0
    assert calc_maj_val(data[1:], "pred", "val") == 1.0


def test_vectorized_majority_matches_calc_maj_val_on_random_resamples():
    rng = np.random.default_rng(0)
    for _ in range(20):
        n, k = int(rng.integers(2, 9)), int(rng.integers(1, 9))
        values = rng.random(n)
        preds = [int(p) for p in rng.integers(0, 3, n)]
        indices = rng.integers(0, n, size=(50, k))
        expected = [
            calc_maj_val([{"p": preds[i], "v": values[i]} for i in row], "p", "v")
            for row in indices
        ]
        np.testing.assert_array_equal(majority_values(values, preds, indices), expected)


def test_maj_needs_a_complete_pred_list():
    assert "maj@2/mean" in _one_prompt([1.0, 0.0], pred=["a", "b"])["acc"]
    assert "maj@2/mean" not in _one_prompt([1.0, 0.0], pred=["a", None])["acc"]


def test_none_dropped_strings_skipped_and_averaged_over_uids():
    result = process_validation_metrics(
        ["ds", "ds", "ds", "ds", "other"],
        ["u1", "u1", "u2", "u2", "u3"],
        {"acc": [1.0, None, 0.0, 1.0, 0.0], "answer": ["a", "b", "c", "d", "e"]},
    )
    assert set(result) == {"ds", "other"}
    assert "answer" not in result["ds"]
    # u1 has one value (mean@1 = 1), u2 two (mean@2 = 0.5): each name averages its own uids
    assert result["ds"]["acc"]["mean@1"] == 1.0
    assert result["ds"]["acc"]["mean@2"] == 0.5
    assert result["other"]["acc"] == {"mean@1": 0.0}


def test_expected_acc_counts_pads_missing_sessions_with_zero():
    result = process_validation_metrics(
        ["ds", "ds", "rm"],
        ["u1", "u1", "u9"],
        {"acc": [1.0, 1.0, None], "reward": [1.0, 1.0, 0.3]},
        expected_acc_counts={("ds", "u1"): 4, ("rm", "u9"): 2},
    )
    assert result["ds"]["acc"]["mean@4"] == 0.5
    assert result["ds"]["acc_success_only"]["mean@2"] == 1.0
    assert "acc_success_only" not in result["rm"]


def test_column_length_mismatch_names_the_column():
    with pytest.raises(ValueError, match="'acc' has 1 entries, expected 2"):
        process_validation_metrics(["ds", "ds"], ["u", "u"], {"acc": [1.0]})


def test_non_numeric_values_name_the_variable():
    with pytest.raises(TypeError, match="ds/u/acc"):
        process_validation_metrics(["ds", "ds"], ["u", "u"], {"acc": [1.0, [1, 2]]})


def test_val_core_aux_split():
    metrics = process_validation_metrics(
        ["gsm8k"] * 4 + ["math"] * 2,
        ["a"] * 4 + ["b"] * 2,
        {
            "reward": [1, 0, 1, 1, 0.5, 0.0],
            "acc": [1, 0, 1, 1, None, None],
            "pred": ["1", "2", "1", "1", "x", "y"],
        },
    )
    flat = split_val_core_aux(metrics, sample_turns=np.array([1, 3, 2]))
    core = {key for key in flat if key.startswith("val-core/")}
    assert core == {
        "val-core/gsm8k/acc/mean@4",
        "val-core/gsm8k/acc/best@4/mean",
        "val-core/gsm8k/acc/best@4/std",
        "val-core/gsm8k/acc/maj@4/mean",
        "val-core/gsm8k/acc/maj@4/std",
        # math has no acc values, so its core variable is reward
        "val-core/math/reward/mean@2",
        "val-core/math/reward/best@2/mean",
        "val-core/math/reward/best@2/std",
        "val-core/math/reward/maj@2/mean",
        "val-core/math/reward/maj@2/std",
    }
    for key in [
        "val-aux/gsm8k/acc/std@4",
        "val-aux/gsm8k/acc/best@2/mean",
        "val-aux/gsm8k/acc/worst@4/mean",
        "val-aux/gsm8k/reward/mean@4",
    ]:
        assert key in flat
    assert (
        flat["val-aux/num_turns/min"],
        flat["val-aux/num_turns/max"],
        flat["val-aux/num_turns/mean"],
    ) == (1.0, 3.0, 2.0)
    assert len(flat) == len(core) + sum(1 for key in flat if key.startswith("val-aux/"))


def test_bootstrap_over_tuples_keeps_them_whole():
    [(mean, std)] = bootstrap_metric(
        [(0.0, "a"), (1.0, "b")], 1, [lambda sample: sample[0][0]], n_bootstrap=50
    )
    assert 0.0 < mean < 1.0 and std > 0.0
