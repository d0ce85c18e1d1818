"""Rollout correction: importance weights and rejection masks for the rollout/training mismatch.

verl 0.9.1's ``algorithm.rollout_correction`` (its ``rollout_corr_helper``). The rollout engine
samples from π_rollout; training computes π_train for the same tokens (``old_log_probs`` in
decoupled mode, the current π_θ inside the loss in bypass mode). With log r = log π_train −
log π_rollout per token (B samples, R response tokens, everything (B, R) unless said otherwise):

**Importance weights** (``rollout_is``, entries of :data:`ROLLOUT_IS_MODES`), S = 20:

- ``token``: w_t = exp(clamp(log r_t, −S, S)) · m_t;
- ``sequence``: w_t = exp(clamp(Σ_s m_s log r_s, −S, S)) · m_t (one weight per row).

``rollout_is_threshold`` u (a number) truncates: w = min(w, u) (TIS, no lower clamp); (lo, hi)
(verl's ``"lo_hi"``) zeroes instead: w = w if lo ≤ w ≤ hi else 0 (IcePop; the mask is unchanged).
The weights are detached. ``rollout_is_batch_normalize`` then divides them by their mean (token
mode: over the response tokens; sequence mode: over the non-empty rows, each row's mean weight),
unless that mean is ≤ 1e-8.

**Rejection sampling** (``rollout_rs``, entries of :data:`ROLLOUT_RS_OPTIONS`): with x = clamp(log r,
−S, S), k1 = −x, k2 = ½x², k3 = eˣ − 1 − x per token. ``token_k*`` judge each token,
``seq_sum_k*`` / ``seq_mean_k*`` / ``seq_max_k*`` the masked sum, mean or max of a row (the max
of an empty row is 0), the verdict holding for every token of the row. A k1 option keeps
log(lo) ≤ k1 ≤ log(hi) (k1 = log(1/r), so its bounds are bounds on 1/r); k2 / k3 keep k ≤ hi.
The new mask is m · Π_options keep: every listed check must pass.

**Mismatch metrics** (:func:`mismatch_metrics`, always logged): KL, k3-KL, perplexities, χ².

Every metric is a detached 0-d tensor; the functions name them ``<name>`` and
:func:`compute_rollout_correction` / :func:`prefixed` log them as ``rollout_corr/<name>``
(:data:`PREFIX`). Sequence statistics are over the non-empty rows. A batch with no response token
gets no weights (zeros), an unchanged mask and no metrics.

Worked example (row A: 3 tokens, row B: 2 tokens and 1 pad; log r = (0.1, −0.2, 0.4 | 0.0, 1.2)):
    >>> train = torch.tensor([[-0.9, -0.7, -1.6], [-0.3, -0.8, 0.0]])
    >>> rollout = torch.tensor([[-1.0, -0.5, -2.0], [-0.3, -2.0, 0.0]])
    >>> mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    >>> weights, metrics = importance_weights(train - rollout, mask, "token", 2.0)
    >>> weights.round(decimals=4)
    tensor([[1.1052, 0.8187, 1.4918],
            [1.0000, 2.0000, 0.0000]])
    >>> round(metrics["rollout_is_mean"].item(), 4), round(metrics["rollout_is_eff_sample_size"].item(), 4)
    (1.2831, 0.9029)
    >>> kept, rs = rejection_mask(train - rollout, mask, ("token_k1",), ((0.5, 2.0),))
    >>> kept.tolist(), round(rs["rollout_rs_masked_fraction"].item(), 4)
    ([[1, 1, 1], [1, 0, 0]], 0.2)
    >>> round(mismatch_metrics(train, rollout, mask)["chi2_seq"].item(), 4)
    5.4226
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from stages.algos.config_view import read_field
from stages.algos.defaults import ROLLOUT_CORRECTION_DEFAULTS
from stages.algos.masked import MASK_EPS, masked_mean, masked_sum
from stages.registry import Registry

#: exp(±20) bounds every exponentiated log-ratio
SAFETY_BOUND = 20.0
#: every metric of this module is logged as ``rollout_corr/<name>``
PREFIX = "rollout_corr/"
#: a threshold: an upper bound alone, or (lower, upper)
Bounds = float | tuple[float, float]


# --- importance-weight modes -------------------------------------------------------------------


@dataclass(frozen=True)
class RolloutISMode:
    """One ``ROLLOUT_IS_MODES`` entry.

    Attributes:
        log_weights: ``(log_ratio (B, R), mask (B, R) bool) -> (B, R)`` the unclamped log weight
            of every token (``log_ratio`` is 0 outside the mask).
        sequence_level: one weight per row: the metrics' extremes and fractions, and the batch
            normalization, are then over rows instead of tokens.
    """

    log_weights: Callable[[Tensor, Tensor], Tensor]
    sequence_level: bool


ROLLOUT_IS_MODES: Registry[RolloutISMode] = Registry("rollout IS mode")


def register_rollout_is(
    name: str, *, sequence_level: bool
) -> Callable[[Callable[[Tensor, Tensor], Tensor]], Callable[[Tensor, Tensor], Tensor]]:
    """Decorator adding a log-weight function as the IS mode ``name`` (``rollout_is: name``)."""

    def add(fn: Callable[[Tensor, Tensor], Tensor]) -> Callable[[Tensor, Tensor], Tensor]:
        ROLLOUT_IS_MODES.add(name, RolloutISMode(fn, sequence_level))
        return fn

    return add


@register_rollout_is("token", sequence_level=False)
def token_log_weights(log_ratio: Tensor, mask: Tensor) -> Tensor:
    """(B, R) log w_t = log r_t: a weight per token (biased, low variance)."""
    return log_ratio


@register_rollout_is("sequence", sequence_level=True)
def sequence_log_weights(log_ratio: Tensor, mask: Tensor) -> Tensor:
    """(B, R) log w_t = Σ_s m_s log r_s on every token of the row (unbiased, high variance)."""
    return masked_sum(log_ratio, mask, dim=-1).unsqueeze(-1).expand_as(log_ratio)


# --- rejection-sampling options ----------------------------------------------------------------


@dataclass(frozen=True)
class RejectionOption:
    """One ``ROLLOUT_RS_OPTIONS`` entry.

    Attributes:
        divergence: ``x (B, R) -> (B, R)``, the per-token divergence of the clamped log-ratio.
        two_sided: the threshold is a (lo, hi) ratio pair, compared in log space (k1); else one
            upper bound on the divergence.
        reduce: ``(values (B, R), mask (B, R) bool) -> (B,)``, the row statistic of a sequence
            option; None for a token option.
    """

    divergence: Callable[[Tensor], Tensor]
    two_sided: bool
    reduce: Callable[[Tensor, Tensor], Tensor] | None

    @property
    def sequence_level(self) -> bool:
        return self.reduce is not None


ROLLOUT_RS_OPTIONS: Registry[RejectionOption] = Registry("rollout rejection-sampling option")


def k1_divergence(x: Tensor) -> Tensor:
    """k1 = −log r = log(1/r)."""
    return -x


def k2_divergence(x: Tensor) -> Tensor:
    """k2 = ½ (log r)²."""
    return 0.5 * x.square()


def k3_divergence(x: Tensor) -> Tensor:
    """k3 = r − 1 − log r ≥ 0."""
    return torch.exp(x) - 1.0 - x


def row_sum(values: Tensor, mask: Tensor) -> Tensor:
    """(B,) Σ over the row's valid tokens."""
    return masked_sum(values, mask, dim=-1)


