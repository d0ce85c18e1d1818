"""The reward settings the reward code reads, and the one adapter from the run config.

Everything in ``stages.reward`` takes a :class:`RewardSettings` (or plain parameters), never the
run config, so :func:`settings_from_config` is the only place that knows the config's layout.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from dataproto import keys as K
from stages.reward.managers import REWARD_MANAGERS
from stages.reward.overlong import OverlongBuffer

#: how the reward model's score and the rule-based score combine when both run
Combine = Literal["replace", "sum"]


@dataclass(frozen=True)
class RewardSettings:
    """Reward settings (the ``reward`` config section).

    num_workers: scorer processes of the reward loop, and the divisor the reward model pads to.
    timeout_s: per-sample scoring time limit in seconds (None: unbounded).
    startup_timeout_s: bound in seconds on importing the scorer's module when the pool starts.
    worker_memory_mb: address space (MiB) a scorer worker may add to what it was forked with
        (``RLIMIT_AS``); past it the sample is an ``error`` and the worker is replaced (None: no
        bound).
    worker_output_bytes: bytes of the workers' stdout and stderr passed on to the run's log per
        batch; the rest is dropped and counted (None: no bound, the workers write to the
        driver's own stdout and stderr).
    error_score: the score of a sample whose scorer raised, timed out or returned a non-number.
    max_invalid_fraction: the run stops when more than this share of a batch's samples got no
        score (raised, timed out, invalid); 1.0 stops only when every sample of a batch failed.
    custom_path / custom_name: a custom scorer file and function (None: route by data_source).
    scorer_kwargs: extra keyword arguments passed to every scorer call.
    reward_fn_key: ``data.reward_fn_key``, the column whose value routes each row: ``data_source``
        (the default) reads ``non_tensor_batch["data_source"]``; any other column was loaded as
        ``non_tensor_batch["reward_route"]`` (``stages.data.dataset``), which is read instead.
    reward_model_enable / reward_model_path: route B, a sequence-classification reward model.
    reward_model_micro_batch: sequences per reward-model forward (None: one chunk per worker).
    reward_model_trust_remote_code: let the reward model run its own modelling code.
    combine: with the reward model enabled, ``replace`` uses its score alone (verl); ``sum`` adds
        the rule-based (loop) score to it.
    overlong: DAPO's overlong shaping added to every score (``stages.reward.overlong``), None
        when the reward manager does not apply it or it is off.
    """

    num_workers: int = 8
    timeout_s: float | None = 60.0
    startup_timeout_s: float = 60.0
    worker_memory_mb: int | None = 4096
    worker_output_bytes: int | None = 1 << 20
    error_score: float = 0.0
    max_invalid_fraction: float = 1.0
    custom_path: str | None = None
    custom_name: str = "compute_score"
    scorer_kwargs: dict[str, Any] = field(default_factory=dict)
    reward_fn_key: str = "data_source"
    reward_model_enable: bool = False
    reward_model_path: str | None = None
    reward_model_micro_batch: int | None = None
    reward_model_trust_remote_code: bool = False
    combine: Combine = "replace"
    overlong: OverlongBuffer | None = None

    def __post_init__(self) -> None:
        if self.num_workers < 1:
            raise ValueError(f"reward.num_workers must be >= 1, got {self.num_workers}")
        if self.timeout_s is not None and self.timeout_s <= 0:
            raise ValueError(f"reward.timeout_s must be > 0 seconds or None, got {self.timeout_s}")
        if self.startup_timeout_s <= 0:
            raise ValueError(
                f"reward.startup_timeout_s must be > 0 seconds, got {self.startup_timeout_s}"
            )
        if self.worker_memory_mb is not None and self.worker_memory_mb < 1:
            raise ValueError(
                f"reward.worker_memory_mb must be >= 1 MiB or None, got {self.worker_memory_mb}"
            )
        if self.worker_output_bytes is not None and self.worker_output_bytes < 0:
            raise ValueError(
                f"reward.worker_output_bytes must be >= 0 bytes or None, got "
                f"{self.worker_output_bytes}"
            )
        if not 0.0 <= self.max_invalid_fraction <= 1.0:
            raise ValueError(
                f"reward.max_invalid_fraction must be in [0, 1], got {self.max_invalid_fraction}"
            )
        if self.combine not in ("replace", "sum"):
            raise ValueError(f"reward combine must be 'replace' or 'sum', got {self.combine!r}")
        if not self.reward_fn_key:
            raise ValueError("data.reward_fn_key must name a column, got an empty string")
        if self.reward_model_enable and not self.reward_model_path:
            raise ValueError(
                "reward.reward_model.enable = true needs reward.reward_model.model_path"
            )

    @property
    def route_key(self) -> str:
        """The non-tensor key holding each row's route: ``data_source`` or ``reward_route``."""
        return K.DATA_SOURCE if self.reward_fn_key == K.DATA_SOURCE else K.REWARD_ROUTE

    @property
    def routes_by_registry(self) -> bool:
        """Whether each row's route must name a built-in scorer: the loop runs the router."""
        return self.uses_loop and self.custom_path is None

    @property
    def uses_loop(self) -> bool:
        """Whether the per-sample reward loop runs (no reward model, or the sum rule)."""
        return not self.reward_model_enable or self.combine == "sum"


#: config attributes read by settings_from_config that can change the reward stage's result (its
#: cache-key inputs); reward.startup_timeout_s cannot (it only bounds the scorer's import), nor
#: reward.worker_output_bytes (it bounds what reaches the log); reward.worker_memory_mb can, as
#: reward.timeout_s can (a sample past either bound is an error)
CONFIG_KEYS = (
    "reward.num_workers",
    "reward.timeout_s",
    "reward.worker_memory_mb",
    "reward.error_score",
    "reward.max_invalid_fraction",
    "reward.custom_reward_function.path",
    "reward.custom_reward_function.name",
    "reward.reward_model.enable",
    "reward.reward_model.model_path",
    "reward.reward_model.micro_batch_size_per_gpu",
    "reward.reward_model.trust_remote_code",
    "reward.reward_model.combine",
    "data.reward_fn_key",
    "reward.reward_manager.name",
    "reward.overlong_buffer.enable",
    "reward.overlong_buffer.len",
    "reward.overlong_buffer.penalty_factor",
    "reward.overlong_buffer.log",
    "reward.overlong_buffer.max_resp_len",
)
#: config paths naming files the reward stage reads: the custom reward file, the reward model
#: directory, the tokenizer that decodes responses; their contents enter the cache key
FILE_KEYS = (
    "reward.custom_reward_function.path",
    "reward.reward_model.model_path",
    "actor_rollout_ref.model.tokenizer_path",
)


def settings_from_config(config: Any) -> RewardSettings:
    """The :class:`RewardSettings` of a run config (``stages.config.PPORunConfig``)."""
    return settings_from_sections(config.reward, config.data)


def settings_from_sections(reward: Any, data: Any) -> RewardSettings:
    """The :class:`RewardSettings` of a run config's ``reward`` and ``data`` sections."""
    return RewardSettings(
        num_workers=reward.num_workers,
        timeout_s=reward.timeout_s,
        startup_timeout_s=reward.startup_timeout_s,
        worker_memory_mb=reward.worker_memory_mb,
        worker_output_bytes=reward.worker_output_bytes,
        error_score=reward.error_score,
        max_invalid_fraction=reward.max_invalid_fraction,
        custom_path=reward.custom_reward_function.path,
        custom_name=reward.custom_reward_function.name,
        reward_model_enable=reward.reward_model.enable,
        reward_model_path=reward.reward_model.model_path,
        reward_model_micro_batch=reward.reward_model.micro_batch_size_per_gpu,
        reward_model_trust_remote_code=reward.reward_model.trust_remote_code,
        combine=reward.reward_model.combine,
        reward_fn_key=data.reward_fn_key,
        overlong=overlong_buffer(reward),
    )


def overlong_buffer(reward: Any) -> OverlongBuffer | None:
    """The overlong shaping of a ``reward`` section, when on and applied by its manager."""
    buffer = reward.overlong_buffer
    if not (
        buffer.enable and REWARD_MANAGERS.get(reward.reward_manager.name).reads_overlong_buffer
    ):
        return None
    return OverlongBuffer(True, buffer.len, buffer.penalty_factor, buffer.log, buffer.max_resp_len)
