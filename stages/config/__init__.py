"""The typed run config: pydantic models with verl's key names, loaded from YAML with overrides.

Entry points::

    cfg = load_config("configs/grpo.yaml", ["actor_rollout_ref.rollout.n=8"])
    cfg.actor_rollout_ref.actor.clip_ratio    # each area is its own model (slice)
    cfg.derived.use_critic                    # derived flags and sizes, computed in one place
    print(dump_config(cfg))                   # resolved YAML

Any problem raises :class:`ConfigError` (a ValueError) that lists every bad key with the value
received and what is allowed.

The names below are imported on first use (PEP 562): ``from stages.config import ConfigError``
loads the error type alone, not the schema, its registries and torch, so a command line can
answer a usage error or ``--help`` without them.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

#: each public name → the module that defines it
_EXPORTS = {
    "ActorConfig": "stages.config.schema_actor",
    "ActorRolloutRefConfig": "stages.config.schema_actor",
    "AlgorithmConfig": "stages.config.schema_algorithm",
    "CONFIGS_DIR": "stages.config.paths",
    "ConfigError": "stages.config.errors",
    "ConfigNotice": "stages.config.errors",
    "ConfigWarning": "stages.config.errors",
    "CriticConfig": "stages.config.schema_critic",
    "CriticModelConfig": "stages.config.schema_critic",
    "CriticOptimConfig": "stages.config.schema_critic",
    "CustomRewardFunctionConfig": "stages.config.schema_reward",
    "DataConfig": "stages.config.schema_data",
    "DerivedConfig": "stages.config.derived",
    "KlCtrlConfig": "stages.config.schema_algorithm",
    "ModelConfig": "stages.config.schema_actor",
    "OptimConfig": "stages.config.schema_actor",
    "PPOFlowConfig": "stages.config.schema_trainer",
    "PPORunConfig": "stages.config.root",
    "PolicyLossConfig": "stages.config.schema_actor",
    "RefConfig": "stages.config.schema_actor",
    "RewardConfig": "stages.config.schema_reward",
    "RewardModelConfig": "stages.config.schema_reward",
    "RolloutConfig": "stages.config.schema_actor",
    "RolloutCorrectionConfig": "stages.config.schema_algorithm",
    "TrainerConfig": "stages.config.schema_trainer",
    "ValKwargsConfig": "stages.config.schema_actor",
    "WorkersConfig": "stages.config.schema_trainer",
    "apply_overrides": "stages.config.loading",
    "deep_merge": "stages.config.loading",
    "dump_config": "stages.config.loading",
    "explain_verl_keys": "stages.config.loading",
    "load_config": "stages.config.loading",
    "parse_override": "stages.config.loading",
    "read_config_tree": "stages.config.loading",
    "render_default_yaml": "stages.config.render",
    "resolve_config_path": "stages.config.paths",
    "validate_config": "stages.config.loading",
}

__all__ = [  # the names of _EXPORTS
    "CONFIGS_DIR",
    "ActorConfig",
    "ActorRolloutRefConfig",
    "AlgorithmConfig",
    "ConfigError",
    "ConfigNotice",
    "ConfigWarning",
    "CriticConfig",
    "CriticModelConfig",
    "CriticOptimConfig",
    "CustomRewardFunctionConfig",
    "DataConfig",
    "DerivedConfig",
    "KlCtrlConfig",
    "ModelConfig",
    "OptimConfig",
    "PPOFlowConfig",
    "PPORunConfig",
    "PolicyLossConfig",
    "RefConfig",
    "RewardConfig",
    "RewardModelConfig",
    "RolloutConfig",
    "RolloutCorrectionConfig",
    "TrainerConfig",
    "ValKwargsConfig",
    "WorkersConfig",
    "apply_overrides",
    "deep_merge",
    "dump_config",
    "explain_verl_keys",
    "load_config",
    "parse_override",
    "read_config_tree",
    "render_default_yaml",
    "resolve_config_path",
    "validate_config",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # the next lookup is a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})


if TYPE_CHECKING:
    from stages.config.derived import DerivedConfig
    from stages.config.errors import ConfigError, ConfigNotice, ConfigWarning
    from stages.config.loading import (
        apply_overrides,
        deep_merge,
        dump_config,
        explain_verl_keys,
        load_config,
        parse_override,
        read_config_tree,
        validate_config,
    )
    from stages.config.paths import CONFIGS_DIR, resolve_config_path
    from stages.config.render import render_default_yaml
    from stages.config.root import PPORunConfig
    from stages.config.schema_actor import (
        ActorConfig,
        ActorRolloutRefConfig,
        ModelConfig,
        OptimConfig,
        PolicyLossConfig,
        RefConfig,
        RolloutConfig,
        ValKwargsConfig,
    )
    from stages.config.schema_algorithm import (
        AlgorithmConfig,
        KlCtrlConfig,
        RolloutCorrectionConfig,
    )
    from stages.config.schema_critic import CriticConfig, CriticModelConfig, CriticOptimConfig
    from stages.config.schema_data import DataConfig
    from stages.config.schema_reward import (
        CustomRewardFunctionConfig,
        RewardConfig,
        RewardModelConfig,
    )
    from stages.config.schema_trainer import PPOFlowConfig, TrainerConfig, WorkersConfig
