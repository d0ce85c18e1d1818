"""Cross-field rules of ``ppoflow.schedule`` (``stages.schedules``) against the rest of the run.

A schedule whose rollout runs apart from the trainer (``one_step_off``, ``fully_async``) draws the
inputs of the steps ahead and generates them while step k trains. What cannot be given that input yet is refused, each with
one message naming the key: a KL coefficient that adapts after step k, dynamic sampling's extra
generation rounds, ReMax's greedy baseline (a second rollout on the trainer's weights), the agent
loop (not implemented for it yet), and a rollout backend without a replica. ``async_training.*``
is read by ``fully_async`` only: set for another schedule it is an error, and partial rollouts,
a checkpoint cadence off the sync period and a step batch other than ``require_batches``
mini-batches are refused.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from stages.algos.advantages import ADV_ESTIMATORS
from stages.algos.kl_control import KL_CONTROLLERS
from stages.config.schema_async import ASYNC_DEFAULTS
from stages.engines.rollout_backends import ROLLOUT_BACKENDS
from stages.schedules import POLICY_SCHEDULES

if TYPE_CHECKING:
    from stages.config.root import PPORunConfig

SCHEDULE = "ppoflow.schedule"


def schedule_problems(cfg: PPORunConfig) -> list[str]:
    """What a schedule with its rollout apart cannot run with (module docstring), and the
    ``async_training`` rules."""
    name = cfg.ppoflow.schedule
    spec = POLICY_SCHEDULES.get(name)
    problems = _async_training_problems(cfg, spec.reads_async_training)
    if not spec.rollout_apart:
        return problems
    head = f"{SCHEDULE} = {name!r}"
    algorithm, rollout = cfg.algorithm, cfg.actor_rollout_ref.rollout
    if algorithm.use_kl_in_reward and KL_CONTROLLERS.get(algorithm.kl_ctrl.type).adapts:
        problems.append(
            f"{head} with algorithm.kl_ctrl.type = {algorithm.kl_ctrl.type!r}: the next steps' "
            "inputs are drawn before this step's KL moves β; set kl_ctrl.type = 'fixed' or "
            f"{SCHEDULE} = 'on_policy'"
        )
    if algorithm.filter_groups.enable:
        problems.append(
            f"{head} with algorithm.filter_groups.enable = true: dynamic sampling's generation "
            f"rounds on rollouts launched ahead are not implemented; set {SCHEDULE} = 'on_policy'"
        )
    if ADV_ESTIMATORS.get(algorithm.adv_estimator).needs_greedy_baseline:
        problems.append(
            f"{head} with algorithm.adv_estimator = {algorithm.adv_estimator!r}: its greedy "
            f"baseline on rollouts launched ahead is not implemented; set {SCHEDULE} = 'on_policy'"
        )
    if rollout.multi_turn.enable:
        problems.append(
            f"{head} with actor_rollout_ref.rollout.multi_turn.enable = true: the agent loop on "
            f"rollouts launched ahead is not implemented; set {SCHEDULE} = 'on_policy'"
        )
    if ROLLOUT_BACKENDS.get(rollout.name).build_replica is None:
        problems.append(
            f"{head} with actor_rollout_ref.rollout.name = {rollout.name!r}: that backend "
            "builds no rollout replica; use 'hf' or 'vllm'"
        )
    return problems


def _async_training_problems(cfg: PPORunConfig, reads: bool) -> list[str]:
    """``async_training.*`` set for a schedule that does not read them; a save cadence off the
    sync period; the step's batch."""
    async_training, problems = cfg.async_training, []
    changed = {
        key: getattr(async_training, key)
        for key, default in ASYNC_DEFAULTS.items()
        if getattr(async_training, key) != default
    }
    if not reads:
        return [
            f"async_training.{key} = {value!r} has no effect with {SCHEDULE} = "
            f"{cfg.ppoflow.schedule!r}; set {SCHEDULE} = 'fully_async' or remove it"
            for key, value in changed.items()
        ]
    every, save_freq = async_training.trigger_parameter_sync_step, cfg.trainer.save_freq
    if save_freq > 0 and save_freq % every:
        problems.append(
            f"trainer.save_freq = {save_freq} is not a multiple of "
            f"async_training.trigger_parameter_sync_step = {every}: a checkpoint must end a sync "
            "period, so that a resumed run syncs the checkpoint's weights as the uninterrupted run "
            f"does; set save_freq to a multiple of {every}"
        )
    mini_batch = cfg.actor_rollout_ref.actor.ppo_mini_batch_size
    wanted = mini_batch * async_training.require_batches
    if cfg.data.train_batch_size != wanted:
        problems.append(
            f"data.train_batch_size = {cfg.data.train_batch_size} but async_training."
            f"require_batches = {async_training.require_batches} × actor.ppo_mini_batch_size = "
            f"{mini_batch} prompts make a trainer step; set data.train_batch_size = {wanted}"
        )
    return problems
