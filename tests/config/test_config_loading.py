"""Loading: YAML files with base includes, dict params, key=value overrides, dump round-trip."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

from stages.config import (
    CONFIGS_DIR,
    ConfigError,
    ConfigWarning,
    PPORunConfig,
    apply_overrides,
    dump_config,
    load_config,
    parse_override,
    validate_config,
)

ALL_CONFIGS = sorted(CONFIGS_DIR.glob("*.yaml"))


def test_override_values_are_typed_by_hydras_grammar() -> None:
    cfg = load_config(
        None,
        [
            "actor_rollout_ref.actor.use_kl_loss=true",
            "actor_rollout_ref.actor.optim.lr=1e-5",
            "actor_rollout_ref.actor.optim.betas=[0.8, 0.95]",
            "trainer.logger=[console]",
            "trainer.total_training_steps=7",
            "critic.enable=null",
            "data.train_files=a.parquet",
            "actor_rollout_ref.model.path='~/models/x=y'",  # Hydra: quote ~ and =
            "trainer.experiment_name=2024",
        ],
    )
    actor = cfg.actor_rollout_ref.actor
    assert actor.use_kl_loss is True
    assert actor.optim.lr == pytest.approx(1e-5) and isinstance(actor.optim.lr, float)
    assert actor.optim.betas == (0.8, 0.95)
    assert cfg.trainer.logger == ["console"]
    assert cfg.trainer.total_training_steps == 7
    assert cfg.critic.enable is None and cfg.derived.use_critic is True
    assert cfg.data.train_files == ["a.parquet"]
    assert cfg.actor_rollout_ref.model.path == "~/models/x=y"
    assert cfg.trainer.experiment_name == "2024"  # a number given to a string key stays text


@pytest.mark.parametrize(
    "text, expected",
    [
        ("a.b=true", True),
        ("a.b=False", False),
        ("a.b=3", 3),
        ("a.b=1e-6", 1e-6),
        ("a.b=-2.5E+3", -2500.0),
        ("a.b=null", None),
        ("a.b=[x, 1]", ["x", 1]),
        ("a.b=''", ""),
        ("a.b=hello world", "hello world"),
    ],
)
def test_parse_override(text: str, expected: object) -> None:
    assert parse_override(text) == ("a.b", expected)


def test_mapping_override_merges_into_the_section() -> None:
    cfg = load_config("demo-cpu", ["trainer={total_epochs: 2, test_freq: 3}"])
    assert (cfg.trainer.total_epochs, cfg.trainer.test_freq) == (2, 3)
    assert cfg.trainer.device == "cpu"  # the file's other trainer keys are kept


def test_dict_params_nested_and_dotted() -> None:
    cfg = load_config(
        None,
        params={
            "trainer": {"total_epochs": 3, "project_name": "p"},
            "trainer.experiment_name": "e",
            "actor_rollout_ref.actor.optim": {"lr": 2e-6},
        },
    )
    assert (cfg.trainer.total_epochs, cfg.trainer.project_name, cfg.trainer.experiment_name) == (
        3,
        "p",
        "e",
    )
    assert cfg.actor_rollout_ref.actor.optim.lr == 2e-6
    assert cfg.actor_rollout_ref.actor.optim.weight_decay == 0.01  # siblings keep their values


def test_overrides_win_over_params_which_win_over_the_file() -> None:
    cfg = load_config(
        "grpo",
        ["actor_rollout_ref.rollout.n=8"],
        params={"actor_rollout_ref.rollout.n": 6, "trainer.total_epochs": 2},
    )
    assert cfg.actor_rollout_ref.rollout.n == 8 and cfg.trainer.total_epochs == 2


def test_unknown_key_in_params_suggests_sibling() -> None:
    with pytest.raises(
        ConfigError, match=r"trainer.total_epoch: unknown key; did you mean 'total_epochs'"
    ):
        load_config(None, params={"trainer.total_epoch": 3})


def test_base_include_deep_merges(tmp_path: Path) -> None:
    (tmp_path / "parent.yaml").write_text(
        "base: " + str(CONFIGS_DIR / "grpo.yaml") + "\n"
        "trainer: {total_epochs: 4, logger: [console, mlflow]}\n"
        "actor_rollout_ref: {actor: {optim: {lr: 3.0e-6}}}\n"
    )
    (tmp_path / "child.yaml").write_text(
        "base: parent.yaml\ntrainer: {logger: [console]}\nactor_rollout_ref: {actor: {optim: {weight_decay: 0.0}}}\n"
    )
    cfg = load_config(tmp_path / "child.yaml")
    assert (
        cfg.algorithm.adv_estimator == "grpo" and cfg.actor_rollout_ref.rollout.n == 5
    )  # grandparent
    assert cfg.trainer.total_epochs == 4  # parent
    assert cfg.trainer.logger == ["console"]  # lists replace, not append
    assert (
        cfg.actor_rollout_ref.actor.optim.lr == 3e-6
        and cfg.actor_rollout_ref.actor.optim.weight_decay == 0.0
    )


def test_grpo_overrides_only_its_keys() -> None:
    grpo, defaults = load_config("grpo"), load_config(None)
    assert grpo.algorithm.adv_estimator == "grpo" and grpo.derived.use_critic is False
    assert grpo.derived.use_reference_policy is True
    assert grpo.data == defaults.data and grpo.trainer == defaults.trainer


@pytest.mark.parametrize("path", ALL_CONFIGS, ids=[p.name for p in ALL_CONFIGS])
def test_every_shipped_config_loads_and_round_trips(path: Path, tmp_path: Path) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConfigWarning)
        cfg = load_config(path)
    dumped = tmp_path / "dumped.yaml"
    dumped.write_text(dump_config(cfg))
    assert load_config(dumped) == cfg


def test_demo_cpu_config_is_the_tiny_cpu_grpo_run() -> None:
    cfg = load_config("demo-cpu")
    arr = cfg.actor_rollout_ref
    assert cfg.trainer.device == "cpu" and cfg.derived.dp_size == 1
    assert arr.rollout.name == "hf" and arr.rollout.n == 4 and cfg.algorithm.adv_estimator == "grpo"
    assert arr.model.path == "outputs/demo/model" and arr.model.dtype == "float32"
    assert cfg.data.train_files == ["outputs/demo/data/train.parquet"]
    assert (cfg.data.max_prompt_length, cfg.data.max_response_length) == (64, 16)
    assert arr.actor.zero_stage == 0 and cfg.ppoflow.artifact_dir == "outputs/demo/runs"
    assert cfg.trainer.logger == ["console", "mlflow"]


def test_dump_is_explicit_and_reloads_equal() -> None:
    cfg = load_config("grpo", ["trainer.total_epochs=2"])
    text = dump_config(cfg)
    assert "ppo_mini_batch_size: 256" in text and "logger: [console, mlflow]" in text
    assert validate_config(__import__("yaml").safe_load(text)) == cfg


def test_apply_overrides_re_resolves_inherited_keys() -> None:
    cfg = load_config(None, ["critic.ppo_epochs=3"])
    assert cfg.critic.ppo_mini_batch_size == 256
    changed = apply_overrides(
        cfg,
        ["actor_rollout_ref.actor.ppo_mini_batch_size=128", "actor_rollout_ref.actor.ppo_epochs=2"],
    )
    assert changed.critic.ppo_mini_batch_size == 128  # followed the actor (was inherited)
    assert changed.critic.ppo_epochs == 3  # explicitly set: kept
    assert cfg.actor_rollout_ref.actor.ppo_mini_batch_size == 256  # the original is unchanged


def test_config_is_immutable() -> None:
    cfg = load_config(None)
    with pytest.raises(ValueError, match="frozen"):
        cfg.trainer.total_epochs = 3  # type: ignore[misc]


def test_construction_fills_inherited_keys_without_touching_defaults() -> None:
    a = PPORunConfig(data={"max_prompt_length": 100})
    b = PPORunConfig()
    assert a.actor_rollout_ref.rollout.prompt_length == 100
    assert b.actor_rollout_ref.rollout.prompt_length == 512


def test_legacy_top_level_reward_blocks_are_aliases() -> None:
    cfg = load_config(
        None,
        params={
            "custom_reward_function": {"path": "my_reward.py", "name": "score"},
            "reward_model": {"enable": True, "model": {"path": "rm-model"}, "nnodes": None},
        },
    )
    assert cfg.reward.custom_reward_function.path == "my_reward.py"
    assert cfg.reward.custom_reward_function.name == "score"
    assert cfg.reward.reward_model.enable and cfg.reward.reward_model.model_path == "rm-model"
    assert (
        "custom_reward_function:" not in dump_config(cfg).split("reward:")[0]
    )  # dumped in 0.9.1 layout


def test_legacy_alias_conflict_is_an_error() -> None:
    with pytest.raises(
        ConfigError,
        match=r"set the same ppoflow key reward\.custom_reward_function\.name in the command-line overrides",
    ):
        load_config(None, ["reward.custom_reward_function.name=a", "custom_reward_function.name=b"])


def test_overrides_must_be_a_list() -> None:
    with pytest.raises(TypeError, match="list of 'key=value' strings"):
        load_config(None, "trainer.total_epochs=2")  # type: ignore[arg-type]


def test_trainer_worker_backend_is_an_alias_of_ppoflow_workers_backend():
    assert load_config("demo-cpu", ["trainer.worker_backend=ray"]).ppoflow.workers.backend == "ray"
    assert (
        load_config(None, params={"trainer": {"worker_backend": "ray"}}).ppoflow.workers.backend
        == "ray"
    )
