"""Cross-field rules of DAPO's settings: dynamic sampling (``algorithm.filter_groups`` with
``data.gen_batch_size``) and the overlong reward shaping (``reward.overlong_buffer``).

Each returns messages that start with the dotted key(s) at fault, give the values received and
say how to fix them (``stages.config.checks`` collects them).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from stages.reward.managers import REWARD_MANAGERS

if TYPE_CHECKING:
    from stages.config.root import PPORunConfig

FG = "algorithm.filter_groups"


def dynamic_sampling_problems(cfg: PPORunConfig) -> list[str]:
    """gen_batch_size ≥ train_batch_size (and only with filtering); filtering needs groups of
    more than one sample, or no group is ever filtered and a round limit is never reached."""
    fg, data, n = cfg.algorithm.filter_groups, cfg.data, cfg.actor_rollout_ref.rollout.n
    gen, train = data.gen_batch_size, data.train_batch_size
    problems = []
    if gen < train:
        problems.append(
            f"data.gen_batch_size = {gen} is smaller than data.train_batch_size = {train}: a "
            f"generation round draws gen_batch_size prompts and the step trains on "
            f"train_batch_size of them; set gen_batch_size ≥ {train} (or null = {train})"
        )
    elif gen != train and not fg.enable:
        problems.append(
            f"data.gen_batch_size = {gen} differs from data.train_batch_size = {train} but "
            f"{FG}.enable = false: without dynamic sampling a step trains on every prompt it "
            f"generated for; enable {FG} or set gen_batch_size to null"
        )
    if fg.enable and n == 1:
        limit = (
            f" and {FG}.max_num_gen_batches = {fg.max_num_gen_batches} could never be reached"
            if fg.max_num_gen_batches
            else ""
        )
        problems.append(
            f"{FG}.enable = true with actor_rollout_ref.rollout.n = 1: every group is a single "
            f"sample, which is always kept, so nothing is ever filtered{limit}; set n ≥ 2 or "
            f"{FG}.enable = false"
        )
    if fg.enable and cfg.algorithm.use_kl_in_reward:
        problems += _metric_with_kl_problems(fg.metric)
    return problems


def _metric_with_kl_problems(metric: str) -> list[str]:
    """A filter metric whose verl value includes the in-reward KL penalty cannot be read in a
    generation round (stages/filter_metrics.py)."""
    from stages.filter_metrics import FILTER_METRICS  # torch: only when the case can arise

    problems = []
    if metric in FILTER_METRICS and FILTER_METRICS.get(metric).differs_with_kl_in_reward:
        problems.append(
            f"{FG}.metric = {metric!r} with algorithm.use_kl_in_reward = true: the generation "
            f"rounds filter before the reference policy runs, so the KL penalty this metric "
            f"includes is not known yet; use 'seq_reward' (the score without the penalty) or "
            f"set algorithm.use_kl_in_reward = false"
        )
    return problems


def overlong_problems(cfg: PPORunConfig) -> list[str]:
    """The overlong buffer needs a manager that applies it, a buffer inside max_resp_len (verl's
    asserts), and the reward stage's scoring (not the rollout's own)."""
    buffer, reward = cfg.reward.overlong_buffer, cfg.reward
    if not buffer.enable:
        return []
    problems = []
    manager = reward.reward_manager.name
    if not REWARD_MANAGERS.get(manager).reads_overlong_buffer:
        readers = [
            name for name in REWARD_MANAGERS if REWARD_MANAGERS.get(name).reads_overlong_buffer
        ]
        problems.append(
            f"reward.overlong_buffer.enable = true but reward.reward_manager.name = {manager!r} "
            f"does not apply it (verl passes it only to {' / '.join(readers)}); set "
            f"reward.reward_manager.name = {readers[0]!r}"
        )
    if not 0 < buffer.len <= buffer.max_resp_len:
        problems.append(
            f"reward.overlong_buffer.len = {buffer.len} must be > 0 and ≤ "
            f"reward.overlong_buffer.max_resp_len = {buffer.max_resp_len} tokens"
        )
    if reward.score_in_rollout:
        problems.append(
            "reward.overlong_buffer.enable = true with reward.score_in_rollout = true: the "
            "overlong penalty with the rollout's own scoring is not implemented; set "
            "reward.score_in_rollout = false"
        )
    return problems
