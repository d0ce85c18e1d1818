"""Validation metrics: mean/std@N, bootstrap best/worst/maj@N per prompt, and the core/aux split.

Each validation prompt (uid) is sampled N times (``val_kwargs.n``). Per data source, per uid and per
reward variable (``reward``, ``acc``, any reward-extra key):

- ``mean@N``: mean of the N values (always);
- ``std@N``: **population** std of the N values (numpy's ``np.std``, ddof = 0), only for N > 1.
  GRPO's in-group std is the *sample* std (ddof = 1, singleton → 1); the two estimators differ
  on purpose and are not comparable;
- ``best@k/{mean,std}``, ``worst@k/{mean,std}`` for k in {2, 4, 8, … < N} ∪ {N}: draw 1000
  resamples of size k with replacement (seed 42, reset for every call), take the max (min) of
  each resample, report mean and population std over the resamples;
- ``maj@k/{mean,std}``: likewise, with the value of the majority ``pred`` in each resample (ties
  go to the pred seen first in the resample), only when a ``pred`` list of the same length
  without None exists.

Then every metric name is averaged over the uids that have it. The numbers are identical to
verl 0.9.1's (same random stream), computed with vectorized resamples instead of a Python loop.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

#: bootstrap resamples per best/worst/maj estimate (verl's constant)
N_BOOTSTRAP = 1000
#: the reward-extra key holding each sample's prediction, used for majority voting
PRED_KEY = "pred"


def resample_indices(n_data: int, subset_size: int, n_bootstrap: int, seed: int) -> np.ndarray:
    """(n_bootstrap, subset_size) indices into the data, drawn with replacement.

    Same stream as ``np.random.seed(seed); np.random.choice(...)`` (verl), drawn from a private
    ``RandomState`` so numpy's global random state is left alone.
    """
    return np.random.RandomState(seed).choice(n_data, size=(n_bootstrap, subset_size), replace=True)


def bootstrap_metric(
    data: Sequence[Any],
    subset_size: int,
    reduce_fns: Sequence[Callable[[np.ndarray], float]],
    n_bootstrap: int = N_BOOTSTRAP,
    seed: int = 42,
) -> list[tuple[float, float]]:
    """(mean, std) over ``n_bootstrap`` resamples of ``reduce_fn(resample)``, one pair per function.

    Each resample is ``subset_size`` items drawn with replacement (an object array, so items may
    be dicts); the stream restarts from ``seed`` on every call, so equal inputs give equal
    outputs. std is the population std (ddof = 0) over the resamples.

    Example:
        >>> bootstrap_metric([0.0, 1.0], 2, [np.max, np.min], n_bootstrap=4)
        [(0.5, 0.5), (0.0, 0.0)]
    """
    if not data:
        raise ValueError("bootstrap_metric needs at least one data point, got an empty sequence")
    items = np.empty(len(data), dtype=object)  # 1-D even when the items are tuples or lists
    for position, item in enumerate(data):
        items[position] = item
    indices = resample_indices(len(items), subset_size, n_bootstrap, seed)
    results = []
    for reduce_fn in reduce_fns:
        outcomes = np.array([reduce_fn(items[row]) for row in indices], dtype=np.float64)
        results.append((float(np.mean(outcomes)), float(np.std(outcomes))))
    return results


def calc_maj_val(data: Sequence[dict[str, Any]], vote_key: str, val_key: str) -> Any:
    """The ``val_key`` of the first item whose ``vote_key`` is the most frequent vote.

    Ties go to the vote seen first in ``data``.

    Example:
        >>> calc_maj_val([{"pred": "B", "val": 0}, {"pred": "A", "val": 1},
        ...               {"pred": "A", "val": 2}, {"pred": "B", "val": 3}], "pred", "val")
        0
    """
    votes: dict[Any, list[Any]] = {}
    for item in data:
        votes.setdefault(item[vote_key], []).append(item[val_key])
    winner = max(votes, key=lambda vote: len(votes[vote]))  # max keeps the first of equals
    return votes[winner][0]


def resample_sizes(n: int) -> list[int]:
    """Bootstrap subset sizes for N samples: {2, 4, 8, … < N} ∪ {N}; none for N ≤ 1.

    Example:
        >>> resample_sizes(1), resample_sizes(4), resample_sizes(5), resample_sizes(16)
        ([], [2, 4], [2, 4, 5], [2, 4, 8, 16])
    """
    if n <= 1:
        return []
    sizes, size = [], 2
    while size < n:
        sizes.append(size)
        size *= 2
    return [*sizes, n]


def _mean_std(outcomes: np.ndarray) -> tuple[float, float]:
    return float(np.mean(outcomes)), float(np.std(outcomes))


def majority_values(values: np.ndarray, preds: Sequence[Any], indices: np.ndarray) -> np.ndarray:
    """Per resample, the value of the first occurrence of its most frequent pred.

    Vectorized ``calc_maj_val``: votes per distinct pred are counted for each resample row, then
    read back at every position; the first position holding the highest count is the first
    occurrence of the winning pred, which is also the earliest-inserted pred among those tied.
    Memory O(n_bootstrap · (k + distinct preds)).

    Args:
        values: (N,) float values. preds: N hashable predictions.
        indices: (n_bootstrap, k) resample indices into both.

    Returns:
        (n_bootstrap,) majority values.
    """
    codes_of: dict[Any, int] = {}
    codes = np.array([codes_of.setdefault(pred, len(codes_of)) for pred in preds])
    n_resamples, n_codes = len(indices), len(codes_of)
    rows = np.arange(n_resamples)[:, None]  # (n_bootstrap, 1)
    drawn = codes[indices]  # (n_bootstrap, k)
    votes = np.bincount((drawn + rows * n_codes).ravel(), minlength=n_resamples * n_codes)
    votes = votes.reshape(n_resamples, n_codes)  # (n_bootstrap, distinct preds)
    first_winner = votes[rows, drawn].argmax(axis=1)  # (n_bootstrap,) position of the winner
    return values[indices[np.arange(len(indices)), first_winner]]


def _variable_metrics(
    values: np.ndarray, preds: list[Any] | None, seed: int, cache: dict
) -> dict[str, float]:
    """mean@N, std@N and the bootstrap families for one uid's values of one variable."""
    n = len(values)
    metrics = {f"mean@{n}": float(np.mean(values))}
    if n <= 1:
        return metrics
    metrics[f"std@{n}"] = float(np.std(values))
    for k in resample_sizes(n):
        if (n, k) not in cache:
            cache[n, k] = resample_indices(n, k, N_BOOTSTRAP, seed)
        drawn = values[cache[n, k]]  # (n_bootstrap, k)
        metrics[f"best@{k}/mean"], metrics[f"best@{k}/std"] = _mean_std(drawn.max(axis=1))
        metrics[f"worst@{k}/mean"], metrics[f"worst@{k}/std"] = _mean_std(drawn.min(axis=1))
        if preds is not None:
            majority = majority_values(values, preds, cache[n, k])
            metrics[f"maj@{k}/mean"], metrics[f"maj@{k}/std"] = _mean_std(majority)
    return metrics


