"""Every ``rollout_corr/*`` metric the rollout correction emits has a catalog entry with its
denominator, and the step-metric lists name the decoupled stages' metrics."""

from __future__ import annotations

import pytest
import torch

from stages.algos.rollout_correction import (
    ROLLOUT_IS_MODES,
    ROLLOUT_RS_OPTIONS,
    compute_rollout_correction,
)
from stages.metrics.catalog import PLACEHOLDERS, find_metric_doc, step_metric_names

TRAIN = torch.tensor([[-0.9, -0.7, -1.6], [-0.3, -0.8, 0.0]])
ROLLOUT = torch.tensor([[-1.0, -0.5, -2.0], [-0.3, -2.0, 0.0]])
MASK = torch.tensor([[1, 1, 1], [1, 1, 0]])


def emitted(settings: dict) -> list[str]:
    return list(compute_rollout_correction(TRAIN, ROLLOUT, MASK, settings).metrics)


def every_emitted_name() -> set[str]:
    names: set[str] = set()
    for mode in ROLLOUT_IS_MODES.names():
        for threshold in (2.0, "0.5_2.0"):
            names |= set(
                emitted(
                    {
                        "rollout_is": mode,
                        "rollout_is_threshold": threshold,
                        "rollout_is_batch_normalize": True,
                    }
                )
            )
    options = ",".join(ROLLOUT_RS_OPTIONS.names())
    names |= set(emitted({"rollout_rs": options, "rollout_rs_threshold": 2.0}))
    return names


def test_the_catalog_lists_the_registered_rejection_options():
    assert sorted(PLACEHOLDERS["rs_option"].split("|")) == ROLLOUT_RS_OPTIONS.names()


def test_every_emitted_rollout_corr_metric_is_described():
    names = every_emitted_name()
    assert len(names) > 150  # 11 options × 16 statistics, the IS and mismatch metrics
    undescribed = sorted(name for name in names if find_metric_doc(name) is None)
    assert undescribed == []
    for name in names:
        doc = find_metric_doc(name)
        assert doc.denominator and "rollout_correction" in doc.emitted_by, name


@pytest.mark.parametrize(
    ("name", "denominator"),
    [
        ("rollout_corr/rollout_is_mean", "response tokens"),
        ("rollout_corr/rollout_is_seq_max_deviation", "non-empty responses"),
        ("rollout_corr/rollout_rs_token_k1_max", "response tokens (token_* options)"),
        ("rollout_corr/rollout_rs_seq_sum_k2_seq_fraction_high", "non-empty responses"),
        ("rollout_corr/rollout_rs_seq_masked_fraction", "non-empty responses"),
        ("rollout_corr/training_ppl", "non-empty responses"),
        ("rollout_corr/kl", "response tokens"),
    ],
)
def test_denominators_say_tokens_or_responses(name, denominator):
    assert find_metric_doc(name).denominator.startswith(denominator)


def test_step_metric_names_of_the_decoupled_stages():
    common = dict(
        use_critic=False,
        use_reference_policy=False,
        balance_batch=True,
        use_kl_in_reward=False,
        use_kl_loss=False,
    )
    plain = set(step_metric_names(**common))
    assert not any(name.startswith("rollout_corr/") for name in plain)
    metrics_only = set(step_metric_names(**common, rollout_correction=True)) - plain
    assert {
        "timing_s/rollout_correction",
        "rollout_corr/kl",
        "rollout_corr/chi2_seq",
    } <= metrics_only
    assert {"rollout_corr/training_ppl", "rollout_corr/log_ppl_diff_min"} <= metrics_only
    weighted = set(step_metric_names(**common, rollout_correction=True, rollout_is=True))
    assert {"timing_s/rollout_is", "rollout_corr/rollout_is_eff_sample_size"} <= weighted
    emitted_is = {
        n for n in emitted({"rollout_is": "token"}) if n.startswith("rollout_corr/rollout_is_")
    }
    assert emitted_is <= weighted  # every IS metric of a plain TIS run is listed
