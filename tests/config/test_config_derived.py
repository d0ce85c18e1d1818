"""Derived flags and sizes (verl's use_critic / use_reference_policy / use_rm), steps, warnings."""

from __future__ import annotations

import warnings

import pytest

from stages.config import ConfigError, ConfigWarning, load_config


@pytest.mark.parametrize(
    "overrides, use_critic",
    [
        ([], True),  # gae, enable null
        (["algorithm.adv_estimator=grpo", "actor_rollout_ref.rollout.n=2"], False),
        (
            ["algorithm.adv_estimator=grpo", "actor_rollout_ref.rollout.n=2", "critic.enable=true"],
            True,
        ),
        (["critic.enable=true"], True),
        (["algorithm.adv_estimator=reinforce_plus_plus", "critic.enable=false"], False),
    ],
)
def test_use_critic(overrides: list[str], use_critic: bool) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConfigWarning)
        assert load_config(None, overrides).derived.use_critic is use_critic


@pytest.mark.parametrize(
    "overrides, use_ref",
    [
        ([], False),
        (["actor_rollout_ref.actor.use_kl_loss=true"], True),
        (["algorithm.use_kl_in_reward=true"], True),
        (["algorithm.use_kl_in_reward=true", "actor_rollout_ref.actor.use_kl_loss=true"], True),
    ],
)
def test_use_reference_policy(overrides: list[str], use_ref: bool) -> None:
    assert load_config(None, overrides).derived.use_reference_policy is use_ref


def test_use_rm() -> None:
    assert load_config(None).derived.use_rm is False
    cfg = load_config(
        None, ["reward.reward_model.enable=true", "reward.reward_model.model_path=rm"]
    )
    assert cfg.derived.use_rm is True


def test_batch_sizes_in_sequences() -> None:
    cfg = load_config(
        None,
        [
            "data.train_batch_size=32",
            "actor_rollout_ref.rollout.n=4",
            "actor_rollout_ref.actor.ppo_mini_batch_size=8",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
            "critic.ppo_mini_batch_size=16",
            "trainer.n_gpus_per_node=2",
            "trainer.nnodes=2",
        ],
    )
    d = cfg.derived
    assert d.dp_size == 4
    assert d.rollout_batch_size == 128  # 32 prompts × 4
    assert d.actor_mini_batch_size == 32 and d.actor_mini_batch_size_per_rank == 8
    assert d.actor_mini_batches_per_epoch == 4 and d.actor_grad_accum_steps == 4
    assert d.critic_mini_batch_size == 64 and d.critic_mini_batch_size_per_rank == 16
    assert cfg.critic.ppo_micro_batch_size_per_gpu == 16 and d.critic_grad_accum_steps == 1
    # log-prob passes default to the actor's micro-batch size
    assert cfg.actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu == 2
    assert cfg.actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu == 2


def test_dynamic_batching_has_no_grad_accum_count() -> None:
    cfg = load_config(
        None, ["actor_rollout_ref.actor.use_dynamic_bsz=true", "critic.use_dynamic_bsz=false"]
    )
    assert cfg.derived.actor_grad_accum_steps is None and cfg.derived.critic_grad_accum_steps == 1
    assert cfg.actor_rollout_ref.rollout.log_prob_use_dynamic_bsz is True


def test_inherited_keys_are_filled() -> None:
    cfg = load_config(
        None,
        [
            "data.max_prompt_length=100",
            "data.max_response_length=50",
            "actor_rollout_ref.model.path=m",
            "actor_rollout_ref.actor.clip_ratio=0.1",
            "actor_rollout_ref.actor.clip_ratio_high=null",
            "trainer.seed=7",
            "trainer.project_name=p",
        ],
    )
    arr = cfg.actor_rollout_ref
    assert (arr.rollout.prompt_length, arr.rollout.response_length) == (100, 50)
    assert arr.rollout.max_model_len == 150
    assert arr.model.tokenizer_path == "m" and cfg.critic.model.path == "m"
    assert arr.actor.clip_ratio_high == 0.1 and arr.actor.clip_ratio_low == 0.1
    assert cfg.data.seed == 7
    assert cfg.trainer.default_local_dir == "checkpoints/p/default"
    assert arr.ref.zero_stage == arr.actor.zero_stage == cfg.critic.zero_stage == 3