def row_mean(values: Tensor, mask: Tensor) -> Tensor:
    """(B,) mean over the row's valid tokens (0 for an empty row)."""
    return masked_mean(values, mask, dim=-1)


def row_max(values: Tensor, mask: Tensor) -> Tensor:
    """(B,) max over the row's valid tokens (0 for an empty row)."""
    best = values.masked_fill(~mask, float("-inf")).max(dim=-1).values
    return torch.where(mask.any(dim=-1), best, torch.zeros_like(best))


def register_rs_option(
    name: str,
    *,
    divergence: Callable[[Tensor], Tensor],
    two_sided: bool,
    reduce: Callable[[Tensor, Tensor], Tensor] | None = None,
) -> None:
    """Add the rejection option ``name`` (``rollout_rs: name``)."""
    ROLLOUT_RS_OPTIONS.add(name, RejectionOption(divergence, two_sided, reduce))


#: verl's options: every divergence per token, per row sum and per row mean; k2 / k3 per row max
_DIVERGENCES = {
    "k1": (k1_divergence, True),
    "k2": (k2_divergence, False),
    "k3": (k3_divergence, False),
}
for _level, _reduce, _names in (
    ("token", None, ("k1", "k2", "k3")),
    ("seq_sum", row_sum, ("k1", "k2", "k3")),
    ("seq_mean", row_mean, ("k1", "k2", "k3")),
    ("seq_max", row_max, ("k2", "k3")),
):
    for _k in _names:
        _fn, _two_sided = _DIVERGENCES[_k]
        register_rs_option(f"{_level}_{_k}", divergence=_fn, two_sided=_two_sided, reduce=_reduce)


