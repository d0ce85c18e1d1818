"""Learning-signal metrics (stages/metrics/signal.py): worked numbers and their denominators."""

from __future__ import annotations

import math

import numpy as np
import torch

from stages.metrics.signal import (
    GEN_ROUNDS,
    MULTI_SAMPLE_GROUPS,
    RESPONSE_SAMPLES,
    ZERO_ADV,
    ZERO_SPREAD,
    no_signal_line,
    signal_metrics,
)


def test_worked_example_with_padding_and_an_empty_response():
    uid = np.array(["a", "a", "b", "b", "c", "c", "d"], dtype=object)
    scores = torch.tensor([1.0, 0.0, 0.5, 0.5, 0.0, 0.0, 1.0])  # b and c: zero spread; d singleton
    mask = torch.tensor([[1, 1, 0]] * 6 + [[0, 0, 0]])  # row 6: no response token
    advantages = torch.tensor(
        [[0.7, 0.7, 9.0], [-0.7, -0.7, 9.0], [0.0, 0.0, 3.0], [0.0, 0.0, 0.0],
         [0.0, 0.1, 0.0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]]
    )  # fmt: skip  # values under the mask (column 2) do not count
    m = signal_metrics(uid, scores, advantages, mask, gen_rounds=3)
    assert m[MULTI_SAMPLE_GROUPS] == 3.0 and m[ZERO_SPREAD] == 2 / 3  # of a, b, c
    assert m[RESPONSE_SAMPLES] == 6.0 and m[ZERO_ADV] == 3 / 6  # rows 2, 3, 5
    assert m[GEN_ROUNDS] == 3.0
    assert m[ZERO_ADV] < 1.0


def test_denominators_of_zero_give_nan_not_an_error():
    m = signal_metrics(
        np.array([0, 1]), torch.tensor([1.0, 0.0]), torch.zeros(2, 2), torch.zeros(2, 2), 1
    )
    assert math.isnan(m[ZERO_SPREAD]) and m[MULTI_SAMPLE_GROUPS] == 0.0  # n = 1: singletons
    assert math.isnan(m[ZERO_ADV]) and m[RESPONSE_SAMPLES] == 0.0


def test_a_step_without_signal_is_named_in_one_line():
    m = signal_metrics(np.array([0, 0]), torch.ones(2), torch.zeros(2, 3), torch.ones(2, 3), 1)
    assert m[ZERO_ADV] == 1.0
    line = no_signal_line(7, m)
    assert "\n" not in line
    assert line == (
        "step 7 has no learning signal: all 2 samples have advantage 0 (1 of 1 groups have "
        "zero reward spread); the policy gradient is zero"
    )
