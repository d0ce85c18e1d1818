"""The settings every policy loss reads, built once from the actor's config slice.

verl's losses read ``config.clip_ratio``, ``config.policy_loss.clip_cov_ratio`` … from an
``ActorConfig``. ppoflow's engines build a frozen :class:`PolicyLossSettings` from the typed slice
(:meth:`PolicyLossSettings.from_actor`, ``stages.config.schema_actor.ActorConfig``); the losses
then read typed fields. The settings carry no defaults of their own: the schema's fields are the
one source. For verl's API (a plain mapping, OmegaConf node or dataclass, as verl users pass),
:func:`resolve_policy_loss_config` reads the fields present and takes every absent one from the
schema's defaults.

Also here: the ``POLICY_LOSSES`` registry, whose entries are :class:`PolicyLossSpec` (the loss
function with the uniform signature :class:`PolicyLossFn`, and the settings it reads); the losses
themselves are in ``policy_losses.py`` and ``policy_losses_cov.py``.

Example:
    >>> cfg = resolve_policy_loss_config({"clip_ratio": 0.2, "clip_ratio_high": 0.28,
    ...                                   "policy_loss": {"loss_mode": "gspo"}})
    >>> cfg.loss_mode, cfg.clip_low, cfg.clip_high, cfg.clip_ratio_c
    ('gspo', 0.2, 0.28, 3.0)
    >>> resolve_policy_loss_config({"clip_ratio": 0.3}).clip_low  # null ε_low inherits clip_ratio
    0.3
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import torch
from torch import Tensor

from stages.algos.aggregation import GlobalBatchInfo
from stages.registry import Registry

if TYPE_CHECKING:
    from stages.config.schema_actor import ActorConfig

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
class PolicyLossSettings:
    """Typed view of the actor settings the policy losses use (verl's names; no defaults here).

    Each field is the ``actor_rollout_ref.actor`` key of the same name (``policy_loss.*`` for the
    nested ones), whose description and default live in ``stages.config.schema_actor``.

    Attributes:
        clip_ratio: PPO ε, used for each side when clip_ratio_low / clip_ratio_high is None.
        clip_ratio_low: ε_low, the ratio is clipped at 1 − ε_low; None = clip_ratio.
        clip_ratio_high: ε_high, the ratio is clipped at 1 + ε_high; None = clip_ratio.
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

    clip_ratio: float
    clip_ratio_low: float | None
    clip_ratio_high: float | None
    clip_ratio_c: float
    loss_agg_mode: str
    loss_mode: str
    clip_cov_ratio: float
    clip_cov_lb: float
    clip_cov_ub: float
    kl_cov_ratio: float
    ppo_kl_coef: float
    tau_pos: float
    tau_neg: float
    global_batch_info: GlobalBatchInfo

    @classmethod
    def from_actor(
        cls, actor: ActorConfig, global_batch_info: GlobalBatchInfo | None = None
    ) -> PolicyLossSettings:
        """The settings of a typed ``actor_rollout_ref.actor`` slice (every field read from it)."""
        top = {name: getattr(actor, name) for name in _TOP_LEVEL_FIELDS}
        nested = {name: getattr(actor.policy_loss, name) for name in NESTED_POLICY_LOSS_FIELDS}
        info = GlobalBatchInfo() if global_batch_info is None else global_batch_info
        return cls(**top, **nested, global_batch_info=info)

    @property
    def clip_low(self) -> float:
        """ε_low, falling back to clip_ratio."""
        return self.clip_ratio if self.clip_ratio_low is None else self.clip_ratio_low

    @property
    def clip_high(self) -> float:
        """ε_high, falling back to clip_ratio."""
        return self.clip_ratio if self.clip_ratio_high is None else self.clip_ratio_high


_TOP_LEVEL_FIELDS = tuple(
    f.name
    for f in dataclasses.fields(PolicyLossSettings)
    if f.name not in NESTED_POLICY_LOSS_FIELDS and f.name != "global_batch_info"
)

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
    ``nested_fields`` are read from ``config.policy_loss``. Absent fields are left out: the caller
    takes them from the schema's defaults (verl's API only; typed slices are read whole).
    """
    nested = _read(config, "policy_loss")
    nested = None if nested is _MISSING else nested
    values: dict[str, Any] = {}
    for spec in dataclasses.fields(settings_type):
        value = _read(nested if spec.name in nested_fields else config, spec.name)
        if value is not _MISSING:
            values[spec.name] = value
    return values


@functools.cache
def default_actor() -> ActorConfig:
    """The schema's default ``actor_rollout_ref.actor`` slice: the fallback of verl-style configs."""
    # imported here: the schema imports this module's registry to validate loss names
    from stages.config.schema_actor import ActorConfig

    return ActorConfig()


