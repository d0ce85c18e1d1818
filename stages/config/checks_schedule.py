"""Cross-field rules of ``ppoflow.schedule`` (``stages.schedules``) against the rest of the run.

A schedule whose rollout runs apart from the trainer (``one_step_off``) draws step k + 1's input
and generates it while step k trains. What cannot be given that input yet is refused, each with
one message naming the key: a KL coefficient that adapts after step k, dynamic sampling's extra
generation rounds, ReMax's greedy baseline (a second rollout on the trainer's weights), the agent
loop (not implemented for it yet), and a rollout backend without a replica.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from stages.algos.advantages import ADV_ESTIMATORS
from stages.algos.kl_control import KL_CONTROLLERS
from stages.engines.rollout_backends import ROLLOUT_BACKENDS
from stages.schedules import POLICY_SCHEDULES

if TYPE_CHECKING:
    from stages.config.root import PPORunConfig

SCHEDULE = "ppoflow.schedule"


def schedule_problems(cfg: PPORunConfig) -> list[str]:
    """What a schedule with its rollout apart cannot run with (module docstring)."""
    name = cfg.ppoflow.schedule
    if not POLICY_SCHEDULES.get(name).rollout_apart:
        return []
    head = f"{SCHEDULE} = {name!r}"
    problems = []
    algorithm, rollout = cfg.algorithm, cfg.actor_rollout_ref.rollout
    if algorithm.use_kl_in_reward and KL_CONTROLLERS.get(algorithm.kl_ctrl.type).adapts:
        problems.append(
            f"{head} with algorithm.kl_ctrl.type = {algorithm.kl_ctrl.type!r}: the next step's "
            "input is drawn before this step's KL moves β; set kl_ctrl.type = 'fixed' or "
            f"{SCHEDULE} = 'on_policy'"
        )
    if algorithm.filter_groups.enable:
        problems.append(
            f"{head} with algorithm.filter_groups.enable = true: dynamic sampling's generation "
            f"rounds one step off are not implemented; set {SCHEDULE} = 'on_policy'"
        )
    if ADV_ESTIMATORS.get(algorithm.adv_estimator).needs_greedy_baseline:
        problems.append(
            f"{head} with algorithm.adv_estimator = {algorithm.adv_estimator!r}: its greedy "
            f"baseline one step off is not implemented; set {SCHEDULE} = 'on_policy'"
        )
    if rollout.multi_turn.enable:
        problems.append(
            f"{head} with actor_rollout_ref.rollout.multi_turn.enable = true: the agent loop one "
            f"step off is not implemented; set {SCHEDULE} = 'on_policy'"
        )
    if ROLLOUT_BACKENDS.get(rollout.name).build_replica is None:
        problems.append(
            f"{head} with actor_rollout_ref.rollout.name = {rollout.name!r}: that backend "
            "builds no rollout replica; use 'hf' or 'vllm'"
        )
    return problems
