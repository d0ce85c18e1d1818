"""Registry-named config fields and every caller that asks a registry entry instead of the name.

Each rule is checked with a temporary entry under a name of its own, so the rule is proven to
follow the entry's declaration, not a built-in name.
"""

from __future__ import annotations

import re
import warnings

import pytest

from stages.algos.advantages import ADV_ESTIMATORS, register_adv_est
from stages.algos.kl import kl_penalty_names
from stages.algos.policy_loss_config import POLICY_LOSSES
from stages.config import ConfigError, ConfigWarning, load_config
from stages.config.checks import cross_field_problems, cross_field_warnings
from stages.config.derived import is_critic_used
from stages.engines.rollout_backends import ROLLOUT_BACKENDS, RolloutBackendSpec
from stages.engines.worker_group import WORKER_BACKENDS
from stages.rollout import needs_greedy_baseline


def _constant(token_level_rewards, response_mask, **kwargs):
    return token_level_rewards, token_level_rewards


@pytest.fixture
def estimator():
    """``register(**needs) -> name``: a temporary estimator with those needs."""
    names = []

    def register(**needs) -> str:
        name = f"test_estimator_{len(names)}"
        register_adv_est(name, **needs)(_constant)
        names.append(name)
        return name

    yield register
    for name in names:
        ADV_ESTIMATORS.remove(name)


def _load(*overrides: str):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConfigWarning)
        return load_config(None, list(overrides))


# --- names come from the registries ----------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "names"),
    [
        ("algorithm.adv_estimator", ADV_ESTIMATORS.names()),
        ("actor_rollout_ref.actor.policy_loss.loss_mode", POLICY_LOSSES.names()),
        ("algorithm.kl_penalty", kl_penalty_names()),
        ("actor_rollout_ref.actor.kl_loss_type", kl_penalty_names()),
        ("actor_rollout_ref.rollout.name", ROLLOUT_BACKENDS.names()),
        ("ppoflow.workers.backend", WORKER_BACKENDS.names()),
    ],
)
def test_every_registered_name_is_accepted_and_a_typo_lists_them(key, names) -> None:
    extra = {  # keep the config valid for the names that need more
        "grpo_passk": ["actor_rollout_ref.rollout.n=2"],
        "hf": ["actor_rollout_ref.rollout.tensor_model_parallel_size=1"],
    }
    for name in names:
        cfg = _load(f"{key}={name}", *extra.get(name, []))
        section = cfg
        for part in key.split("."):
            section = getattr(section, part)
        assert section == name
    typo = names[0] + "x"
    with pytest.raises(ConfigError) as info:
        _load(f"{key}={typo}")
    (problem,) = info.value.problems
    assert problem.startswith(f"{key}: got {typo!r}; did you mean {names[0]!r}")
    assert all(repr(name) in problem for name in names)
    assert "ppoflow.plugins" in problem


def test_a_registered_estimator_is_selectable_and_listed(estimator) -> None:
    name = estimator()
    assert _load(f"algorithm.adv_estimator={name}").algorithm.adv_estimator == name
    with pytest.raises(ConfigError, match=rf"did you mean '{name}'"):
        _load(f"algorithm.adv_estimator={name}_")


def test_an_unimplemented_verl_estimator_says_why() -> None:
    with pytest.raises(ConfigError, match=r"got 'gdpo', which is not available: GDPO .* allowed:"):
        _load("algorithm.adv_estimator=gdpo")


def test_full_kl_is_refused_with_the_reason() -> None:
    for name in ("full", "full+"):
        with pytest.raises(
            ConfigError, match=re.escape(f"got {name!r}, which is not available: it needs the full")
        ):
            _load(f"algorithm.kl_penalty={name}")


# --- callers ask the estimator's entry ---------------------------------------------------------


def test_use_critic_follows_needs_values(estimator) -> None:
    with_values, without = estimator(needs_values=True), estimator()
    assert is_critic_used(_load(f"algorithm.adv_estimator={with_values}"))
    assert _load(f"algorithm.adv_estimator={with_values}").derived.use_critic
    assert not is_critic_used(_load(f"algorithm.adv_estimator={without}"))
    assert not is_critic_used(_load("algorithm.adv_estimator=grpo"))
    assert is_critic_used(_load())  # gae, the default


def test_a_critic_free_run_of_a_values_estimator_is_an_error(estimator) -> None:
    name = estimator(needs_values=True)
    with pytest.raises(
        ConfigError,
        match=rf"critic.enable = false but algorithm.adv_estimator = '{name}' needs a critic",
    ):
        _load(f"algorithm.adv_estimator={name}", "critic.enable=false")


