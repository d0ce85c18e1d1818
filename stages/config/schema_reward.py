"""``reward.*``: how responses are scored (verl 0.9.1's layout).

The rule-based route scores each sample in a worker pool; the model route runs a batch reward
model. verl's older top-level ``reward_model`` / ``custom_reward_function`` blocks are accepted as
aliases and moved here (``stages.config.aliases``).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from stages.config._base import ConfigModel
from stages.config.choices import RewardManagerName


class CustomRewardFunctionConfig(ConfigModel):
    """A user scoring function loaded from a Python file (verl's ``compute_score`` signature)."""

    path: str | None = Field(
        None, description="Python file defining the function; null = the built-in scorers (path)"
    )
    name: str = Field("compute_score", description="Function name inside that file (name)")


class RewardModelConfig(ConfigModel):
    """A batch reward model that writes rm_scores (route B)."""

    enable: bool = Field(False, description="Score with a reward model (bool)")
    model_path: str | None = Field(
        None, description="Reward model directory or hub id; required when enabled (path)"
    )
    trust_remote_code: bool = Field(False, description="Allow the model's own code (bool)")
    micro_batch_size_per_gpu: int | None = Field(
        None,
        ge=1,
        description="Sequences per reward-model forward pass; null = one chunk per worker [ppoflow-only] (sequences)",
    )
    combine: Literal["replace", "sum"] = Field(
        "replace",
        description="With the reward model on: replace = its score only as in verl, sum = plus the per-sample scorer's [ppoflow-only] (replace|sum)",
    )


class RewardManagerConfig(ConfigModel):
    """Which of verl's reward managers the per-sample scoring follows."""

    name: RewardManagerName = Field(
        "naive",
        description="A name in stages.reward.managers.REWARD_MANAGERS: naive (the scorer's score) or dapo (the score plus reward.overlong_buffer's penalty when enabled) (name)",
    )


class OverlongBufferConfig(ConfigModel):
    """DAPO's soft overlong punishment (verl's reward.reward_kwargs.overlong_buffer_cfg):
    penalty = min(-(L - (max_resp_len - len)) / len · penalty_factor, 0) added to the score of a
    response of L valid tokens."""

    enable: bool = Field(
        False, description="Add the overlong penalty; needs reward_manager.name = dapo (bool)"
    )
    len: int = Field(
        0,
        ge=0,
        description="The buffer: the last tokens before max_resp_len in which the penalty grows from 0 to -penalty_factor; > 0 and ≤ max_resp_len when enabled (tokens)",
    )
    penalty_factor: float = Field(
        1.0, ge=0, description="The penalty at max_resp_len is -penalty_factor (reward)"
    )
    log: bool = Field(
        False,
        description="Add the reward extras overlong_reward (the penalty) and overlong (penalty < 0) per sample (bool)",
    )
    max_resp_len: int | None = Field(
        None,
        ge=1,
        description="The response length the penalty reaches -penalty_factor at (verl's reward_kwargs.max_resp_len); null = data.max_response_length (tokens)",
    )


class RewardConfig(ConfigModel):
    """Scoring: worker pool, per-sample timeout, error score, custom function, reward model."""

    num_workers: int = Field(
        8,
        ge=1,
        description="Concurrent reward workers; batches are padded to a multiple of it (workers)",
    )
    timeout_s: float = Field(
        60.0,
        gt=0,
        description="Per-sample scoring timeout; a sample past it gets error_score [ppoflow-only] (seconds)",
    )
    startup_timeout_s: float = Field(
        60.0,
        gt=0,
        description="Bound on importing the scorer's module (custom file or built-in) when the run starts; past it the run stops naming the file [ppoflow-only] (seconds)",
    )
    worker_memory_mb: int | None = Field(
        4096,
        ge=1,
        description="Address space a scorer worker may add to what it had when forked (RLIMIT_AS, inherited by processes the scorer starts; each thread it starts reserves about 72 MiB); past it the sample is an error and the worker is replaced; null = no limit [ppoflow-only] (MiB)",
    )
    worker_output_bytes: int | None = Field(
        1048576,
        ge=0,
        description="Scorer workers' stdout and stderr passed on to the run's log per batch; the rest is dropped, counted and noted in one line; null = no limit [ppoflow-only] (bytes)",
    )
    error_score: float = Field(
        0.0,
        description="Score of a sample whose scorer raised, timed out or returned NaN; counted in a metric [ppoflow-only] (reward)",
    )
    max_invalid_fraction: float = Field(
        1.0,
        ge=0.0,
        le=1.0,
        description="Stop the run when more than this share of a batch got no score (raised, timed out, non-number); 1.0 = only when every sample failed [ppoflow-only] (fraction)",
    )
    score_in_rollout: bool | None = Field(
        None,
        description="Score each trajectory inside the rollout as soon as it finishes, while others still generate (the reward stage then passes the scores on); null = on for agent rollouts that may use tools, off for single-turn ones; needs the rule-based loop without reward_model [ppoflow-only] (bool)",
    )
    custom_reward_function: CustomRewardFunctionConfig = Field(
        default_factory=CustomRewardFunctionConfig, description="User scoring function (section)"
    )
    reward_model: RewardModelConfig = Field(
        default_factory=RewardModelConfig, description="Batch reward model (section)"
    )
    reward_manager: RewardManagerConfig = Field(
        default_factory=RewardManagerConfig, description="verl's reward manager (section)"
    )
    overlong_buffer: OverlongBufferConfig = Field(
        default_factory=OverlongBufferConfig,
        description="DAPO's overlong reward shaping (section)",
    )
