"""The settings every policy loss reads, built once from the actor's config slice.

verl's losses read ``config.clip_ratio``, ``config.policy_loss.clip_cov_ratio`` … from an
``ActorConfig``. ppoflow's engines pass the typed ``actor_rollout_ref.actor`` slice of the run
config; :func:`resolve_policy_loss_config` turns it (or anything verl users pass: a plain mapping,
an OmegaConf node, a dataclass) into a frozen :class:`PolicyLossSettings`, and the losses then read
typed fields. The settings carry no defaults of their own: a field the config does not hold (or
holds as None) takes its default from :mod:`stages.algos.defaults`, the one table the run config's
schema takes its defaults from too. This module reads settings and never imports the schema.

Also here: the ``POLICY_LOSSES`` registry, whose entries are :class:`PolicyLossSpec` (the loss
function with the uniform signature :class:`PolicyLossFn`, and the settings it reads); the losses
themselves are in ``policy_losses.py`` and ``policy_losses_cov.py``, each registered where it is
defined.

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
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, Protocol

import torch
from torch import Tensor

from stages.algos.aggregation import GlobalBatchInfo
from stages.algos.defaults import ACTOR_LOSS_DEFAULTS, POLICY_LOSS_DEFAULTS
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
class PolicyLossSettings:
    """Typed view of the actor settings the policy losses use (verl's names; no defaults here).

    Each field is the ``actor_rollout_ref.actor`` key of the same name (``policy_loss.*`` for the
    nested ones): its description is the run config schema's, its default is in
    :mod:`stages.algos.defaults`.

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
        cls, actor: Any, global_batch_info: GlobalBatchInfo | None = None
    ) -> PolicyLossSettings:
        """The settings of an object shaped like the ``actor_rollout_ref.actor`` slice (every field
        read from it as is: ``actor.<field>``, ``actor.policy_loss.<field>`` for the nested ones)."""
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
    takes them from :mod:`stages.algos.defaults`.
    """
    nested = _read(config, "policy_loss")
    nested = None if nested is _MISSING else nested
    values: dict[str, Any] = {}
    for spec in dataclasses.fields(settings_type):
        value = _read(nested if spec.name in nested_fields else config, spec.name)
        if value is not _MISSING:
            values[spec.name] = value
    return values


def default_actor() -> SimpleNamespace:
    """The defaults of the actor settings the losses read (:mod:`stages.algos.defaults`), shaped
    like the ``actor_rollout_ref.actor`` slice (``policy_loss.*`` nested): the fallback of every
    field a config leaves out.

    >>> default_actor().clip_ratio, default_actor().policy_loss.loss_mode
    (0.2, 'vanilla')
    """
    return SimpleNamespace(
        **ACTOR_LOSS_DEFAULTS, policy_loss=SimpleNamespace(**POLICY_LOSS_DEFAULTS)
    )


def resolve_policy_loss_config(config: Any) -> PolicyLossSettings:
    """The policy-loss settings of ``config``: settings as they are, else read from the config.

    The config is the run config's typed actor slice or anything verl's API takes (mapping,
    OmegaConf, dataclass, None): the fields present and not None are read (nested ones from
    ``config.policy_loss``, ``global_batch_info`` as a dict or GlobalBatchInfo), and every other
    field is its default (:func:`default_actor`). A typed slice holds every field, and each field
    it may hold as None defaults to None, so it is read whole.
    """
    if isinstance(config, PolicyLossSettings):
        return config
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
