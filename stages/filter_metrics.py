"""The values DAPO's dynamic sampling compares within a prompt group
(``algorithm.filter_groups.metric``).

A registered name reads a column every scored batch holds:

- ``reward`` (verl 0.9.1's name) and ``seq_reward`` (verl's DAPO recipe's): ``seq_scores``, the
  sample's score Σ_t rm_scores: the scorer's score plus the overlong penalty when that is on, no
  KL penalty (filtering happens before the KL).
- ``seq_final_reward`` (the DAPO recipe's): Σ_t token_level_rewards, the reward the advantage
  reads. The rounds filter before the reference policy runs, so it is ``seq_scores`` too, which
  is verl's value exactly when no KL penalty is in the reward; the entry declares
  ``differs_with_kl_in_reward``, and the config refuses it with ``algorithm.use_kl_in_reward``
  (stages/config/checks_dapo.py).

Any other name is a reward extra the scorers return (``acc`` for the demo task and verl's math
scorers), read from the batch's non-tensor column of that name. A name that is neither is an
error (:class:`FilterMetricError`) raised at the first generation round, before any update.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from dataproto import DataProto
from dataproto import keys as K
from stages.registry import Registry


@dataclass(frozen=True)
class FilterMetric:
    """A registered filter metric: ``values(batch) -> (B,) float64``;
    ``differs_with_kl_in_reward``: verl's value includes the in-reward KL penalty, which the
    rounds do not have yet (module docstring)."""

    values: Callable[[DataProto], np.ndarray]
    differs_with_kl_in_reward: bool = False


FILTER_METRICS = Registry[FilterMetric]("filter_groups metric")


class FilterMetricError(ValueError):
    """``algorithm.filter_groups.metric`` names a value no scorer returned."""


def sequence_score(batch: DataProto) -> np.ndarray:
    """(B,) float64 ``seq_scores``."""
    return batch.batch[K.SEQ_SCORES].detach().cpu().double().numpy()


FILTER_METRICS.add("reward", FilterMetric(sequence_score))
FILTER_METRICS.add("seq_reward", FilterMetric(sequence_score))
FILTER_METRICS.add("seq_final_reward", FilterMetric(sequence_score, differs_with_kl_in_reward=True))


def filter_values(batch: DataProto, name: str) -> np.ndarray:
    """(B,) float64 values of metric ``name`` for a scored batch (module docstring).

    Raises:
        FilterMetricError: ``name`` is neither registered nor a reward extra of the batch.
    """
    if name in FILTER_METRICS:
        return FILTER_METRICS.get(name).values(batch)
    extras = list(batch.meta_info.get(K.REWARD_EXTRA_KEYS, []))
    if name not in extras or name not in batch.non_tensor_batch:
        raise FilterMetricError(
            f"algorithm.filter_groups.metric = {name!r}: no scorer returned it (the scorers "
            f"returned the extras {sorted(extras)}); use one of those or a name in "
            f"{FILTER_METRICS.names()}"
        )
    return np.asarray(batch.non_tensor_batch[name], dtype=np.float64)
