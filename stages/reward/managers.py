"""verl's reward managers as registry entries: what each adds to the scorer's score.

ppoflow always scores each sample with its scorer (``stages.reward.loop``); a manager entry
declares what verl's manager of that name does beyond it, and callers ask the entry, never the
name:

- ``naive``: the scorer's score (verl's default manager).
- ``dapo``: the score plus DAPO's overlong penalty (``stages.reward.overlong``) when
  ``reward.overlong_buffer.enable`` (verl's DAPO manager, which reads ``overlong_buffer_cfg``).
"""

from __future__ import annotations

from dataclasses import dataclass

from stages.registry import Registry


@dataclass(frozen=True)
class RewardManagerSpec:
    """reads_overlong_buffer: the manager applies ``reward.overlong_buffer`` (verl passes
    ``overlong_buffer_cfg`` only to its DAPO manager; the others refuse it)."""

    reads_overlong_buffer: bool


REWARD_MANAGERS = Registry[RewardManagerSpec]("reward manager")
REWARD_MANAGERS.add("naive", RewardManagerSpec(reads_overlong_buffer=False))
REWARD_MANAGERS.add("dapo", RewardManagerSpec(reads_overlong_buffer=True))