# --- thresholds and settings -------------------------------------------------------------------


def _positive(text: Any, what: str) -> float:
    if isinstance(text, bool):
        raise ValueError(f"{what}: got {text!r}, a boolean; expected a number > 0")
    try:
        value = float(text)
    except (TypeError, ValueError):
        raise ValueError(f"{what}: {text!r} is not a number") from None
    if not value > 0 or math.isinf(value):
        raise ValueError(f"{what}: got {value!r}; must be a finite number > 0")
    return value


def _pair(spec: Any, what: str) -> tuple[float, float]:
    """'lo_hi' or a 2-sequence → (lo, hi) with 0 < lo ≤ hi."""
    parts = spec.split("_", 1) if isinstance(spec, str) else list(spec)
    if len(parts) != 2:
        raise ValueError(f"{what}: {spec!r} is not a 'lo_hi' pair")
    lo, hi = _positive(parts[0], what), _positive(parts[1], what)
    if lo > hi:
        raise ValueError(f"{what}: lower bound {lo!r} is above the upper bound {hi!r}")
    return lo, hi


def format_bounds(bounds: Bounds) -> str | float:
    """verl's spelling of parsed bounds: u stays a number, (lo, hi) becomes ``"lo_hi"``.

    >>> format_bounds(2.0), format_bounds((0.5, 2.0))
    (2.0, '0.5_2.0')
    """
    if isinstance(bounds, tuple):
        return f"{bounds[0]!r}_{bounds[1]!r}"
    return bounds


def parse_is_threshold(spec: Any) -> Bounds:
    """``rollout_is_threshold`` → u (TIS) or (lo, hi) (IcePop).

    >>> parse_is_threshold(2), parse_is_threshold("0.5_2.0"), parse_is_threshold("3")
    (2.0, (0.5, 2.0), 3.0)
    """
    allowed = (
        "allowed: a number u > 0 (TIS: weights clamped at u) or 'lo_hi' with 0 < lo ≤ hi "
        "(IcePop: weights outside [lo, hi] set to 0)"
    )
    try:
        if isinstance(spec, str):
            text = spec.strip()
            return _pair(text, "threshold") if "_" in text else _positive(text, "threshold")
        if isinstance(spec, Sequence):
            return _pair(spec, "threshold")
        return _positive(spec, "threshold")
    except ValueError as error:
        raise ValueError(f"got {spec!r} ({error}); {allowed}") from None


def split_rs_options(spec: Any) -> tuple[str, ...] | None:
    """``rollout_rs`` (a comma list or a sequence of names) → names in order, duplicates dropped;
    None stays None. The names are not checked here (:func:`parse_rs_options` checks them).

    >>> split_rs_options("token_k1, seq_mean_k3,token_k1")
    ('token_k1', 'seq_mean_k3')
    """
    if spec is None:
        return None
    items = spec.split(",") if isinstance(spec, str) else list(spec)
    names = [str(item).strip() for item in items if str(item).strip()]
    if not names:
        raise ValueError(f"got {spec!r}; name at least one option, or null for none")
    return tuple(dict.fromkeys(names))


def parse_rs_options(spec: Any) -> tuple[str, ...] | None:
    """:func:`split_rs_options`, each name checked against :data:`ROLLOUT_RS_OPTIONS`."""
    names = split_rs_options(spec)
    for name in names or ():
        if name not in ROLLOUT_RS_OPTIONS:
            raise ValueError(
                f"got {name!r}; allowed: {', '.join(ROLLOUT_RS_OPTIONS.names())} (comma-separated)"
            )
    return names


