"""One source of defaults: the settings the math and engines read come from the schema.

The settings dataclasses carry no defaults of their own; the verl-style readers (plain mappings,
as verl users pass) fall back to the schema's defaults; and the engine-walk settings that still
have constructor defaults for tests (PPOUpdateSettings, MicroBatching) agree with the schema.
"""

from __future__ import annotations

import dataclasses

import pytest

from stages.algos.actor_loss import ActorLossTerms
from stages.algos.config_view import algorithm_defaults, read_field
from stages.algos.kl_control import get_kl_controller
from stages.algos.policy_loss_config import PolicyLossSettings, resolve_policy_loss_config
from stages.config import PPORunConfig, load_config
from stages.config.schema_actor import ActorConfig
from stages.config.schema_algorithm import AlgorithmConfig
from stages.engines.actor import PPOUpdateSettings
from stages.engines.batching import MicroBatching
from stages.engines.critic import ValueLossSettings

SETTINGS = [PolicyLossSettings, ActorLossTerms, ValueLossSettings]


@pytest.mark.parametrize("settings", SETTINGS, ids=lambda s: s.__name__)
def test_settings_have_no_defaults_of_their_own(settings: type) -> None:
    with_default = [
        f.name
        for f in dataclasses.fields(settings)
        if f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
    ]
    assert with_default == [], f"{settings.__name__} has defaults for {with_default}"


def test_each_settings_field_is_a_schema_field() -> None:
    actor = ActorConfig()
    for name in (f.name for f in dataclasses.fields(PolicyLossSettings)):
        if name != "global_batch_info":
            assert hasattr(actor, name) or hasattr(actor.policy_loss, name), name
    for name in (f.name for f in dataclasses.fields(ActorLossTerms)):
        assert hasattr(actor, name), name
    critic = PPORunConfig().critic
    for name in (f.name for f in dataclasses.fields(ValueLossSettings)):
        assert hasattr(critic, name), name


def test_verl_style_fallbacks_are_the_schema_defaults() -> None:
    cfg = PPORunConfig()
    actor = cfg.actor_rollout_ref.actor
    assert resolve_policy_loss_config({}) == PolicyLossSettings.from_actor(ActorConfig())
    assert resolve_policy_loss_config(None).clip_low == actor.clip_ratio_low  # 0.2 = clip_ratio
    assert ActorLossTerms.resolve({}) == ActorLossTerms.from_actor(actor)
    assert ValueLossSettings.resolve({}) == ValueLossSettings.from_critic(cfg.critic)
    assert ValueLossSettings.resolve({}).loss_agg_mode == actor.loss_agg_mode  # inherited
    for name, value in algorithm_defaults().items():
        assert read_field(None, name) == value
        assert read_field({}, name) == value


def test_algorithm_defaults_are_read_from_the_schema() -> None:
    schema = AlgorithmConfig()
    expected = {
        "gamma": schema.gamma,
        "lam": schema.lam,
        "norm_adv_by_std_in_grpo": schema.norm_adv_by_std_in_grpo,
        "type": schema.kl_ctrl.type,
        "kl_coef": schema.kl_ctrl.kl_coef,
        "horizon": schema.kl_ctrl.horizon,
        "target_kl": schema.kl_ctrl.target_kl,
    }
    assert {k: algorithm_defaults()[k] for k in expected} == expected
    controller = get_kl_controller({})  # verl's dict API: the schema's fixed β
    assert controller.value == schema.kl_ctrl.kl_coef


def test_typed_slices_are_read_whole() -> None:
    cfg = load_config(
        None,
        [
            "actor_rollout_ref.actor.clip_ratio_c=4.0",
            "actor_rollout_ref.actor.policy_loss.loss_mode=gspo",
            "actor_rollout_ref.actor.entropy_coeff=0.01",
            "critic.cliprange_value=0.25",
        ],
    )
    actor = cfg.actor_rollout_ref.actor
    settings = resolve_policy_loss_config(actor)
    assert (settings.clip_ratio_c, settings.loss_mode) == (4.0, "gspo")
    assert ActorLossTerms.resolve(actor).entropy_coeff == 0.01
    assert ValueLossSettings.resolve(cfg.critic).cliprange_value == 0.25


def test_value_settings_need_a_filled_critic_slice() -> None:
    from stages.config.schema_critic import CriticConfig

    with pytest.raises(ValueError, match=r"critic\.loss_agg_mode is null"):
        ValueLossSettings.from_critic(CriticConfig())


def _schema_value(cfg: PPORunConfig, role: str, name: str) -> object:
    section = cfg.actor_rollout_ref.actor if role == "actor" else cfg.critic
    return getattr(section, name)


# (settings class, field) -> the filled default config key it mirrors
ENGINE_DEFAULTS = {
    (PPOUpdateSettings, "epochs"): "ppo_epochs",
    (PPOUpdateSettings, "shuffle"): "shuffle",
    (PPOUpdateSettings, "seed"): "data_loader_seed",
    (PPOUpdateSettings, "loss_scale_factor"): "loss_scale_factor",
    (MicroBatching, "use_dynamic_bsz"): "use_dynamic_bsz",
    (MicroBatching, "max_token_len"): "ppo_max_token_len_per_gpu",
}


@pytest.mark.parametrize(("owner", "field"), sorted(ENGINE_DEFAULTS, key=str))
def test_engine_walk_defaults_agree_with_the_schema(owner: type, field: str) -> None:
    """A constructor default left for tests must be the actor's schema default."""
    default = next(f.default for f in dataclasses.fields(owner) if f.name == field)
    assert default == _schema_value(PPORunConfig(), "actor", ENGINE_DEFAULTS[owner, field])


def test_every_engine_walk_default_is_checked() -> None:
    for owner in (PPOUpdateSettings, MicroBatching):
        defaulted = {
            f.name
            for f in dataclasses.fields(owner)
            if f.default is not dataclasses.MISSING and f.name != "micro_batch_size"
        }
        assert defaulted == {f for o, f in ENGINE_DEFAULTS if o is owner}, owner.__name__