def resolve_policy_loss_config(config: Any) -> PolicyLossSettings:
    """The policy-loss settings of ``config``: settings, a typed actor slice, or verl-style.

    A typed ``ActorConfig`` is read whole. Anything else (mapping, OmegaConf, dataclass, None) is
    verl's API: the fields present and not None are read (nested ones from ``config.policy_loss``,
    ``global_batch_info`` as a dict or GlobalBatchInfo), and every other field is the schema's
    default (:func:`default_actor`).
    """
    from stages.config.schema_actor import ActorConfig

    if isinstance(config, PolicyLossSettings):
        return config
    if isinstance(config, ActorConfig):
        return PolicyLossSettings.from_actor(config)
    values = read_settings(config, PolicyLossSettings, NESTED_POLICY_LOSS_FIELDS)
    if "global_batch_info" in values:
        values["global_batch_info"] = GlobalBatchInfo.coerce(values["global_batch_info"])
    return dataclasses.replace(PolicyLossSettings.from_actor(default_actor()), **values)


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


@dataclass(frozen=True)
class PolicyLossSpec:
    """One ``POLICY_LOSSES`` entry: the loss and what it needs from the settings.

    Attributes:
        fn: the loss, with the :class:`PolicyLossFn` signature.
        reads: the :class:`PolicyLossSettings` knobs the loss reads besides ``loss_agg_mode`` and
            ``global_batch_info`` (e.g. ``clip_ratio_c``; a test checks each declaration).
    """

    fn: PolicyLossFn
    reads: frozenset[str]


POLICY_LOSSES: Registry[PolicyLossSpec] = Registry("policy loss")

_SETTINGS_FIELDS = frozenset(f.name for f in dataclasses.fields(PolicyLossSettings))


def register_policy_loss(
    name: str, *, reads: tuple[str, ...] = ()
) -> Callable[[PolicyLossFn], PolicyLossFn]:
    """Decorator adding a loss with the :class:`PolicyLossFn` signature under ``name``.

    ``reads`` names the :class:`PolicyLossSettings` fields the loss reads (clip_ratio_c, tau_pos,
    …); an unknown field name raises ``ValueError``. The decorated function is returned unchanged.
    """
    unknown = sorted(set(reads) - _SETTINGS_FIELDS)
    if unknown:
        raise ValueError(
            f"policy loss {name!r} reads {unknown}, which are not PolicyLossSettings fields; "
            f"known: {sorted(_SETTINGS_FIELDS)}"
        )

    def add(fn: PolicyLossFn) -> PolicyLossFn:
        POLICY_LOSSES.add(name, PolicyLossSpec(fn=fn, reads=frozenset(reads)))
        return fn

    return add


def resolve_global_info(
    cfg: PolicyLossSettings, global_batch_info: GlobalBatchInfo | Mapping[str, Any] | None
) -> GlobalBatchInfo:
    """The explicit argument wins; otherwise the config's ``global_batch_info``."""
    return (
        cfg.global_batch_info
        if global_batch_info is None
        else GlobalBatchInfo.coerce(global_batch_info)
    )
