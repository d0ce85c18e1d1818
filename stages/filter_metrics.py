"""The values DAPO's dynamic sampling compares within a prompt group
(``algorithm.filter_groups.metric``).

A registered name reads a column every scored batch holds:

- ``reward`` (verl 0.9.1's name) and ``seq_reward`` (verl's DAPO recipe's): ``seq_scores``, the
  sample's score Σ_t rm_scores: the scorer's score plus the overlong penalty when that is on, no
  KL penalty (filtering happens before the KL).

Any other name is a reward extra the scorers return (``acc`` for the demo task and verl's math
scorers), read from the batch's non-tensor column of that name. A name that is neither is an
error (:class:`FilterMetricError`) raised at the first generation round, before any update.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from dataproto import DataProto
from dataproto import keys as K
from stages.registry import Registry

FilterMetric = Callable[[DataProto], np.ndarray]
FILTER_METRICS = Registry[FilterMetric]("filter_groups metric")


class FilterMetricError(ValueError):
    """``algorithm.filter_groups.metric`` names a value no scorer returned."""


@FILTER_METRICS.register("reward")
def sequence_score(batch: DataProto) -> np.ndarray:
    """(B,) float64 ``seq_scores``."""
    return batch.batch[K.SEQ_SCORES].detach().cpu().double().numpy()


FILTER_METRICS.add("seq_reward", sequence_score)


def filter_values(batch: DataProto, name: str) -> np.ndarray:
    """(B,) float64 values of metric ``name`` for a scored batch (module docstring).

    Raises:
        FilterMetricError: ``name`` is neither registered nor a reward extra of the batch.
    """
    if name in FILTER_METRICS:
        return FILTER_METRICS.get(name)(batch)
    extras = list(batch.meta_info.get(K.REWARD_EXTRA_KEYS, []))
    if name not in extras or name not in batch.non_tensor_batch:
        raise FilterMetricError(
            f"algorithm.filter_groups.metric = {name!r}: no scorer returned it (the scorers "
            f"returned the extras {sorted(extras)}); use one of those or a name in "
            f"{FILTER_METRICS.names()}"
        )
    return np.asarray(batch.non_tensor_batch[name], dtype=np.float64)