def _group_by_source_and_uid(
    data_sources: Sequence[str], sample_uids: Sequence[Any], infos_dict: dict[str, Sequence[Any]]
) -> dict[str, dict[Any, dict[str, list[Any]]]]:
    """data_source → uid → variable → list of values, in first-seen order."""
    n_samples = len(data_sources)
    for name, column in {"sample_uids": sample_uids, **infos_dict}.items():
        if len(column) != n_samples:
            raise ValueError(
                f"validation column {name!r} has {len(column)} entries, expected {n_samples} "
                "(one per sample, like data_sources)"
            )
    grouped: dict = defaultdict(lambda: defaultdict(lambda: defaultdict(list)))
    for row, data_source in enumerate(data_sources):
        variables = grouped[data_source][sample_uids[row]]
        for name, column in infos_dict.items():
            variables[name].append(column[row])
    return grouped


def _pad_expected_acc(grouped: dict, expected_acc_counts: dict[tuple[str, Any], int]) -> None:
    """verl 0.9.1: sessions missing from a source that emits ``acc`` count as acc = 0.

    The observed (non-None) accuracies are kept as ``acc_success_only``.
    """
    acc_sources = {
        source
        for source, uids in grouped.items()
        if any(
            value is not None for variables in uids.values() for value in variables.get("acc", [])
        )
    }
    for (source, uid), expected in expected_acc_counts.items():
        if source not in acc_sources:
            continue
        variables = grouped[source][uid]
        observed = [value for value in variables.get("acc", []) if value is not None]
        variables["acc_success_only"] = observed
        variables["acc"] = observed + [0.0] * max(expected - len(observed), 0)


def _numeric(values: list[Any], where: str) -> np.ndarray:
    try:
        return np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError):
        kinds = sorted({type(value).__name__ for value in values})
        raise TypeError(
            f"validation values of {where} must be numbers, got types {kinds}"
        ) from None


