"""The settings every policy loss reads, resolved once from any verl-shaped actor config.

verl's losses read ``config.clip_ratio``, ``config.policy_loss.clip_cov_ratio`` … from an
``ActorConfig``. ppoflow accepts the same names from a pydantic model, a dataclass, an OmegaConf
node or a plain mapping, and resolves them in one place (:func:`resolve_policy_loss_config`) into a
frozen :class:`PolicyLossConfig`; the losses then read typed fields. The defaults live only on the
dataclass and are verl 0.9.1's ``actor.yaml`` values.

Also here: the ``POLICY_LOSSES`` registry and the uniform loss signature
(:class:`PolicyLossFn`); the losses themselves are in ``policy_losses.py`` and
``policy_losses_cov.py``.

Example:
    >>> cfg = resolve_policy_loss_config({"clip_ratio": 0.2, "clip_ratio_high": 0.28,
    ...                                   "policy_loss": {"loss_mode": "gspo"}})
    >>> cfg.loss_mode, cfg.clip_low, cfg.clip_high, cfg.clip_ratio_c
    ('gspo', 0.2, 0.28, 3.0)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any, Protocol

import torch
from torch import Tensor

from stages.algos.aggregation import GlobalBatchInfo
from stages.registry import Registry

#: fields read from ``config.policy_loss`` (verl's nested PolicyLossConfig); the rest are top level
NESTED_POLICY_LOSS_FIELDS = (
    "loss_mode",
    "clip_cov_ratio",
    "clip_cov_lb",
    "clip_cov_ub",
    "kl_cov_ratio",
    "ppo_kl_coef",
)


@dataclass(frozen=True)
class PolicyLossConfig:
    """Typed view of the actor settings the policy losses use (verl names and defaults).

    Attributes:
        clip_ratio: PPO ε, used for each side when clip_ratio_low / clip_ratio_high is None.
        clip_ratio_low: ε_low, the ratio is clipped at 1 − ε_low.
        clip_ratio_high: ε_high, the ratio is clipped at 1 + ε_high.
        clip_ratio_c: dual-clip bound c for A < 0 (arXiv:1912.09729); must be > 1.
        loss_agg_mode: default aggregation (``agg_loss`` mode) for the loss.
        loss_mode: policy loss name in ``POLICY_LOSSES`` (verl: policy_loss.loss_mode).
        clip_cov_ratio: clip_cov: fraction of valid tokens whose gradient is dropped.
        clip_cov_lb: clip_cov: lower bound of the covariance window.
        clip_cov_ub: clip_cov: upper bound of the covariance window.
        kl_cov_ratio: kl_cov: fraction of valid tokens that get the |log r| penalty.
        ppo_kl_coef: kl_cov: coefficient of the |log r| penalty.
        tau_pos: sapo: gate temperature for A > 0.
        tau_neg: sapo: gate temperature for A ≤ 0.
        global_batch_info: global denominators for ``agg_loss`` (verl: config.global_batch_info).
    """

    clip_ratio: float = 0.2
    clip_ratio_low: float | None = None
    clip_ratio_high: float | None = None
    clip_ratio_c: float = 3.0
    loss_agg_mode: str = "token-mean"
    loss_mode: str = "vanilla"
    clip_cov_ratio: float = 0.0002
    clip_cov_lb: float = 1.0
    clip_cov_ub: float = 5.0
    kl_cov_ratio: float = 0.0002
    ppo_kl_coef: float = 0.1
    tau_pos: float = 1.0
    tau_neg: float = 1.05
    global_batch_info: GlobalBatchInfo = field(default_factory=GlobalBatchInfo)

    @property
    def clip_low(self) -> float:
        """ε_low, falling back to clip_ratio."""
        return self.clip_ratio if self.clip_ratio_low is None else self.clip_ratio_low

    @property
    def clip_high(self) -> float:
        """ε_high, falling back to clip_ratio."""
        return self.clip_ratio if self.clip_ratio_high is None else self.clip_ratio_high


_MISSING = object()


def _read(source: Any, name: str) -> Any:
    """``source.name`` or ``source[name]``; ``_MISSING`` when absent or None (→ the default)."""
    if source is None:
        return _MISSING
    if isinstance(source, Mapping):
        value = source.get(name, _MISSING)
    else:
        value = getattr(source, name, _MISSING)
    return _MISSING if value is None else value


def read_settings(
    config: Any, settings_type: type, nested_fields: tuple[str, ...] = ()
) -> dict[str, Any]:
    """The fields of dataclass ``settings_type`` present (and not None) in ``config``.

    ``config`` may be an object (pydantic, dataclass, OmegaConf) or a mapping; fields named in
    ``nested_fields`` are read from ``config.policy_loss``. Absent fields are left out, so the
    dataclass defaults apply — the only place defaults are filled in.
    """
    nested = _read(config, "policy_loss")
    nested = None if nested is _MISSING else nested
    values: dict[str, Any] = {}
    for spec in fields(settings_type):
        value = _read(nested if spec.name in nested_fields else config, spec.name)
        if value is not _MISSING:
            values[spec.name] = value
    return values


def resolve_policy_loss_config(config: Any) -> PolicyLossConfig:
    """Read the verl-named actor settings from ``config`` (object or mapping) into PolicyLossConfig.

    Missing or None values take the dataclass default; nested fields come from
    ``config.policy_loss``; ``global_batch_info`` may be a dict or a GlobalBatchInfo.
    """
    if isinstance(config, PolicyLossConfig):
        return config
    values = read_settings(config, PolicyLossConfig, NESTED_POLICY_LOSS_FIELDS)
    if "global_batch_info" in values:
        values["global_batch_info"] = GlobalBatchInfo.coerce(values["global_batch_info"])
    return PolicyLossConfig(**values)


def log_ratio_clamped(log_prob: Tensor, old_log_prob: Tensor, bound: float = 20.0) -> Tensor:
    """(B, R) clamp(logp − old_logp, −bound, bound): log r, safe to exponentiate."""
    return torch.clamp(log_prob - old_log_prob, min=-bound, max=bound)


def zero_masked(values: Tensor, response_mask: Tensor) -> Tensor:
    """(B, R) values with masked-out entries replaced by 0 through ``torch.where``.

    Applied to the differentiable input (log_prob): the gradient at masked positions is then
    exactly 0 even if the loss there is NaN/inf (from garbage in padding), so nothing leaks into
    the model's gradient.
    """
    return torch.where(
        response_mask.bool(), values, torch.zeros((), dtype=values.dtype, device=values.device)
    )


class PolicyLossFn(Protocol):
    """The one signature of every entry in ``POLICY_LOSSES``.

    Args:
        old_log_prob: (B, R) log π_old of the sampled tokens (rollout-time policy).
        log_prob: (B, R) log π_θ of the same tokens, differentiable.
        advantages: (B, R) token advantages.
        response_mask: (B, R) 1 = response token that counts.
        loss_agg_mode: ``agg_loss`` mode (some losses fix their own; see each docstring).
        config: actor config, anything :func:`resolve_policy_loss_config` accepts.
        rollout_is_weights: optional (B, R) importance weights multiplied into the token loss.
        global_batch_info: denominators for ``agg_loss``; None = ``config.global_batch_info``.
        generator: RNG for losses that sample tokens (clip_cov); None = torch's global RNG.

    Returns:
        (pg_loss scalar, metrics) — metrics are detached 0-d tensors keyed ``actor/...``.
    """

    def __call__(
        self,
        old_log_prob: Tensor,
        log_prob: Tensor,
        advantages: Tensor,
        response_mask: Tensor,
        loss_agg_mode: str = "token-mean",
        config: Any = None,
        rollout_is_weights: Tensor | None = None,
        global_batch_info: GlobalBatchInfo | Mapping[str, Any] | None = None,
        generator: torch.Generator | None = None,
    ) -> tuple[Tensor, dict[str, Tensor]]: ...


POLICY_LOSSES: Registry[PolicyLossFn] = Registry("policy loss")


def register_policy_loss(name: str) -> Callable[[PolicyLossFn], PolicyLossFn]:
    """Decorator adding a loss with the :class:`PolicyLossFn` signature under ``name``."""
    return POLICY_LOSSES.register(name)


def resolve_global_info(
    cfg: PolicyLossConfig, global_batch_info: GlobalBatchInfo | Mapping[str, Any] | None
) -> GlobalBatchInfo:
    """The explicit argument wins; otherwise the config's ``global_batch_info``."""
    return (
        cfg.global_batch_info
        if global_batch_info is None
        else GlobalBatchInfo.coerce(global_batch_info)
    )