def parse_rs_thresholds(options: Sequence[str], spec: Any) -> tuple[Bounds, ...]:
    """``rollout_rs_threshold`` for the parsed ``options`` → one bound per option.

    One value is shared by every option, else there must be one per option (a comma list or a
    sequence). A two-sided (k1) option takes 'lo_hi', or u meaning (1/u, u); a one-sided (k2, k3)
    option takes one upper bound, and a '_' there is an error.

    >>> parse_rs_thresholds(("token_k1", "seq_mean_k3"), "2.0,0.05")
    ((0.5, 2.0), 0.05)
    >>> parse_rs_thresholds(("token_k1", "seq_sum_k1"), "0.5_2.0")
    ((0.5, 2.0), (0.5, 2.0))
    """
    if spec is None:
        raise ValueError(
            f"required with rollout_rs = {','.join(options)!r}: one threshold for all options "
            "or one per option, comma-separated"
        )
    if isinstance(spec, str):
        items: list[Any] = [part.strip() for part in spec.split(",") if part.strip()]
    elif isinstance(spec, Sequence):
        items = list(spec)
    else:
        items = [spec]
    if len(items) not in (1, len(options)):
        raise ValueError(
            f"got {spec!r}: {len(items)} thresholds for {len(options)} options "
            f"({', '.join(options)}); give one shared threshold or one per option"
        )
    items = items * len(options) if len(items) == 1 else items
    return tuple(
        _rs_bounds(name, item, ROLLOUT_RS_OPTIONS.get(name).two_sided)
        for name, item in zip(options, items, strict=True)
    )


def _rs_bounds(name: str, spec: Any, two_sided: bool) -> Bounds:
    what = f"threshold {spec!r} of option {name!r}"
    is_pair = (
        "_" in spec if isinstance(spec, str) else isinstance(spec, Sequence) and len(spec) == 2
    )
    if two_sided:
        if is_pair:
            return _pair(spec, what)
        upper = _positive(spec, what)
        return 1.0 / upper, upper
    if is_pair:
        raise ValueError(
            f"{what}: {name!r} takes one upper bound on its divergence; a 'lo_hi' pair is only "
            "for the k1 options"
        )
    return _positive(spec, what)


@dataclass(frozen=True)
class RolloutCorrectionSettings:
    """The ``algorithm.rollout_correction`` values the math reads, parsed (no defaults here:
    :meth:`resolve` takes them from :mod:`stages.algos.defaults`, as the schema does).

    Attributes:
        rollout_is: an IS mode name, or None (no weights).
        rollout_is_threshold: u (TIS) or (lo, hi) (IcePop).
        rollout_is_batch_normalize: divide the weights by their batch mean.
        rollout_rs: rejection option names, or None (no rejection).
        rollout_rs_threshold: one bound per option (None without options).
        loss_type: bypass mode's policy loss (``ppo_clip`` or ``reinforce``).
    """

    rollout_is: str | None
    rollout_is_threshold: Bounds
    rollout_is_batch_normalize: bool
    rollout_rs: tuple[str, ...] | None
    rollout_rs_threshold: tuple[Bounds, ...] | None
    loss_type: str

    @classmethod
    def resolve(cls, config: Any) -> RolloutCorrectionSettings:
        """The settings of ``config``: settings as they are; else a typed section, a verl mapping
        (strings parsed: ``"0.5_2.0"``, ``"token_k1,seq_mean_k3"``) or None, each absent field at
        its default.

        >>> RolloutCorrectionSettings.resolve({"rollout_rs": "token_k1", "rollout_rs_threshold": 2})
        RolloutCorrectionSettings(rollout_is=None, rollout_is_threshold=2.0, rollout_is_batch_normalize=False, rollout_rs=('token_k1',), rollout_rs_threshold=((0.5, 2.0),), loss_type='ppo_clip')
        """
        if isinstance(config, cls):
            return config
        values = {f.name: read_field(config, f.name) for f in dataclasses.fields(cls)}
        mode = values["rollout_is"]
        if mode is not None:
            ROLLOUT_IS_MODES.get(mode)  # an unknown mode raises, listing the known ones
        options = parse_rs_options(values["rollout_rs"])
        return cls(
            rollout_is=mode,
            rollout_is_threshold=parse_is_threshold(values["rollout_is_threshold"]),
            rollout_is_batch_normalize=bool(values["rollout_is_batch_normalize"]),
            rollout_rs=options,
            rollout_rs_threshold=(
                None
                if options is None
                else parse_rs_thresholds(options, values["rollout_rs_threshold"])
            ),
            loss_type=str(values["loss_type"]),
        )

    @property
    def changes_the_loss(self) -> bool:
        """Whether bypass mode's loss differs from the plain clipped loss against the rollout
        log-probs: IS or rejection is asked for, or another loss_type than the default
        (``ppo_clip``)."""
        return (
            self.rollout_is is not None
            or self.rollout_rs is not None
            or self.loss_type != ROLLOUT_CORRECTION_DEFAULTS["loss_type"]
        )

    def as_dict(self) -> dict[str, Any]:
        """Plain values (for a batch's ``meta_info``); :meth:`resolve` reads them back."""
        return dataclasses.asdict(self)


# --- the computations --------------------------------------------------------------------------


