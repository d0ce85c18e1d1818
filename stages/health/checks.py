"""The health checks: one registry entry per failure a run should hear about at once.

Each check reads one finished step (:class:`StepView`: its metrics, its final batch, which stage
wrote each key) and its threshold, and returns ``None`` or the one line that says what is wrong.
A check declares what it needs (``needs``: step metrics, or ``batch`` keys), so a run that does
not compute them is told once that the check cannot run there, never silently passed.

- ``non_finite``: a NaN or ±Inf in any floating tensor of the step batch, within the response
  tokens for (B, R) tensors (``response_mask`` = 1) and in every row otherwise; names the stage
  that wrote the key, the key and the first row. Threshold: tolerated non-finite values (0).
- ``no_learning_signal``: ``signal/zero_adv_sample_frac`` ≥ threshold (1.0: every sample's
  advantage is 0 at every response token, the policy gradient is zero).
- ``reward_all_equal``: the scores' spread ``critic/score/max − critic/score/min`` ≤ threshold
  (0.0: every sample of the step got the same score — a scorer that cannot tell answers apart).
- ``entropy_collapse``: ``actor/entropy`` (mean over response tokens, nats) < threshold (0.01).
- ``response_clipping``: ``response_length/clip_ratio`` (rows at the response budget ÷ rows)
  ≥ threshold (0.9): responses end at the budget, not at an end of sequence — a policy that
  does not end them yet, a length exploit or a budget too small.
- ``kl_blowup``: the KL to the reference, ``actor/kl_loss`` (KL loss) or
  ``actor/reward_kl_penalty`` (KL in the reward), > threshold (1.0 nats per token).
- ``weight_sync``: ``rollout/weight_sync/mismatched`` of the rollout engine's last weight sync
  (probed tensors whose engine copy differs from the tensor sent, cast to the engine's dtype,
  stages/engines/weight_probe.py) > threshold (0): a sync that silently did nothing. Runs from
  the first step after a sync into an engine (vLLM's, or a schedule's rollout replica); the
  on-policy HF rollout reads the actor's module.
- ``first_step_agreement`` (the run's first step only): the trainer's log-probs of the rollout's
  tokens (``old_log_probs``) against the rollout's own (``rollout_log_probs``), over response
  tokens: k3 KL = mean(exp(Δ) − 1 − Δ), Δ = old − rollout, > threshold (0.01), with max |Δ| in
  the line. A wrong chat template, dtype, tokenizer or attention implementation shows here
  before the run is hours old. With ``bypass_mode`` the old log-probs *are* the rollout's and
  the check cannot run (said once).

Each check's metric is ``health/<name>``: 1.0 when it tripped at the step, 0.0 when it ran and
did not, absent when it did not run.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import torch

from dataproto import DataProto
from dataproto import keys as K
from stages.engines.weight_probe import MISMATCHED, PROBED
from stages.metrics.signal import ZERO_ADV, no_signal_line
from stages.registry import Registry
from stages.rollout_correction import decoupled

Action = Literal["warn", "stop", "off"]
ACTIONS: tuple[str, ...] = ("warn", "stop", "off")
METRIC_PREFIX = "health/"


@dataclass(frozen=True)
class StepView:
    """What a check reads of one finished step.

    step: the global step (1-based); first: whether it is the run's first step (step 1). metrics: the step's metrics. batch: the step's final
    batch. producers: key name → the stage that wrote it (``"input"`` for the step input).
    """

    step: int
    metrics: Mapping[str, float]
    batch: DataProto
    producers: Mapping[str, str] = field(default_factory=dict)
    first: bool = False


@dataclass(frozen=True)
class HealthCheck:
    """One check.

    name: its registry name, its config key (``ppoflow.health.<name>``) and its metric's suffix.
    trip: ``trip(view, threshold) -> line | None``, a pure function of the step.
    threshold: the default threshold; meaning: what it bounds (its unit), for the docs and errors.
    action: the default action (``warn``: one line, the run goes on; ``stop``: one line, the run
        stops after the step is saved and logged; ``off``: not run).
    needs: step metrics the check reads (any one present suffices when ``any_of``).
    needs_batch: batch tensor keys the check reads.
    only_first: run at the run's first trained step only.
    unavailable: ``unavailable(config) -> reason | None``: a setting of the run under which the
        check cannot tell anything (None: always available).
    """

    name: str
    trip: Callable[[StepView, float], str | None]
    threshold: float
    meaning: str
    action: Action = "warn"
    needs: tuple[str, ...] = ()
    any_of: bool = False
    needs_batch: tuple[str, ...] = ()
    only_first: bool = False
    unavailable: Callable[[Any], str | None] | None = None

    @property
    def metric(self) -> str:
        return METRIC_PREFIX + self.name

    def missing(self, view: StepView) -> str | None:
        """What the step lacks for this check (one phrase), or None when it can run."""
        present = [name for name in self.needs if name in view.metrics]
        if self.needs and (not present if self.any_of else len(present) < len(self.needs)):
            wanted = [name for name in self.needs if name not in present]
            joined = " or ".join(wanted) if self.any_of else ", ".join(wanted)
            return f"the run logs no {joined}"
        held = set(view.batch.batch.keys())
        absent = [key for key in self.needs_batch if key not in held]
        if absent:
            return f"the step batch has no {', '.join(absent)}"
        return None

    def undefined(self, view: StepView) -> bool:
        """Whether a metric the check reads is NaN or ±Inf at this step (a 0/0 denominator):
        the check then has nothing to judge at the step and does not trip."""
        values = [view.metrics[name] for name in self.needs if name in view.metrics]
        return not any(map(_finite, values)) if self.any_of else not all(map(_finite, values))


HEALTH_CHECKS = Registry[HealthCheck]("health check")


def _finite(value: float | None) -> bool:
    return value is not None and value == value and abs(value) != float("inf")


def _response_mask(batch: DataProto) -> torch.Tensor | None:
    held = set(batch.batch.keys())
    return batch.batch[K.RESPONSE_MASK].bool() if K.RESPONSE_MASK in held else None


def first_non_finite(view: StepView) -> tuple[str, int, int] | None:
    """(key, first row, count) of the first floating tensor, in key order, holding a NaN or ±Inf
    where it counts (module docstring), or None."""
    mask = _response_mask(view.batch)
    for key in sorted(view.batch.batch.keys()):
        value = view.batch.batch[key]
        if not torch.is_tensor(value) or not value.is_floating_point():
            continue
        bad = ~torch.isfinite(value)
        if mask is not None and bad.shape == mask.shape:
            bad &= mask
        rows = bad.reshape(bad.shape[0], -1).any(-1) if bad.dim() else bad.reshape(1)
        if rows.any():
            return key, int(rows.nonzero()[0, 0]), int(bad.sum())
    return None


def _non_finite(view: StepView, threshold: float) -> str | None:
    found = first_non_finite(view)
    if found is None:
        return None
    key, row, count = found
    if count <= threshold:
        return None
    stage = view.producers.get(key)
    writer = f"the {stage} stage" if stage else "the step input"
    return f"step {view.step}: {count} NaN/Inf value(s) in {key!r} written by {writer}, first at row {row}"


def _no_learning_signal(view: StepView, threshold: float) -> str | None:
    if view.metrics[ZERO_ADV] < threshold:
        return None
    return no_signal_line(view.step, dict(view.metrics))


def _reward_all_equal(view: StepView, threshold: float) -> str | None:
    high, low = view.metrics["critic/score/max"], view.metrics["critic/score/min"]
    if high - low > threshold:
        return None
    return (
        f"step {view.step}: every sample scored {low:g}"
        + (f"–{high:g}" if high != low else "")
        + " — the scorer does not tell this step's responses apart"
    )


def _entropy_collapse(view: StepView, threshold: float) -> str | None:
    entropy = view.metrics["actor/entropy"]
    if entropy >= threshold:
        return None
    return (
        f"step {view.step}: the policy's entropy fell to {entropy:.4g} nats per token "
        f"(< {threshold:g}); sampling has nearly stopped exploring"
    )


def _response_clipping(view: StepView, threshold: float) -> str | None:
    share = view.metrics["response_length/clip_ratio"]
    if share < threshold:
        return None
    return (
        f"step {view.step}: {share:.0%} of the responses end at the response budget "
        f"(≥ {threshold:.0%}), not at an end of sequence — a policy that has not learned to end "
        "them (untrained, or an EOS token or chat template it does not use), a length exploit "
        "of the scorer, or data.max_response_length too small"
    )


KL_METRICS = ("actor/kl_loss", "actor/reward_kl_penalty")


def _kl_blowup(view: StepView, threshold: float) -> str | None:
    for name in KL_METRICS:
        value = view.metrics.get(name)
        if _finite(value) and value > threshold:
            return (
                f"step {view.step}: the KL to the reference ({name}) is {value:.4g} nats per "
                f"token (> {threshold:g}); the policy is running away from the reference"
            )
    return None


def _weight_sync(view: StepView, threshold: float) -> str | None:
    mismatched, probed = view.metrics[MISMATCHED], view.metrics[PROBED]
    if mismatched <= threshold:
        return None
    return (
        f"step {view.step}: the rollout engine does not hold the weights it was just sent: "
        f"{mismatched:g} of {probed:g} probed tensors (the normalisation weights) differ after "
        "the sync, so its rollouts come from older weights"
    )


def rollout_agreement(batch: DataProto) -> tuple[float, float]:
    """(k3 KL, max |Δ|) of Δ = old_log_probs − rollout_log_probs over the response tokens:
    k3 = Σ (exp(Δ) − 1 − Δ) · mask ÷ Σ mask.

    >>> from dataproto import DataProto
    >>> b = DataProto.from_dict({"old_log_probs": torch.tensor([[0.0, -1.0]]),
    ...     "rollout_log_probs": torch.tensor([[0.0, -1.5]]), "response_mask": torch.ones(1, 2)})
    >>> [round(v, 4) for v in rollout_agreement(b)]
    [0.0744, 0.5]
    """
    tensors = batch.batch
    mask = tensors[K.RESPONSE_MASK].bool()
    delta = (tensors[K.OLD_LOG_PROBS] - tensors[K.ROLLOUT_LOG_PROBS]).double()[mask]
    if delta.numel() == 0:
        return 0.0, 0.0
    k3 = (torch.exp(delta) - 1 - delta).mean()
    return float(k3), float(delta.abs().max())


def _first_step_agreement(view: StepView, threshold: float) -> str | None:
    kl, largest = rollout_agreement(view.batch)
    if kl <= threshold:
        return None
    return (
        f"step {view.step}: the trainer's log-probs of the rollout's tokens disagree with the "
        f"rollout's own: k3 KL {kl:.4g} (> {threshold:g}), max |Δ| {largest:.4g} — check the "
        "rollout's dtype, tokenizer, chat template and attention implementation against the "
        "trainer's"
    )


def _bypassed(config: Any) -> str | None:
    if decoupled(config):
        return None
    return (
        "algorithm.rollout_correction.bypass_mode is true: the old log-probs are the rollout's "
        "own, not recomputed by the trainer"
    )


for check in (
    HealthCheck(
        "non_finite",
        _non_finite,
        0.0,
        "NaN/Inf values tolerated in the step batch (count)",
        action="stop",
    ),
    HealthCheck(
        "no_learning_signal",
        _no_learning_signal,
        1.0,
        "share of samples with advantage 0 everywhere at which the step has no signal (ratio)",
        needs=(ZERO_ADV,),
    ),
    HealthCheck(
        "reward_all_equal",
        _reward_all_equal,
        0.0,
        "largest spread of the step's scores (max − min) that counts as all equal (score)",
        needs=("critic/score/max", "critic/score/min"),
    ),
    HealthCheck(
        "entropy_collapse",
        _entropy_collapse,
        0.01,
        "policy entropy below which it has collapsed (nats per token)",
        needs=("actor/entropy",),
    ),
    HealthCheck(
        "response_clipping",
        _response_clipping,
        0.9,
        "share of responses at the response budget that trips the check (ratio)",
        needs=("response_length/clip_ratio",),
    ),
    HealthCheck(
        "kl_blowup",
        _kl_blowup,
        1.0,
        "KL to the reference above which it has blown up (nats per token)",
        needs=KL_METRICS,
        any_of=True,
    ),
    HealthCheck(
        "weight_sync",
        _weight_sync,
        0.0,
        "probed tensors that may differ from the weights just sent (count)",
        action="stop",
        needs=(MISMATCHED, PROBED),
    ),
    HealthCheck(
        "first_step_agreement",
        _first_step_agreement,
        0.01,
        "k3 KL between the trainer's and the rollout's log-probs of the rollout's tokens "
        "at the first step (nats per token)",
        needs_batch=(K.OLD_LOG_PROBS, K.ROLLOUT_LOG_PROBS, K.RESPONSE_MASK),
        only_first=True,
        unavailable=_bypassed,
    ),
):
    HEALTH_CHECKS.add(check.name, check)
