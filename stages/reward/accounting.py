"""What the driver makes of a batch's scoring outcomes.

1. Extras are checked against the artifact format (``dataproto.nontensor_codec``): each extra
   becomes a non-tensor column of the reward stage's artifact, so a value the format cannot
   store without pickle (a set, an arbitrary object, a tensor, bytes, complex, …) would fail the
   whole stage when it is saved. Such a sample is ``invalid`` instead. Storable: None, bool,
   int, float (NaN / inf included), str, and lists, tuples and dicts of those, nested, and numpy
   scalars and arrays of those. An extra must also be named by a non-empty str that is not one
   of the batch's own keys (``dataproto.keys``: ``uid``, ``rm_scores``, …), which it would
   overwrite or collide with. The worker checks the same before a result leaves it
   (``stages.reward.worker.encode_result``: only plain data crosses back); this check is the
   driver's own, on what it decoded.
2. ``error_score`` replaces the score of every failed sample; failures are counted by status
   (``error``, ``timeout``, ``invalid``) and each is logged once, with its uid and data_source.
3. The stop rule (:func:`check_failure_share`): when more than ``max_invalid_fraction`` of a
   batch failed, or every sample of it did, :class:`ScorerFailureError` stops the run with the
   scorer's own first error, its file and the sample's uid.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from dataproto import keys as K
from dataproto.nontensor_codec import SUPPORTED, UnsupportedValue, encode_value
from stages.reward.worker import ERROR, INVALID, OK, TIMEOUT, Outcome

logger = logging.getLogger("stages.reward.loop")

#: names an extra may not take: every key of the batch protocol (it would collide in the union)
RESERVED_EXTRA_NAMES = frozenset(
    value for name, value in vars(K).items() if name.isupper() and isinstance(value, str)
)
MAX_FRACTION_KEY = "reward.max_invalid_fraction"


class ScorerFailureError(RuntimeError):
    """Too much of a batch got no score; the message carries the scorer's first error."""


@dataclass
class LoopResult:
    """What the loop produced for B samples.

    scores: (B,) float32, ``error_score`` where the scorer failed.
    extras: name → (B,) object array of per-sample extra infos (None where a sample lacks it).
    outcomes: the per-sample :class:`Outcome` (status and message).
    counts: ``{"error": n, "timeout": n, "invalid": n}``.
    output_dropped_bytes: bytes of the scorer's stdout / stderr dropped in this batch
        (``reward.worker_output_bytes``).
    """

    scores: np.ndarray
    extras: dict[str, np.ndarray]
    outcomes: list[Outcome]
    counts: dict[str, int]
    output_dropped_bytes: int = 0


def unstorable_extra(extras: dict[Any, Any]) -> str | None:
    """Why ``extras`` cannot become reward-extra columns, or None when every one can.

    >>> unstorable_extra({"score": 1.0, "pred": ["7", (1, 2.5)], "info": {"a": None}}) is None
    True
    >>> unstorable_extra({"score": 1.0, "seen": {1, 2}}).split(";")[0]
    "extra 'seen' is a builtins.set, which the artifact cannot store"
    >>> unstorable_extra({"score": 1.0, "uid": "x"})
    "extra 'uid' has the name of a batch key of its own; rename it"
    """
    for name, value in extras.items():
        if type(name) is not str or not name:
            return f"extra name {name!r} is not a non-empty str"
        if name in RESERVED_EXTRA_NAMES:
            return f"extra {name!r} has the name of a batch key of its own; rename it"
        try:
            encode_value(value)
        except UnsupportedValue as err:
            return (
                f"extra {name!r}{err.where()} is a {err.type_name}, which the artifact cannot "
                f"store; supported: {SUPPORTED}"
            )
    return None


def check_extras(outcomes: Sequence[Outcome]) -> list[Outcome]:
    """The outcomes with every ``ok`` one whose extras cannot be stored turned ``invalid``."""
    checked = []
    for outcome in outcomes:
        why = unstorable_extra(outcome.extras) if outcome.status == OK else None
        checked.append(outcome if why is None else Outcome(INVALID, message=why))
    return checked