def _uid_metrics(source: str, uid: Any, variables: dict, seed: int, cache: dict) -> dict:
    """variable → metric name → value, for one uid."""
    preds = variables.get(PRED_KEY)
    result = {}
    for name, raw in variables.items():
        kept = [value for value in raw if value is not None]
        if not kept or isinstance(kept[0], str):
            continue
        has_pred = (
            preds is not None
            and len(preds) == len(kept)
            and all(pred is not None for pred in preds)
        )
        values = _numeric(kept, f"{source}/{uid}/{name}")
        result[name] = _variable_metrics(values, preds if has_pred else None, seed, cache)
    return result


def process_validation_metrics(
    data_sources: Sequence[str],
    sample_uids: Sequence[Any],
    infos_dict: dict[str, Sequence[Any]],
    seed: int = 42,
    expected_acc_counts: dict[tuple[str, Any], int] | None = None,
) -> dict[str, dict[str, dict[str, float]]]:
    """data_source → variable → metric name → value, averaged over the uids (module docstring).

    Args:
        data_sources: (B,) the data source of each validation sample.
        sample_uids: (B,) the prompt id of each sample; repeated samples share it.
        infos_dict: variable → (B,) values; None values are dropped, string variables skipped.
        seed: bootstrap seed, restarted for every (uid, variable, k).
        expected_acc_counts: (data_source, uid) → expected samples; see ``_pad_expected_acc``.

    Example:
        >>> out = process_validation_metrics(["gsm8k"] * 5, ["q"] * 5, {"acc": [1, 0, 1, 1, 0]})
        >>> round(out["gsm8k"]["acc"]["std@5"], 4), sorted(out["gsm8k"]["acc"])[:3]
        (0.4899, ['best@2/mean', 'best@2/std', 'best@4/mean'])
    """
    grouped = _group_by_source_and_uid(data_sources, sample_uids, infos_dict)
    if expected_acc_counts:
        _pad_expected_acc(grouped, expected_acc_counts)
    cache: dict[tuple[int, int], np.ndarray] = {}
    per_metric: dict = defaultdict(lambda: defaultdict(lambda: defaultdict(list)))
    for source, uids in grouped.items():
        for uid, variables in uids.items():
            for name, metrics in _uid_metrics(source, uid, variables, seed, cache).items():
                for metric_name, value in metrics.items():
                    per_metric[source][name][metric_name].append(value)
    return {
        source: {
            name: {metric_name: float(np.mean(values)) for metric_name, values in metrics.items()}
            for name, metrics in variables.items()
        }
        for source, variables in per_metric.items()
    }


def _largest_n(metric_names: Sequence[str]) -> int:
    return max(int(name.split("@")[-1].split("/")[0]) for name in metric_names)


def split_val_core_aux(
    data_src2var2metric2val: dict[str, dict[str, dict[str, float]]],
    sample_turns: np.ndarray | None = None,
) -> dict[str, float]:
    """Flatten validation metrics into ``val-core/…`` and ``val-aux/…`` keys (verl's trainer rule).

    ``val-core/{data_source}/{var}/{metric}`` when var is the core variable (``acc`` if the source
    has it, else ``reward``), the metric name starts with ``mean``, ``maj`` or ``best`` and contains
    ``@{n_max}`` (n_max = the largest N among that variable's metric names); every other metric
    goes to ``val-aux/…``. With ``sample_turns`` (per-sample turn counts) also
    ``val-aux/num_turns/{min,max,mean}``.

    Example:
        >>> split_val_core_aux({"gsm8k": {"acc": {"mean@2": 0.5, "std@2": 0.5, "best@2/mean": 0.7}}})
        {'val-core/gsm8k/acc/mean@2': 0.5, 'val-aux/gsm8k/acc/std@2': 0.5, 'val-core/gsm8k/acc/best@2/mean': 0.7}
    """
    flat = {}
    for source, variables in data_src2var2metric2val.items():
        core_var = "acc" if "acc" in variables else "reward"
        for name, metrics in variables.items():
            n_max = _largest_n(list(metrics))
            for metric_name, value in metrics.items():
                is_core = (
                    name == core_var
                    and metric_name.startswith(("mean", "maj", "best"))
                    and f"@{n_max}" in metric_name
                )
                flat[f"{'val-core' if is_core else 'val-aux'}/{source}/{name}/{metric_name}"] = (
                    value
                )
    if sample_turns is not None and np.size(sample_turns) > 0:
        turns = np.asarray(sample_turns, dtype=np.float64)
        flat |= {
            "val-aux/num_turns/min": float(turns.min()),
            "val-aux/num_turns/max": float(turns.max()),
            "val-aux/num_turns/mean": float(turns.mean()),
        }
    return flat
