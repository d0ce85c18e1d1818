"""The typed run config: pydantic models with verl's key names, loaded from YAML with overrides.

Entry points::

    cfg = load_config("configs/grpo.yaml", ["actor_rollout_ref.rollout.n=8"])
    cfg.actor_rollout_ref.actor.clip_ratio    # each area is its own model (slice)
    cfg.derived.use_critic                    # derived flags and sizes, computed in one place
    print(dump_config(cfg))                   # resolved YAML

Any problem raises :class:`ConfigError` (a ValueError) that lists every bad key with the value
received and what is allowed.
"""

from stages.config.derived import DerivedConfig
from stages.config.errors import ConfigError
from stages.config.loading import (
    CONFIGS_DIR,
    apply_overrides,
    deep_merge,
    dump_config,
    explain_verl_keys,
    load_config,
    parse_override,
    read_config_tree,
    resolve_config_path,
    validate_config,
)
from stages.config.render import render_default_yaml
from stages.config.root import ConfigNotice, ConfigWarning, PPORunConfig
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

__all__ = [
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
