"""Learning-signal metrics of a training batch, logged every step (with or without DAPO's
dynamic sampling): how much of the step can move the policy at all.

- ``signal/zero_reward_spread_group_frac``: groups whose samples all got the same score
  (``seq_scores``, Σ_t of the placed reward, before any KL penalty; population std 0) ÷ groups
  with at least 2 samples (``signal/multi_sample_groups``). NaN when there is no such group
  (rollout.n = 1). With a group-relative estimator such a group's advantages are all 0.
- ``signal/zero_adv_sample_frac``: samples whose advantage is 0 at every response token
  (response_mask = 1) ÷ samples with at least one response token (``signal/response_samples``).
  NaN when no sample has a response token. 1.0 means the step's policy gradient is zero (only
  an entropy or KL term can move the weights): the step had no learning signal (the
  ``no_learning_signal`` health check, stages/health).
- ``train/num_gen_batches``: generation rounds the step ran (1 without dynamic sampling).
"""

from __future__ import annotations

import numpy as np
from torch import Tensor

from dataproto import DataProto
from dataproto import keys as K
from stages.algos.filter_groups import group_spread

ZERO_SPREAD = "signal/zero_reward_spread_group_frac"
MULTI_SAMPLE_GROUPS = "signal/multi_sample_groups"
ZERO_ADV = "signal/zero_adv_sample_frac"
RESPONSE_SAMPLES = "signal/response_samples"
GEN_ROUNDS = "train/num_gen_batches"


def signal_metrics(
    uid: np.ndarray,
    seq_scores: Tensor,
    advantages: Tensor,
    response_mask: Tensor,
    gen_rounds: int,
) -> dict[str, float]:
    """The module's metrics.

    Args:
        uid: (B,) prompt group of each sample.
        seq_scores: (B,) score of each sample.
        advantages: (B, R) advantages; response_mask: (B, R) 1 on the response tokens.
        gen_rounds: generation rounds of the step.

    Example (groups [1, 0] and [1, 1]: one of two has zero spread; the second group's
    advantages are 0):
        >>> import torch
        >>> m = signal_metrics(np.array([0, 0, 1, 1]), torch.tensor([1., 0., 1., 1.]),
        ...                    torch.tensor([[.7, .7], [-.7, 0.], [0., 0.], [0., 0.]]),
        ...                    torch.ones(4, 2), 1)
        >>> m[ZERO_SPREAD], m[MULTI_SAMPLE_GROUPS], m[ZERO_ADV], m[RESPONSE_SAMPLES]
        (0.5, 2.0, 0.5, 4.0)
    """
    std, sizes = group_spread(uid, seq_scores.detach().cpu().double().numpy())
    multi = sizes > 1
    zero_spread = int(((std == 0) & multi).sum())
    mask = response_mask.bool()  # (B, R)
    has_response = mask.any(-1)  # (B,)
    zero_adv = ((advantages == 0) | ~mask).all(-1) & has_response  # (B,)
    responses = int(has_response.sum())
    return {
        ZERO_SPREAD: zero_spread / int(multi.sum()) if multi.any() else float("nan"),
        MULTI_SAMPLE_GROUPS: float(multi.sum()),
        ZERO_ADV: int(zero_adv.sum()) / responses if responses else float("nan"),
        RESPONSE_SAMPLES: float(responses),
        GEN_ROUNDS: float(gen_rounds),
    }


def batch_signal_metrics(batch: DataProto, gen_rounds: int) -> dict[str, float]:
    """:func:`signal_metrics` of a step's final batch (``uid``, ``seq_scores``, ``advantages``,
    ``response_mask``)."""
    tensors = batch.batch
    return signal_metrics(
        batch.non_tensor_batch[K.UID],
        tensors[K.SEQ_SCORES],
        tensors[K.ADVANTAGES],
        tensors[K.RESPONSE_MASK],
        gen_rounds,
    )


def no_signal_line(step: int, metrics: dict[str, float]) -> str:
    """The warning line of a step without learning signal.

    >>> no_signal_line(3, {RESPONSE_SAMPLES: 8.0, ZERO_SPREAD: 1.0, MULTI_SAMPLE_GROUPS: 2.0})
    'step 3 has no learning signal: all 8 samples have advantage 0 (2 of 2 groups have zero reward spread); the policy gradient is zero'
    """
    groups = metrics.get(MULTI_SAMPLE_GROUPS, 0.0)
    spread = metrics.get(ZERO_SPREAD, float("nan"))
    zero = (
        ""
        if not groups
        else f" ({round(spread * groups)} of {int(groups)} groups have zero reward spread)"
    )
    return (
        f"step {step} has no learning signal: all {int(metrics[RESPONSE_SAMPLES])} samples have "
        f"advantage 0{zero}; the policy gradient is zero"
    )