def test_an_unused_critic_warns_unless_the_estimator_needs_values(estimator) -> None:
    name = estimator()
    cfg = _load(f"algorithm.adv_estimator={name}", "critic.enable=true")
    assert any("values do not enter" in w for w in cross_field_warnings(cfg))
    cfg = _load(f"algorithm.adv_estimator={estimator(needs_values=True)}", "critic.enable=true")
    assert not any("values do not enter" in w for w in cross_field_warnings(cfg))


def test_a_greedy_baseline_needs_sampling_and_runs_the_baseline_stages(estimator) -> None:
    name = estimator(needs_greedy_baseline=True)
    cfg = _load(f"algorithm.adv_estimator={name}")
    assert needs_greedy_baseline(cfg)
    assert not needs_greedy_baseline(_load(f"algorithm.adv_estimator={estimator()}"))
    assert needs_greedy_baseline(_load("algorithm.adv_estimator=remax"))
    with pytest.raises(
        ConfigError, match=rf"do_sample = false but algorithm.adv_estimator = '{name}'"
    ):
        _load(f"algorithm.adv_estimator={name}", "actor_rollout_ref.rollout.do_sample=false")


def test_min_group_size_is_checked_against_rollout_n(estimator) -> None:
    name = estimator(group_based=True, min_group_size=3)
    with pytest.raises(ConfigError) as info:
        _load(f"algorithm.adv_estimator={name}", "actor_rollout_ref.rollout.n=2")
    assert "rollout.n = 2" in str(info.value) and "at least 3 samples; set n ≥ 3" in str(info.value)
    cfg = _load(f"algorithm.adv_estimator={name}", "actor_rollout_ref.rollout.n=3")
    assert not cross_field_problems(cfg)


def test_singleton_groups_warn_for_group_estimators_only(estimator) -> None:
    grouped, plain = estimator(group_based=True), estimator()
    with pytest.warns(ConfigWarning, match=f"'{grouped}' with actor_rollout_ref.rollout.n = 1"):
        load_config(None, [f"algorithm.adv_estimator={grouped}"])
    assert not any(
        "singleton" in w for w in _load(f"algorithm.adv_estimator={plain}").derived.warnings
    )


# --- the rollout backend's entry -------------------------------------------------------------


@pytest.fixture
def rollout_backend():
    ROLLOUT_BACKENDS.add(
        "test_tp2",
        RolloutBackendSpec(
            generate=lambda worker, prompts, settings: prompts,
            max_tensor_parallel_size=2,
            why_max_tensor_parallel="the test says so",
            runs_tensor_parallel=True,
            row_seeded=False,
            log_probs_are_actors=False,
        ),
    )
    yield "test_tp2"
    ROLLOUT_BACKENDS.remove("test_tp2")


def test_tensor_parallelism_is_bounded_by_the_backend_entry(rollout_backend) -> None:
    name = rollout_backend
    tp = "actor_rollout_ref.rollout.tensor_model_parallel_size"
    assert _load(f"actor_rollout_ref.rollout.name={name}", f"{tp}=2")
    with pytest.raises(
        ConfigError,
        match=rf"= 4 but rollout.name = '{name}' runs with at most 2 \(the test says so\); set it to 2 or less",
    ):
        _load(f"actor_rollout_ref.rollout.name={name}", f"{tp}=4")
    assert _load(f"{tp}=4").actor_rollout_ref.rollout.name == "vllm"  # validates (verl's)


BYPASS = "algorithm.rollout_correction.bypass_mode"


def bypass(*overrides: str) -> bool:
    tp1 = "actor_rollout_ref.rollout.tensor_model_parallel_size=1"  # the defaults' 2 is vLLM's
    return _load(tp1, *overrides).algorithm.rollout_correction.bypass_mode


def test_old_log_probs_reuse_the_rollouts_where_the_backend_says_they_are_the_actors(
    rollout_backend,
) -> None:
    assert bypass("actor_rollout_ref.rollout.name=hf") is True
    assert bypass("actor_rollout_ref.rollout.name=vllm") is False  # verl's default
    assert bypass(f"actor_rollout_ref.rollout.name={rollout_backend}") is False  # its entry
    assert bypass("actor_rollout_ref.rollout.name=hf", f"{BYPASS}=false") is False  # as written
    assert bypass("actor_rollout_ref.rollout.name=vllm", f"{BYPASS}=true") is True
