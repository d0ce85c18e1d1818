"""Defaults equal verl 0.9.1's unless documented; the rendered YAML never drifts."""

from __future__ import annotations

import doctest
import importlib
import typing
from pathlib import Path

import pytest
from pydantic import BaseModel

from stages.config import CONFIGS_DIR, CriticConfig, PPORunConfig, load_config, render_default_yaml
from stages.config.errors import nested_model

MODULES = [
    "stages.config.errors",
    "stages.config.interpolation",
    "stages.config.loading",
    "stages.config.model_tree",
    "stages.config.root",
    "stages.config.overrides",
    "stages.config.schema_actor",
    "stages.config.schema_run",
    "stages.config.verl_keys",
]

# dotted key -> verl 0.9.1 default (verl's trainer config)
VERL_DEFAULTS = {
    "actor_rollout_ref.actor.ppo_mini_batch_size": 256,
    "actor_rollout_ref.actor.ppo_epochs": 1,
    "actor_rollout_ref.actor.shuffle": False,
    "actor_rollout_ref.actor.data_loader_seed": 42,
    "actor_rollout_ref.actor.clip_ratio": 0.2,
    "actor_rollout_ref.actor.clip_ratio_low": 0.2,
    "actor_rollout_ref.actor.clip_ratio_high": 0.2,
    "actor_rollout_ref.actor.clip_ratio_c": 3.0,
    "actor_rollout_ref.actor.policy_loss.loss_mode": "vanilla",
    "actor_rollout_ref.actor.policy_loss.clip_cov_ratio": 2e-4,
    "actor_rollout_ref.actor.policy_loss.clip_cov_lb": 1.0,
    "actor_rollout_ref.actor.policy_loss.clip_cov_ub": 5.0,
    "actor_rollout_ref.actor.policy_loss.kl_cov_ratio": 2e-4,
    "actor_rollout_ref.actor.policy_loss.ppo_kl_coef": 0.1,
    "actor_rollout_ref.actor.tau_pos": 1.0,
    "actor_rollout_ref.actor.tau_neg": 1.05,
    "actor_rollout_ref.actor.loss_agg_mode": "token-mean",
    "actor_rollout_ref.actor.loss_scale_factor": None,
    "actor_rollout_ref.actor.entropy_coeff": 0.0,
    "actor_rollout_ref.actor.calculate_entropy": False,
    "actor_rollout_ref.actor.use_kl_loss": False,
    "actor_rollout_ref.actor.kl_loss_coef": 0.001,
    "actor_rollout_ref.actor.kl_loss_type": "low_var_kl",
    "actor_rollout_ref.actor.optim.lr": 1e-6,
    "actor_rollout_ref.actor.optim.weight_decay": 0.01,
    "actor_rollout_ref.actor.optim.betas": (0.9, 0.999),
    "actor_rollout_ref.actor.optim.clip_grad": 1.0,
    "actor_rollout_ref.actor.optim.lr_scheduler_type": "constant",
    "actor_rollout_ref.actor.optim.lr_warmup_steps_ratio": 0.0,
    "actor_rollout_ref.actor.ppo_max_token_len_per_gpu": 16384,
    "actor_rollout_ref.actor.use_dynamic_bsz": False,
    "actor_rollout_ref.rollout.n": 1,
    "actor_rollout_ref.rollout.temperature": 1.0,
    "actor_rollout_ref.rollout.top_k": -1,
    "actor_rollout_ref.rollout.top_p": 1.0,
    "actor_rollout_ref.rollout.do_sample": True,
    "actor_rollout_ref.rollout.prompt_length": 512,
    "actor_rollout_ref.rollout.response_length": 512,
    "actor_rollout_ref.rollout.val_kwargs.n": 1,
    "actor_rollout_ref.rollout.val_kwargs.temperature": 0.0,
    "actor_rollout_ref.rollout.val_kwargs.do_sample": False,
    "actor_rollout_ref.rollout.val_kwargs.top_p": 1.0,
    "actor_rollout_ref.rollout.val_kwargs.top_k": -1,
    "actor_rollout_ref.rollout.gpu_memory_utilization": 0.5,
    "actor_rollout_ref.rollout.tensor_model_parallel_size": 2,
    "critic.enable": None,
    "critic.optim.lr": 1e-5,
    "critic.cliprange_value": 0.5,
    "critic.ppo_max_token_len_per_gpu": 32768,
    "algorithm.adv_estimator": "gae",
    "algorithm.gamma": 1.0,
    "algorithm.lam": 1.0,
    "algorithm.norm_adv_by_std_in_grpo": True,
    "algorithm.use_kl_in_reward": False,
    "algorithm.kl_penalty": "kl",
    "algorithm.kl_ctrl.type": "fixed",
    "algorithm.kl_ctrl.kl_coef": 0.001,
    "algorithm.kl_ctrl.horizon": 10000,
    "algorithm.kl_ctrl.target_kl": 0.1,
    "algorithm.rollout_correction.bypass_mode": False,
    "data.train_batch_size": 1024,
    "data.max_prompt_length": 512,
    "data.max_response_length": 512,
    "data.shuffle": True,
    "data.validation_shuffle": False,
    "data.return_raw_chat": True,
    "data.truncation": "error",
    "data.prompt_key": "prompt",
    "data.reward_fn_key": "data_source",
    "reward.num_workers": 8,
    "reward.custom_reward_function.name": "compute_score",
    "reward.custom_reward_function.path": None,
    "reward.reward_model.enable": False,
    "trainer.total_epochs": 30,
    "trainer.total_training_steps": None,
    "trainer.test_freq": -1,
    "trainer.save_freq": -1,
    "trainer.val_before_train": True,
    "trainer.critic_warmup": 0,
    "trainer.balance_batch": True,
    "trainer.resume_mode": "auto",
    "trainer.n_gpus_per_node": 8,
    "trainer.nnodes": 1,
}
# documented differences (each field's description carries a [ppoflow...] note)
PPOFLOW_DEFAULTS = {
    "trainer.logger": ["console", "mlflow"],
    "data.seed": 42,  # verl: null (unseeded sampler); ppoflow: trainer.seed
    "actor_rollout_ref.actor.strategy": "deepspeed",
    "actor_rollout_ref.rollout.name": "vllm",
    "actor_rollout_ref.model.attn_implementation": "sdpa",
}
# inherited from the actor when null (verl's ${oc.select:actor_rollout_ref.actor.…})
CRITIC_INHERITS = [
    "ppo_mini_batch_size",
    "ppo_epochs",
    "loss_agg_mode",
    "shuffle",
    "use_dynamic_bsz",
]