def _zero_outside(values: Tensor, mask: Tensor) -> Tensor:
    """``values`` with 0 outside ``mask``: padding (NaN included) never reaches a result."""
    return torch.where(mask, values, torch.zeros((), dtype=values.dtype, device=values.device))


def _masked_extreme(values: Tensor, mask: Tensor, largest: bool) -> Tensor:
    fill = float("-inf") if largest else float("inf")
    masked = values.masked_fill(~mask, fill)
    return masked.max() if largest else masked.min()


def _row_stats(values: Tensor, rows: Tensor) -> dict[str, Tensor]:
    """mean, unbiased std (0 below 2 rows), max, min of (B,) ``values`` over the ``rows``."""
    count = rows.sum()
    mean = masked_mean(values, rows)
    spread = masked_sum((values - mean).square(), rows) / (count - 1).clamp(min=1)
    return {
        "mean": mean,
        "std": torch.where(count > 1, spread.sqrt(), torch.zeros_like(mean)),
        "max": _masked_extreme(values, rows, largest=True),
        "min": _masked_extreme(values, rows, largest=False),
    }


def _clamped_std(values: Tensor, mask: Tensor, low: float, high: float) -> Tensor:
    """sqrt(E[v²] − E[v]²) over the tokens of ``values`` clamped to [low, high] (0 below 2 tokens)."""
    clamped = values.clamp(min=low, max=high)
    mean = masked_mean(clamped, mask)
    variance = (masked_mean(clamped.square(), mask) - mean.square()).clamp(min=0.0)
    return torch.where(mask.sum() > 1, variance.sqrt(), torch.zeros_like(mean))


def _fraction(flags: Tensor, mask: Tensor) -> Tensor:
    return masked_mean(flags.float(), mask)


def _bounds(threshold: Bounds) -> tuple[float | None, float]:
    """(lower or None, upper) of a parsed threshold."""
    if isinstance(threshold, tuple):
        return float(threshold[0]), float(threshold[1])
    return None, float(threshold)


@torch.no_grad()
def importance_weights(
    log_ratio: Tensor,
    response_mask: Tensor,
    mode: str,
    threshold: Bounds,
    batch_normalize: bool = False,
) -> tuple[Tensor, dict[str, Tensor]]:
    """The IS weights of ``mode`` (module docstring) and their metrics.

    Args:
        log_ratio: (B, R) log π_train − log π_rollout (padding may hold anything).
        response_mask: (B, R) 1 = response token.
        mode: a :data:`ROLLOUT_IS_MODES` name.
        threshold: u (TIS) or (lo, hi) (IcePop), as :func:`parse_is_threshold` returns.
        batch_normalize: divide the weights by their mean (after the metrics are taken).

    Returns:
        (weights (B, R), detached, 0 on padding; metrics without the prefix): ``rollout_is_mean``
        / ``_max`` / ``_min`` of the applied weights (sequence mode: max / min of the rows' raw
        weights), ``rollout_is_ratio_fraction_high`` / ``_low`` (raw weights above u / below lo,
        lo = 1/u for TIS; tokens, or rows in sequence mode), ``rollout_is_std`` and
        ``rollout_is_eff_sample_size`` (of the weights clamped to [0, u]), the per-row mean weights'
        ``rollout_is_seq_mean`` / ``_std`` / ``_max`` / ``_min`` / ``_max_deviation`` (from 1),
        ``rollout_is_seq_fraction_high`` / ``_low`` (rows whose raw mean weight is above u / below
        lo), ``rollout_is_oob_ratio`` (IcePop: tokens zeroed), ``rollout_is_batch_norm_factor``
        (with batch_normalize).
    """
    spec = ROLLOUT_IS_MODES.get(mode)
    lower, upper = _bounds(threshold)
    mask = response_mask.bool()
    log_ratio = _zero_outside(log_ratio.detach(), mask)
    if not mask.any():
        return torch.zeros_like(log_ratio), {}
    log_weights = spec.log_weights(log_ratio, mask)  # (B, R), unclamped
    raw = _zero_outside(torch.exp(log_weights.clamp(-SAFETY_BOUND, SAFETY_BOUND)), mask)
    if lower is None:
        weights = raw.clamp(max=upper)
    else:
        weights = torch.where((raw >= lower) & (raw <= upper), raw, torch.zeros_like(raw))
    metrics = _weight_metrics(weights, raw, log_weights, mask, spec.sequence_level, lower, upper)
    if lower is not None:
        metrics["rollout_is_oob_ratio"] = _fraction((raw < lower) | (raw > upper), mask)
    if batch_normalize:
        weights, metrics["rollout_is_batch_norm_factor"] = _normalized(
            weights, mask, spec.sequence_level
        )
    return weights, metrics


