"""``async_training``: verl's fully async keys (``fully_async_ppo_trainer.yaml``), read by
``ppoflow.schedule=fully_async`` (``stages.schedules``: its pace; ``checks_schedule``: the rules).
verl's resource keys of the same section (dynamic scheduling, samples per replica) have no effect
here (``verl_keys.yaml``)."""

from __future__ import annotations

from pydantic import Field

from stages.config._base import ConfigModel

#: verl 0.9.1's defaults (config/fully_async_ppo_trainer.yaml)
ASYNC_DEFAULTS = {
    "staleness_threshold": 0.1,
    "trigger_parameter_sync_step": 4,
    "require_batches": 1,
    "partial_rollout": True,
}


class AsyncTrainingConfig(ConfigModel):
    """Bounded-staleness async training (``ppoflow.schedule=fully_async``)."""

    staleness_threshold: float = Field(
        ASYNC_DEFAULTS["staleness_threshold"],
        ge=0,
        description="How far the rollout may run ahead: ⌊(1 + s) · T⌋ steps' batches beyond the "
        "one being trained (verl: required samples × (1 + s) × T); 0 with T = 1 is one step off "
        "(ratio)",
    )
    trigger_parameter_sync_step: int = Field(
        ASYNC_DEFAULTS["trigger_parameter_sync_step"],
        ge=1,
        description="Trainer steps between the rollout's weight syncs (T); trainer.save_freq must "
        "be a multiple of it (steps)",
    )
    require_batches: int = Field(
        ASYNC_DEFAULTS["require_batches"],
        ge=1,
        description="Mini-batches per trainer step: data.train_batch_size must be "
        "actor.ppo_mini_batch_size × require_batches (verl sets train_batch_size 0 and derives "
        "it) (count)",
    )
    partial_rollout: bool = Field(
        ASYNC_DEFAULTS["partial_rollout"],
        description="Interrupt the generation of a batch in flight at each weight sync and resume "
        "it under the new weights (each token's policy version kept as rollout_policy_versions); "
        "the sync falls at a column fixed by the step counts, not by timing (bool)",
    )
