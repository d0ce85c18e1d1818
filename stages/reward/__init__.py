"""Reward: scorers, the per-sample reward loop (route A), the batch reward model (route B), the
placement rule and the reward stage.

Names are imported on first use (PEP 562), so a scorer worker process that imports
``stages.reward.worker`` does not pay for torch or transformers.
"""

from __future__ import annotations

from stages.lazy_exports import lazy_exports

_EXPORTS = {
    "assemble_rm_scores": "stages.reward.placement",
    "response_lengths": "stages.reward.placement",
    "default_compute_score": "stages.reward.scorers.registry",
    "get_scorer": "stages.reward.scorers.registry",
    "SCORERS": "stages.reward.scorers.registry",
    "ScorerRef": "stages.reward.custom",
    "DEFAULT_SCORER": "stages.reward.custom",
    "load_custom_scorer": "stages.reward.custom",
    "Outcome": "stages.reward.worker",
    "ScorerFailureError": "stages.reward.accounting",
    "ScorerStartupError": "stages.reward.zygote",
    "ScorerProcessError": "stages.reward.zygote",
    "classify_result": "stages.reward.worker",
    "ScorerPool": "stages.reward.pool",
    "RewardLoop": "stages.reward.loop",
    "LoopResult": "stages.reward.accounting",
    "RewardModel": "stages.reward.reward_model",
    "RewardSettings": "stages.reward.settings",
    "settings_from_config": "stages.reward.settings",
    "REWARD_STAGE": "stages.reward.stage",
    "BASELINE_REWARD_STAGE": "stages.reward.baseline",
    "build_reward_engines": "stages.reward.stage",
    "close_reward_engines": "stages.reward.stage",
    "compute_reward": "stages.reward.stage",
    "needs_scoring": "stages.reward.stage",
}

__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