def _weight_metrics(
    weights: Tensor,
    raw: Tensor,
    log_weights: Tensor,
    mask: Tensor,
    sequence_level: bool,
    lower: float | None,
    upper: float,
) -> dict[str, Tensor]:
    low = 1.0 / upper if lower is None else lower
    rows = mask.any(dim=-1)  # (B,) non-empty rows
    metrics = {"rollout_is_mean": masked_mean(weights, mask)}
    if sequence_level:
        row_log = log_weights[:, 0]  # (B,): the row's Σ log r, unclamped
        metrics["rollout_is_max"] = torch.exp(
            _masked_extreme(row_log, rows, largest=True).clamp(max=SAFETY_BOUND)
        )
        metrics["rollout_is_min"] = torch.exp(_masked_extreme(row_log, rows, largest=False))
        metrics["rollout_is_ratio_fraction_high"] = _fraction(row_log > math.log(upper), rows)
        metrics["rollout_is_ratio_fraction_low"] = _fraction(row_log < math.log(low), rows)
    else:
        metrics["rollout_is_max"] = _masked_extreme(weights, mask, largest=True)
        metrics["rollout_is_min"] = _masked_extreme(weights, mask, largest=False)
        metrics["rollout_is_ratio_fraction_high"] = _fraction(raw > upper, mask)
        metrics["rollout_is_ratio_fraction_low"] = _fraction(raw < low, mask)
    metrics["rollout_is_std"] = _clamped_std(weights, mask, 0.0, upper)
    clamped = weights.clamp(min=0.0, max=upper)
    normalized = clamped / (masked_mean(clamped, mask) + MASK_EPS)
    metrics["rollout_is_eff_sample_size"] = 1.0 / masked_mean(normalized.square(), mask)
    row_weights = row_mean(weights, mask)  # (B,)
    for name, value in _row_stats(row_weights, rows).items():
        metrics[f"rollout_is_seq_{name}"] = value
    metrics["rollout_is_seq_max_deviation"] = _masked_extreme(
        (row_weights - 1.0).abs(), rows, largest=True
    )
    raw_rows = row_mean(raw, mask)
    metrics["rollout_is_seq_fraction_high"] = _fraction(raw_rows > upper, rows)
    metrics["rollout_is_seq_fraction_low"] = _fraction(raw_rows < low, rows)
    return metrics


def _normalized(weights: Tensor, mask: Tensor, sequence_level: bool) -> tuple[Tensor, Tensor]:
    """(weights / their mean, the mean); unchanged (factor 1) when the mean is ≤ 1e-8."""
    if sequence_level:
        mean = masked_mean(row_mean(weights, mask), mask.any(dim=-1))
    else:
        mean = masked_mean(weights, mask)
    usable = mean > 1e-8
    factor = torch.where(usable, mean, torch.ones_like(mean))
    return weights / factor, factor