def collect_extras(outcomes: Sequence[Outcome]) -> dict[str, np.ndarray]:
    """name → (B,) object array over the successful outcomes' extras (None elsewhere).

    Names keep their first-seen order, so ``reward_extra_keys`` is stable across steps.
    """
    names: dict[str, None] = {}
    for outcome in outcomes:
        names.update(dict.fromkeys(outcome.extras))
    extras = {name: np.full(len(outcomes), None, dtype=object) for name in names}
    for i, outcome in enumerate(outcomes):
        for name, value in outcome.extras.items():
            extras[name][i] = value
    return extras


def summarize(
    outcomes: Sequence[Outcome],
    uids: Sequence[Any],
    data_sources: Sequence[Any],
    error_score: float,
) -> LoopResult:
    """Check extras, substitute ``error_score`` for failures, count them, and log each distinct
    failure once: one line per (status, message), naming the first samples' uids and how many
    more failed alike (a scorer that fails the same way on 200 samples is one line, not 200)."""
    outcomes = check_extras(outcomes)
    scores = np.full(len(outcomes), error_score, dtype=np.float32)
    counts = {ERROR: 0, TIMEOUT: 0, INVALID: 0}
    failures: dict[tuple[str, str], list[int]] = {}
    for i, outcome in enumerate(outcomes):
        if outcome.status == OK:
            scores[i] = outcome.score
            continue
        counts[outcome.status] += 1
        failures.setdefault((outcome.status, outcome.message), []).append(i)
    for (status, message), rows in failures.items():
        logger.warning(
            "reward %s for %s: %s; score set to %s",
            status, _samples(rows, uids, data_sources), message, error_score,
        )  # fmt: skip
    return LoopResult(scores, collect_extras(outcomes), outcomes, counts)


def _samples(
    rows: list[int], uids: Sequence[Any], data_sources: Sequence[Any], shown: int = 3
) -> str:
    """``uid=a data_source=x`` for one sample; ``3 samples (uid=a, uid=b, uid=c; data_source=x)``
    and ``… and N more`` for several.

    >>> _samples([0], ["a"], ["x"])
    'uid=a data_source=x'
    >>> _samples([0, 1, 2, 3, 4], list("abcde"), ["x"] * 5)
    '5 samples (uid=a, uid=b, uid=c and 2 more; data_source=x)'
    """
    if len(rows) == 1:
        return f"uid={uids[rows[0]]} data_source={data_sources[rows[0]]}"
    named = ", ".join(f"uid={uids[i]}" for i in rows[:shown])
    more = f" and {len(rows) - shown} more" if len(rows) > shown else ""
    sources = ", ".join(sorted({str(data_sources[i]) for i in rows}))
    return f"{len(rows)} samples ({named}{more}; data_source={sources})"


def check_failure_share(
    result: LoopResult, uids: Sequence[Any], max_fraction: float, scorer_label: str
) -> None:
    """Raise :class:`ScorerFailureError` when the batch's failed share passes ``max_fraction``.

    The rule: stop when ``failed / B > max_fraction``, or when ``failed == B`` (B > 0; so 1.0
    stops only a batch in which no sample scored). The message names the scorer, the counts,
    and the first failure that raised (else the first failure): its uid, status and message.
    """
    total, failed = len(result.outcomes), sum(result.counts.values())
    if failed == 0 or (failed < total and failed / total <= max_fraction):
        return
    failures = [i for i, outcome in enumerate(result.outcomes) if outcome.status != OK]
    raised = [i for i in failures if result.outcomes[i].status == ERROR]
    first = (raised or failures)[0]
    outcome = result.outcomes[first]
    counts = ", ".join(f"{n} {status}" for status, n in result.counts.items() if n)
    raise ScorerFailureError(
        f"reward scorer {scorer_label} failed on {failed} of {total} samples ({counts}); "
        f"{MAX_FRACTION_KEY}={max_fraction:g} stops the run. First failure, uid={uids[first]!r}: "
        f"{outcome.status}: {outcome.message}"
    )