def test_critic_loss_scale_factor_follows_only_the_same_mode() -> None:
    mode = "actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-sum-norm"
    cfg = load_config(None, [mode, "actor_rollout_ref.actor.loss_scale_factor=64"])
    assert cfg.critic.loss_scale_factor == 64
    cfg = load_config(
        None,
        [mode, "actor_rollout_ref.actor.loss_scale_factor=64", "critic.loss_agg_mode=token-mean"],
    )
    assert cfg.critic.loss_scale_factor is None


@pytest.mark.parametrize(
    "estimator",
    [
        "grpo",
        "grpo_vectorized",
        "rloo",
        "rloo_vectorized",
        "opo",
        "gpg",
        "reinforce_plus_plus_baseline",
    ],
)
def test_group_estimator_with_singleton_groups_warns(estimator: str) -> None:
    with pytest.warns(ConfigWarning, match=f"'{estimator}' with actor_rollout_ref.rollout.n = 1"):
        cfg = load_config(None, [f"algorithm.adv_estimator={estimator}"])
    assert any("singleton" in w for w in cfg.derived.warnings)


def test_total_training_steps_from_dataset_length() -> None:
    cfg = load_config(None, ["data.train_batch_size=16", "actor_rollout_ref.actor.ppo_mini_batch_size=8",
                             "trainer.total_epochs=3"])  # fmt: skip
    assert cfg.steps_per_epoch(100) == 6  # drop_last: 100 // 16
    assert cfg.resolve_total_training_steps(100) == 18
    fixed = load_config(None, ["trainer.total_training_steps=5"])
    assert fixed.resolve_total_training_steps(10_000) == 5
    with pytest.raises(ValueError, match=r"fewer than one batch of data\.train_batch_size = 16"):
        cfg.steps_per_epoch(15)


def test_warmup_steps() -> None:
    optim = load_config(
        None, ["actor_rollout_ref.actor.optim.lr_warmup_steps_ratio=0.1"]
    ).actor_rollout_ref.actor.optim
    assert optim.warmup_steps(50) == 5
    assert optim.model_copy(update={"lr_warmup_steps": 2}).warmup_steps(50) == 2


def test_cross_field_errors_come_with_the_field_errors() -> None:
    # one round: the cross-field rules run on the config with the bad field at its default
    with pytest.raises(ConfigError) as info:
        load_config(None, ["critic.enable=false", "trainer.total_epochs=0"])
    assert info.value.problems[0] == "trainer.total_epochs: got 0; must be ≥ 1"
    assert info.value.problems[1].startswith("critic.enable = false but algorithm.adv_estimator")
    assert len(info.value.problems) == 2


def test_a_cross_field_rule_naming_a_bad_field_is_not_reported_twice() -> None:
    # the mini-batch rule would judge the default that stands in for the bad value: skipped
    with pytest.raises(ConfigError) as info:
        load_config(None, ["actor_rollout_ref.actor.ppo_mini_batch_size=x"])
    assert len(info.value.problems) == 1
    assert info.value.problems[0].startswith("actor_rollout_ref.actor.ppo_mini_batch_size: got")


@pytest.mark.parametrize(
    ("overrides", "low", "high"),
    [
        ([], 0.2, 0.2),
        (["actor_rollout_ref.actor.clip_ratio=0.3"], 0.3, 0.3),  # verl: 0.2 / 0.2, silently
        (
            [
                "actor_rollout_ref.actor.clip_ratio=0.3",
                "actor_rollout_ref.actor.clip_ratio_high=0.28",
            ],
            0.3,
            0.28,
        ),
        (
            [
                "actor_rollout_ref.actor.clip_ratio_low=0.1",
                "actor_rollout_ref.actor.clip_ratio_high=0.28",
            ],
            0.1,
            0.28,
        ),
    ],
)
def test_null_clip_sides_inherit_clip_ratio_and_explicit_ones_win(overrides, low, high) -> None:
    from stages.algos.policy_loss_config import resolve_policy_loss_config

    actor = load_config(None, overrides).actor_rollout_ref.actor
    assert (actor.clip_ratio_low, actor.clip_ratio_high) == (low, high)
    settings = resolve_policy_loss_config(actor)
    assert (settings.clip_low, settings.clip_high) == (low, high)


def test_clip_sides_default_to_null_in_the_schema() -> None:
    from stages.config.schema_actor import ActorConfig

    assert ActorConfig().clip_ratio_low is None and ActorConfig().clip_ratio_high is None