@torch.no_grad()
def rejection_mask(
    log_ratio: Tensor,
    response_mask: Tensor,
    options: Sequence[str],
    thresholds: Sequence[Bounds],
) -> tuple[Tensor, dict[str, Tensor]]:
    """The response mask with the tokens every option rejects removed, and its metrics.

    Args:
        log_ratio: (B, R) log π_train − log π_rollout.
        response_mask: (B, R) 1 = response token.
        options: :data:`ROLLOUT_RS_OPTIONS` names; thresholds: one bound per option
            (:func:`parse_rs_thresholds`).

    Returns:
        (mask (B, R) in ``response_mask``'s dtype, metrics without the prefix). Per option o,
        with s its statistic (k per token; a sequence option's row value on each of its tokens)
        and its bounds (k1: log lo, log hi; k2/k3: 0, hi): ``rollout_rs_<o>_mean`` and ``_std``
        (s clamped to the bounds) over the tokens; ``_max`` / ``_min`` / ``_fraction_high`` /
        ``_fraction_low`` over the tokens (token options) or the non-empty rows (sequence
        options; fraction_low is 0 without a lower bound); the row values' ``_seq_mean`` /
        ``_seq_std`` / ``_seq_max`` / ``_seq_min`` / ``_seq_max_deviation`` (from 0) /
        ``_seq_fraction_high`` / ``_seq_fraction_low`` (k1 only) over the non-empty rows;
        ``_masked_fraction`` (tokens it rejects) and ``_seq_masked_fraction`` (non-empty rows
        with a rejected token). Overall: ``rollout_rs_masked_fraction`` and
        ``rollout_rs_seq_masked_fraction``.
    """
    if len(options) != len(thresholds):
        raise ValueError(f"{len(options)} rejection options but {len(thresholds)} thresholds")
    mask = response_mask.bool()
    if not mask.any():
        return response_mask.clone(), {}
    x = _zero_outside(log_ratio.detach(), mask).clamp(-SAFETY_BOUND, SAFETY_BOUND)
    rows = mask.any(dim=-1)
    keep_all = torch.ones_like(mask)
    metrics: dict[str, Tensor] = {}
    for name, threshold in zip(options, thresholds, strict=True):
        option = ROLLOUT_RS_OPTIONS.get(name)
        lower, upper = _bounds(threshold)
        if option.two_sided:
            if lower is None:
                raise ValueError(f"option {name!r} needs (lo, hi) bounds, got {threshold!r}")
            low, high = math.log(lower), math.log(upper)
        else:
            if lower is not None:
                raise ValueError(f"option {name!r} takes one upper bound, got {threshold!r}")
            low, high = 0.0, upper
        per_token = option.divergence(x)  # (B, R)
        if option.reduce is None:
            row_values = row_mean(per_token, mask)  # (B,) for the _seq_* statistics
            stat = per_token
        else:
            row_values = option.reduce(per_token, mask)  # (B,)
            stat = row_values.unsqueeze(-1).expand_as(per_token)
        keep = stat <= high
        if option.two_sided:
            keep = keep & (stat >= low)
        keep_all &= keep
        metrics.update(
            _option_metrics(
                f"rollout_rs_{name}", option, stat, row_values, keep, mask, rows, low, high
            )
        )
    metrics["rollout_rs_masked_fraction"] = _fraction(~keep_all, mask)
    metrics["rollout_rs_seq_masked_fraction"] = _fraction((~keep_all & mask).any(dim=-1), rows)
    return response_mask * keep_all.to(response_mask.dtype), metrics


def _option_metrics(
    prefix: str,
    option: RejectionOption,
    stat: Tensor,
    row_values: Tensor,
    keep: Tensor,
    mask: Tensor,
    rows: Tensor,
    low: float,
    high: float,
) -> dict[str, Tensor]:
    zero = torch.zeros((), dtype=stat.dtype, device=stat.device)
    metrics = {f"{prefix}_mean": masked_mean(stat, mask)}
    if option.sequence_level:
        extremes = _row_stats(row_values, rows)
        metrics[f"{prefix}_max"], metrics[f"{prefix}_min"] = extremes["max"], extremes["min"]
        metrics[f"{prefix}_fraction_high"] = _fraction(row_values > high, rows)
        metrics[f"{prefix}_fraction_low"] = (
            _fraction(row_values < low, rows) if option.two_sided else zero
        )
    else:
        metrics[f"{prefix}_max"] = _masked_extreme(stat, mask, largest=True)
        metrics[f"{prefix}_min"] = _masked_extreme(stat, mask, largest=False)
        metrics[f"{prefix}_fraction_high"] = _fraction(stat > high, mask)
        metrics[f"{prefix}_fraction_low"] = (
            _fraction(stat < low, mask) if option.two_sided else zero
        )
    metrics[f"{prefix}_std"] = _clamped_std(stat, mask, low, high)
    for name, value in _row_stats(row_values, rows).items():
        metrics[f"{prefix}_seq_{name}"] = value
    metrics[f"{prefix}_seq_max_deviation"] = _masked_extreme(row_values.abs(), rows, largest=True)
    metrics[f"{prefix}_seq_fraction_high"] = _fraction(row_values > high, rows)
    if option.two_sided:
        metrics[f"{prefix}_seq_fraction_low"] = _fraction(row_values < low, rows)
    metrics[f"{prefix}_masked_fraction"] = _fraction(~keep, mask)
    metrics[f"{prefix}_seq_masked_fraction"] = _fraction((~keep & mask).any(dim=-1), rows)
    return metrics


