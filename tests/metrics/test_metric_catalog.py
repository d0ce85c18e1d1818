"""Every metric this package emits, and every data metric verl's trainer logs, has a description with a denominator."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from stages.metrics import (
    METRICS,
    compute_data_metrics,
    compute_throughput_metrics,
    compute_timing_metrics,
    describe_metric,
    escape_markdown_table,
    markdown_table,
    process_validation_metrics,
    sanitize_metric_name,
    split_val_core_aux,
)
from stages.metrics.catalog import find_metric_doc

# every timer name of verl 0.9.1's legacy step
TIMERS = [
    "start_profile",
    "gen",
    "step",
    "reward",
    "old_log_prob",
    "ref",
    "values",
    "adv",
    "update_critic",
    "update_actor",
    "save_checkpoint",
    "update_weights",
    "dump_rollout_generations",
    "testing",
    "stop_profile",
    "agent_loop/generate_sequences",
]

# keys produced by other stages (verl's data metrics) that the catalog must also explain
OTHER_KEYS = [
    "actor/pg_loss",
    "actor/pg_clipfrac",
    "actor/pg_clipfrac_lower",
    "actor/ppo_kl",
    "actor/entropy",
    "actor/kl_loss",
    "actor/kl_coef",
    "actor/grad_norm",
    "actor/lr",
    "actor/reward_kl_penalty",
    "actor/reward_kl_penalty_coeff",
    "critic/vf_loss",
    "critic/vf_clipfrac",
    "critic/vpred_mean",
    "critic/grad_norm",
    "global_seqlen/min",
    "global_seqlen/max",
    "global_seqlen/minmax_diff",
    "global_seqlen/balanced_min",
    "global_seqlen/balanced_max",
    "global_seqlen/mean",
    "reward/error_count",
    "reward/timeout_count",
    "reward/invalid_count",
    "training/global_step",
    "training/epoch",
    "perf/mfu/actor",
    "perf/mfu/critic",
    "perf/mfu/actor_infer",
]


def _emitted_keys(batch) -> list[str]:
    batch.meta_info["global_token_num"] = [5, 6, 7, 8]
    timing_raw = dict.fromkeys(TIMERS, 1.0)
    keys = list(compute_data_metrics(batch)) + list(compute_timing_metrics(batch, timing_raw))
    keys += list(compute_throughput_metrics(batch, timing_raw, n_gpus=2))
    validation = process_validation_metrics(
        ["openai/gsm8k"] * 8 + ["math"] * 2,
        ["a"] * 8 + ["b"] * 2,
        {
            "reward": list(np.linspace(0, 1, 10)),
            "acc": [1, 0] * 4 + [None, None],
            "pred": ["1", "2", "1", "3", "1", "2", "2", "1", "x", "y"],
        },
    )
    return keys + list(split_val_core_aux(validation, sample_turns=np.array([1, 2])))


def test_every_emitted_key_is_described(batch):
    keys = _emitted_keys(batch)
    assert len(keys) > 100
    undescribed = [key for key in keys if find_metric_doc(key) is None]
    assert undescribed == []


@pytest.mark.parametrize("key", OTHER_KEYS)
def test_other_stages_keys_are_described(key):
    description = describe_metric(key)
    what, denominator = description.split(" Denominator: ")
    assert what and denominator


def test_descriptions_state_a_denominator():
    for pattern in METRICS.names():
        doc = METRICS.get(pattern)
        assert doc.what.strip() and doc.denominator.strip() and doc.emitted_by.strip(), pattern


def test_std_description_contrasts_population_and_sample_std():
    description = describe_metric("val-aux/gsm8k/acc/std@8")
    assert "ddof = 0" in description and "ddof = 1" in description


def test_specific_families_are_not_swallowed_by_generic_ones():
    assert describe_metric("timing_per_token_ms/gen") != describe_metric("timing_s/gen")
    assert "Response length" in describe_metric("response_length_non_aborted/clip_ratio")
    assert find_metric_doc("timing_per_token_ms/reward") is None  # reward has no per-token timing
    assert find_metric_doc("critic/score/median") is None


def test_sanitized_names_are_described_too():
    name = "val-core/openai/gsm8k/acc/maj@8/mean"
    assert describe_metric(sanitize_metric_name(name)) == describe_metric(name)


def test_unknown_metric_error_names_it():
    with pytest.raises(KeyError, match="'actor/mystery'"):
        describe_metric("actor/mystery")


def test_markdown_table_lists_every_pattern():
    table = markdown_table()
    rows = table.splitlines()[2:]
    assert len(rows) == len(METRICS)
    for pattern in METRICS.names():
        assert f"`{pattern}`" in table


def test_docs_page_carries_the_current_tables():
    docs = (Path(__file__).resolve().parents[2] / "docs" / "metrics.md").read_text(encoding="utf-8")
    assert markdown_table() in docs, (
        "docs/metrics.md is stale: paste stages.metrics.markdown_table()"
    )
    assert escape_markdown_table() in docs, (
        "docs/metrics.md is stale: paste escape_markdown_table()"
    )
