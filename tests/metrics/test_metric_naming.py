"""The MLflow metric-name sanitizer: valid for MLflow, reversible, injective, and a no-op on plain names."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from mlflow.utils.validation import _validate_metric_name

from stages.metrics import (
    renamed_metrics,
    restore_metric_name,
    sanitize_metric_name,
    sanitize_metrics,
)
from stages.metrics.naming import CHARACTER_CODES, MAX_NAME_LENGTH

# names biased towards the tricky characters: escapes, token look-alikes, path separators
_ALPHABET = st.sampled_from(
    [*"ab_/.@()%+=:- us", "_at_", "_us_", "_u0040_", "_sl_", "_dot_", "é", "\t", "😀"]
)
NAMES = st.lists(_ALPHABET, min_size=1, max_size=30).map("".join)


@given(NAMES)
@settings(max_examples=300, deadline=None)
def test_round_trip(name):
    assert restore_metric_name(sanitize_metric_name(name)) == name


@given(NAMES, NAMES)
@settings(max_examples=300, deadline=None)
def test_injective(first, second):
    if first != second:
        assert sanitize_metric_name(first) != sanitize_metric_name(second)


@given(st.one_of(NAMES, st.text(min_size=1, max_size=40)))
@settings(max_examples=300, deadline=None)
def test_result_is_accepted_by_mlflow(name):
    _validate_metric_name(sanitize_metric_name(name))  # raises MlflowException when refused


@pytest.mark.parametrize(
    "name",
    [
        "actor/pg_loss",
        "timing_s/gen",
        "timing_per_token_ms/update_actor",
        "critic/vf_explained_var",
        "response_length_non_aborted/clip_ratio",
        "global_seqlen/minmax_diff",
        "perf/mfu/actor_infer",
        "timing_s/agent_loop/generate_sequences",
        "val-aux/num_turns/mean",
        "a b:c-d.e",
    ],
)
def test_valid_names_are_unchanged(name):
    assert sanitize_metric_name(name) == name


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("val-core/gsm8k/acc/mean@4", "val-core/gsm8k/acc/mean_at_4"),
        ("val-aux/ds/reward/maj@16/std", "val-aux/ds/reward/maj_at_16/std"),
        ("clip(x)", "clip_lp_x_rp_"),
        ("a_at_b", "a_us_at_b"),
        ("a__at__b", "a__us_at__b"),
        ("x_at", "x_at"),
        ("/a//b/", "_sl_a_sl_/b_sl_"),
        ("a/./b/../c", "a/_dot_/b/_dot__dot_/c"),
        ("..x", "_dot_.x"),
        ("tab\there", "tab_u0009_here"),
    ],
)
def test_worked_examples(name, expected):
    assert sanitize_metric_name(name) == expected
    assert restore_metric_name(expected) == name


def test_every_named_code_round_trips():
    for char in CHARACTER_CODES:
        name = f"k{char}v{char}"
        sanitized = sanitize_metric_name(name)
        _validate_metric_name(sanitized)
        assert restore_metric_name(sanitized) == name


def test_empty_and_too_long_names_are_rejected():
    with pytest.raises(ValueError, match="non-empty"):
        sanitize_metric_name("")
    with pytest.raises(ValueError, match="250"):
        sanitize_metric_name("@" * (MAX_NAME_LENGTH // 4 + 1))


def test_dict_helpers():
    metrics = {"val-core/ds/acc/mean@4": 0.5, "actor/pg_loss": 1.0}
    assert sanitize_metrics(metrics) == {"val-core/ds/acc/mean_at_4": 0.5, "actor/pg_loss": 1.0}
    assert renamed_metrics(list(metrics)) == {"val-core/ds/acc/mean_at_4": "val-core/ds/acc/mean@4"}