@torch.no_grad()
def mismatch_metrics(
    log_prob: Tensor, rollout_log_prob: Tensor, response_mask: Tensor
) -> dict[str, Tensor]:
    """How far π_train (``log_prob``) is from π_rollout, on the response tokens (without the prefix).

    Args:
        log_prob, rollout_log_prob: (B, R) log-probs of the sampled tokens; response_mask (B, R).

    Returns:
        ``kl`` = mean(log π_rollout − log π_train) and ``k3_kl`` = mean(r − log r − 1) over the
        tokens; ``training_ppl`` / ``rollout_ppl`` = mean over rows of exp(−row mean log-prob),
        ``training_log_ppl`` / ``rollout_log_ppl`` the same in log space; per row d = mean log
        π_rollout − mean log π_train: ``log_ppl_diff`` (mean d), ``log_ppl_abs_diff`` (mean |d|),
        ``log_ppl_diff_max`` / ``_min``, ``ppl_ratio`` (mean eᵈ); ``chi2_token`` = mean r² − 1 over
        the tokens and ``chi2_seq`` = mean over rows of exp(2 clamp(Σ log r)) − 1. Row means are
        over the non-empty rows.
    """
    mask = response_mask.bool()
    if not mask.any():
        return {}
    train = _zero_outside(log_prob.detach(), mask)
    rollout = _zero_outside(rollout_log_prob.detach(), mask)
    rows = mask.any(dim=-1)
    train_mean, rollout_mean = row_mean(train, mask), row_mean(rollout, mask)  # (B,)
    log_ratio = train - rollout
    diff = rollout_mean - train_mean
    diff_extremes = _row_stats(diff, rows)
    row_log_ratio = row_sum(log_ratio, mask).clamp(-SAFETY_BOUND, SAFETY_BOUND)
    return {
        "training_ppl": masked_mean(torch.exp(-train_mean), rows),
        "training_log_ppl": masked_mean(-train_mean, rows),
        "kl": masked_mean(rollout - train, mask),
        "k3_kl": masked_mean(torch.exp(log_ratio) - log_ratio - 1.0, mask),
        "rollout_ppl": masked_mean(torch.exp(-rollout_mean), rows),
        "rollout_log_ppl": masked_mean(-rollout_mean, rows),
        "log_ppl_diff": diff_extremes["mean"],
        "log_ppl_abs_diff": masked_mean(diff.abs(), rows),
        "log_ppl_diff_max": diff_extremes["max"],
        "log_ppl_diff_min": diff_extremes["min"],
        "ppl_ratio": masked_mean(torch.exp(diff), rows),
        "chi2_token": masked_mean(
            torch.exp(log_ratio.clamp(-SAFETY_BOUND, SAFETY_BOUND)).square(), mask
        )
        - 1.0,
        "chi2_seq": masked_mean(torch.exp(2.0 * row_log_ratio), rows) - 1.0,
    }


def prefixed(metrics: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """``name`` → ``rollout_corr/name``."""
    return {PREFIX + name: value for name, value in metrics.items()}


@dataclass(frozen=True)
class RolloutCorrection:
    """What :func:`compute_rollout_correction` returns.

    Attributes:
        weights: (B, R) detached IS weights, or None when ``rollout_is`` is None.
        response_mask: (B, R) the mask after rejection (the input's values without rejection).
        metrics: every metric, named ``rollout_corr/<name>``, as detached 0-d tensors.
    """

    weights: Tensor | None
    response_mask: Tensor
    metrics: dict[str, Tensor]


def compute_rollout_correction(
    log_prob: Tensor,
    rollout_log_prob: Tensor,
    response_mask: Tensor,
    settings: RolloutCorrectionSettings | Mapping[str, Any] | None,
) -> RolloutCorrection:
    """IS weights, rejection mask and mismatch metrics of π_train (``log_prob``) against
    π_rollout, all on the original ``response_mask`` (verl's
    ``compute_rollout_correction_and_rejection_mask``; shapes (B, R))."""
    settings = RolloutCorrectionSettings.resolve(settings)
    log_ratio = log_prob.detach() - rollout_log_prob.detach()
    metrics: dict[str, Tensor] = {}
    weights = None
    if settings.rollout_is is not None:
        weights, is_metrics = importance_weights(
            log_ratio,
            response_mask,
            settings.rollout_is,
            settings.rollout_is_threshold,
            settings.rollout_is_batch_normalize,
        )
        metrics.update(is_metrics)
    mask = response_mask
    if settings.rollout_rs is not None:
        mask, rs_metrics = rejection_mask(
            log_ratio, response_mask, settings.rollout_rs, settings.rollout_rs_threshold or ()
        )
        metrics.update(rs_metrics)
    metrics.update(mismatch_metrics(log_prob, rollout_log_prob, response_mask))
    return RolloutCorrection(weights, mask, prefixed(metrics))
