"""The estimator registry and its verl-compatible API."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.testing import assert_close

from stages.algos import advantages as adv_module
from stages.algos.advantages import (
    ADV_ESTIMATORS,
    AdvantageEstimator,
    EstimatorSpec,
    get_adv_estimator_fn,
    get_adv_estimator_spec,
    register_adv_est,
)

IMPLEMENTED = {
    "gae",
    "grpo",
    "grpo_vectorized",
    "grpo_passk",
    "rloo",
    "rloo_vectorized",
    "opo",
    "reinforce_plus_plus",
    "reinforce_plus_plus_baseline",
    "remax",
    "gpg",
}


def test_every_spec_estimator_is_registered_under_verl_names():
    assert set(ADV_ESTIMATORS.names()) >= IMPLEMENTED
    for member in AdvantageEstimator:
        if member.value in IMPLEMENTED:
            assert get_adv_estimator_fn(member) is get_adv_estimator_fn(member.value)
    assert AdvantageEstimator.GRPO == "grpo"


def test_unknown_name_lists_known_ones_and_is_both_key_and_value_error():
    for error in (KeyError, ValueError):
        with pytest.raises(error, match=r"unknown advantage estimator 'GAE'; known: \[.*'gae'"):
            get_adv_estimator_fn("GAE")  # lookup is case-sensitive, as in verl


def test_verl_estimators_not_ported_say_so():
    with pytest.raises(NotImplementedError, match="gdpo"):
        get_adv_estimator_fn(AdvantageEstimator.GDPO)


def test_register_adv_est_rejects_a_second_function_and_accepts_enum():
    with pytest.raises(ValueError, match="already registered"):
        register_adv_est(AdvantageEstimator.GRPO)(lambda **kwargs: None)


def test_every_entry_has_the_uniform_signature():
    rewards = torch.tensor([[0.0, 1.0], [0.0, 0.0], [1.0, 0.0], [0.0, 0.5]])
    mask = torch.ones(4, 2)
    inputs = dict(
        index=np.array(["a", "a", "b", "b"], dtype=object),
        values=torch.zeros(4, 2),
        reward_baselines=torch.zeros(4),
        config={"gamma": 1.0, "lam": 1.0},
    )
    for name in IMPLEMENTED:
        advantages, returns = ADV_ESTIMATORS.get(name).fn(rewards, mask, **inputs)
        assert advantages.shape == returns.shape == (4, 2), name


@pytest.mark.parametrize(
    ("name", "missing", "key"),
    [
        ("gae", "values", "values"),
        ("grpo", "index", "uid"),
        ("rloo", "index", "uid"),
        ("remax", "reward_baselines", "reward_baselines"),
    ],
)
def test_missing_inputs_name_the_estimator_and_key(name, missing, key):
    inputs = dict(index=np.array([0, 0]), values=torch.zeros(2, 2), reward_baselines=torch.zeros(2))
    inputs[missing] = None
    with pytest.raises(KeyError, match=rf"estimator '{name}' needs '{key}'"):
        ADV_ESTIMATORS.get(name).fn(torch.zeros(2, 2), torch.ones(2, 2), **inputs)


def test_grpo_entry_reads_the_norm_flag_from_config():
    rewards, mask, index = torch.tensor([[1.0], [0.0]]), torch.ones(2, 1), np.array([0, 0])
    entry = ADV_ESTIMATORS.get("grpo").fn
    assert_close(
        entry(rewards, mask, index=index, config={"norm_adv_by_std_in_grpo": False})[0],
        torch.tensor([[0.5], [-0.5]]),
    )
    assert_close(
        entry(rewards, mask, index=index)[0], torch.tensor([[0.7071], [-0.7071]]), atol=1e-4, rtol=0
    )


def test_gae_entry_reads_gamma_lam_from_a_config_object():
    class AlgoConfig:  # any object with verl's attribute names
        gamma, lam = 0.5, 1.0

    rewards, values, mask = (
        torch.tensor([[0.0, 0.0, 1.0], [0.0, 1.0, 0.0]]),
        torch.zeros(2, 3),
        torch.ones(2, 3),
    )
    _, returns = ADV_ESTIMATORS.get("gae").fn(rewards, mask, values=values, config=AlgoConfig())
    assert_close(returns, torch.tensor([[0.25, 0.5, 1.0], [0.5, 1.0, 0.0]]))


def test_verl_public_names_exist():
    for name in (
        "compute_gae_advantage_return",
        "compute_grpo_outcome_advantage",
        "compute_grpo_vectorized_outcome_advantage",
        "compute_grpo_passk_outcome_advantage",
        "compute_rloo_outcome_advantage",
        "compute_rloo_vectorized_outcome_advantage",
        "compute_opo_outcome_advantage",
        "compute_reinforce_plus_plus_outcome_advantage",
        "compute_reinforce_plus_plus_baseline_outcome_advantage",
        "compute_remax_outcome_advantage",
        "compute_gpg_outcome_advantage",
        "register_adv_est",
        "get_adv_estimator_fn",
        "AdvantageEstimator",
    ):
        assert callable(getattr(adv_module, name)), name


# --- the entries' declared needs ------------------------------------------------------------------

#: name -> (needs_values, group_based, needs_greedy_baseline, min_group_size)
DECLARED_NEEDS = {
    "gae": (True, False, False, 1),
    "grpo": (False, True, False, 1),
    "grpo_vectorized": (False, True, False, 1),
    "grpo_passk": (False, True, False, 2),
    "rloo": (False, True, False, 1),
    "rloo_vectorized": (False, True, False, 1),
    "opo": (False, True, False, 1),
    "gpg": (False, True, False, 1),
    "reinforce_plus_plus_baseline": (False, True, False, 1),
    "reinforce_plus_plus": (False, False, False, 1),
    "remax": (False, False, True, 1),
}


@pytest.mark.parametrize("name", sorted(DECLARED_NEEDS))
def test_each_builtin_entry_declares_its_needs(name):
    spec = ADV_ESTIMATORS.get(name)
    assert isinstance(spec, EstimatorSpec)
    needs = (spec.needs_values, spec.group_based, spec.needs_greedy_baseline, spec.min_group_size)
    assert needs == DECLARED_NEEDS[name]
    assert get_adv_estimator_spec(name) is spec and get_adv_estimator_fn(name) is spec.fn


def test_declared_needs_match_what_the_estimators_read():
    """An entry that does not declare values / uid / baselines runs without them."""
    rewards, mask = torch.tensor([[0.0, 1.0], [1.0, 0.0]]), torch.ones(2, 2)
    full = dict(
        index=np.array(["a", "a"], dtype=object),
        values=torch.zeros(2, 2),
        reward_baselines=torch.zeros(2),
    )
    for name, spec in ((n, ADV_ESTIMATORS.get(n)) for n in DECLARED_NEEDS):
        inputs = {
            "index": full["index"] if spec.group_based else None,
            "values": full["values"] if spec.needs_values else None,
            "reward_baselines": full["reward_baselines"] if spec.needs_greedy_baseline else None,
        }
        advantages, _ = spec.fn(rewards, mask, **inputs)
        assert advantages.shape == (2, 2), name


def test_register_adv_est_records_the_needs_and_returns_the_function():
    def mine(token_level_rewards, response_mask, **kwargs):
        return token_level_rewards, token_level_rewards

    try:
        assert register_adv_est("test_needs", group_based=True, min_group_size=3)(mine) is mine
        spec = ADV_ESTIMATORS.get("test_needs")
        assert (spec.fn, spec.group_based, spec.min_group_size, spec.needs_values) == (
            mine,
            True,
            3,
            False,
        )
    finally:
        ADV_ESTIMATORS.remove("test_needs")


def test_spec_rejects_a_group_size_without_groups():
    with pytest.raises(ValueError, match="min_group_size = 2"):
        EstimatorSpec(fn=lambda **kwargs: None, min_group_size=2)
    with pytest.raises(ValueError, match="min_group_size = 0"):
        EstimatorSpec(fn=lambda **kwargs: None, group_based=True, min_group_size=0)