def get_dotted(cfg: object, key: str) -> object:
    for part in key.split("."):
        cfg = getattr(cfg, part)
    return cfg


@pytest.mark.parametrize("key, expected", {**VERL_DEFAULTS, **PPOFLOW_DEFAULTS}.items())
def test_default_value(key: str, expected: object) -> None:
    assert get_dotted(load_config(None), key) == expected


def test_ppoflow_differences_are_documented_in_the_descriptions() -> None:
    for key in PPOFLOW_DEFAULTS:
        *parents, leaf = key.split(".")
        model: type[BaseModel] = PPORunConfig
        for part in parents:
            model = nested_model(model.model_fields[part].annotation)
        assert "[ppoflow" in model.model_fields[leaf].description, key


@pytest.mark.parametrize("key", CRITIC_INHERITS)
def test_critic_inherits_actor_batching(key: str) -> None:
    cfg = load_config(
        None, [f"actor_rollout_ref.actor.{key}={_other_value(key)}", *_keep_valid(key)]
    )
    assert getattr(cfg.critic, key) == getattr(cfg.actor_rollout_ref.actor, key)
    assert getattr(CriticConfig(), key) is None  # null in the schema = inherit


def _other_value(key: str) -> str:
    return {"ppo_mini_batch_size": "128", "ppo_epochs": "2", "loss_agg_mode": "seq-mean-token-mean",
            "shuffle": "true", "use_dynamic_bsz": "true"}[key]  # fmt: skip


def _keep_valid(key: str) -> list[str]:
    return ["critic.ppo_max_token_len_per_gpu=2048"] if key == "use_dynamic_bsz" else []


def _all_fields(model: type[BaseModel], prefix: str = "") -> typing.Iterator[tuple[str, object]]:
    for name, field in model.model_fields.items():
        yield prefix + name, field
        section = nested_model(field.annotation)
        if section is not None:
            yield from _all_fields(section, f"{prefix}{name}.")


def test_every_field_has_a_one_line_description_with_a_unit() -> None:
    fields = list(_all_fields(PPORunConfig))
    assert len(fields) > 120
    for key, field in fields:
        text = field.description or ""
        assert text and "\n" not in text, key
        assert text.rstrip().endswith(")") and "(" in text, f"{key}: no (unit) in {text!r}"


def test_configs_ppo_trainer_yaml_is_the_rendered_defaults() -> None:
    on_disk = (CONFIGS_DIR / "ppo_trainer.yaml").read_text(encoding="utf-8")
    assert on_disk == render_default_yaml(), (
        "configs/ppo_trainer.yaml is stale: run `ppoflow config defaults > configs/ppo_trainer.yaml`"
    )


def test_rendered_defaults_load_to_the_pydantic_defaults(tmp_path: Path) -> None:
    path = tmp_path / "defaults.yaml"
    path.write_text(render_default_yaml())
    assert load_config(path) == load_config(None) == PPORunConfig()


def test_rendered_defaults_comment_every_key() -> None:
    lines = render_default_yaml().splitlines()
    keys = [i for i, line in enumerate(lines) if line.strip() and not line.lstrip().startswith("#")]
    assert len(keys) == len(list(_all_fields(PPORunConfig)))
    for i in keys:
        assert lines[i - 1].lstrip().startswith("# "), lines[i]


@pytest.mark.parametrize("module", MODULES)
def test_docstring_examples(module: str) -> None:
    result = doctest.testmod(importlib.import_module(module))
    assert result.failed == 0 and result.attempted > 0
