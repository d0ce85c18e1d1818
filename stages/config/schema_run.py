"""The run config's tree: one section per area, each declared in its ``schema_*`` module.

:class:`RunSchema` holds the fields only; :class:`stages.config.root.PPORunConfig` subclasses it
with the validation (verl's keys read as ppoflow's, plugins, inherited keys filled, cross-field
rules). The reading of verl's keys (:mod:`stages.config.verl_keys`) walks this tree to know
ppoflow's keys and defaults, and the root validator calls that reading, so the tree sits below
both.

Example:
    >>> list(RunSchema.model_fields)
    ['data', 'actor_rollout_ref', 'critic', 'reward', 'algorithm', 'trainer', 'async_training', 'ppoflow']
"""

from __future__ import annotations

from pydantic import Field

from stages.config._base import ConfigModel
from stages.config.schema_actor import ActorRolloutRefConfig
from stages.config.schema_algorithm import AlgorithmConfig
from stages.config.schema_async import AsyncTrainingConfig
from stages.config.schema_critic import CriticConfig
from stages.config.schema_data import DataConfig
from stages.config.schema_reward import RewardConfig
from stages.config.schema_trainer import PPOFlowConfig, TrainerConfig


class RunSchema(ConfigModel):
    """The sections of one PPO-family training run: verl's areas plus ``ppoflow``'s own."""

    data: DataConfig = Field(
        default_factory=DataConfig, description="Datasets and batching (section)"
    )
    actor_rollout_ref: ActorRolloutRefConfig = Field(
        default_factory=ActorRolloutRefConfig,
        description="Policy model: actor update, rollout, reference (section)",
    )
    critic: CriticConfig = Field(default_factory=CriticConfig, description="Value model (section)")
    reward: RewardConfig = Field(default_factory=RewardConfig, description="Scoring (section)")
    algorithm: AlgorithmConfig = Field(
        default_factory=AlgorithmConfig, description="Advantage estimator and KL penalty (section)"
    )
    trainer: TrainerConfig = Field(
        default_factory=TrainerConfig, description="Run length, cadence, devices, logging (section)"
    )
    async_training: AsyncTrainingConfig = Field(
        default_factory=AsyncTrainingConfig,
        description="Bounded-staleness async training, read with ppoflow.schedule=fully_async "
        "(section)",
    )
    ppoflow: PPOFlowConfig = Field(
        default_factory=PPOFlowConfig,
        description="Artifacts, caching, tracking, workers [ppoflow-only] (section)",
    )
