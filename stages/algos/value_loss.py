"""Clipped value-function loss of the PPO critic.

v_clip = clamp(v_pred, v_old − c, v_old + c), c = ``cliprange_value``;
vf_loss = ½ · agg_loss(max((v_pred − R)², (v_clip − R)²)), with the same global denominators as
the actor (see ``aggregation.py``), so the critic's accumulated gradient does not depend on the
micro-batch / DP split either. vf_clipfrac = masked mean of [(v_clip − R)² > (v_pred − R)²]
over the valid tokens of this micro-batch.

Masked-out entries (response_mask == 0) never reach the loss or the gradient, even if they hold
NaN: ``vpreds`` is replaced by 0 there with ``torch.where`` before use.

Example (one token clipped: v_old 0, c 0.5, v_pred 2, R 0 → (0.5)² < 2², the larger wins):
    >>> vpreds, returns, values = torch.tensor([[2.0, 1.0]]), torch.tensor([[0.0, 1.0]]), torch.zeros(1, 2)
    >>> vf_loss, vf_clipfrac = compute_value_loss(vpreds, returns, values, torch.ones(1, 2), 0.5)
    >>> vf_loss.item(), vf_clipfrac.item()  # ½·mean(max(4, .25), max(0, .25)) = ½·2.125
    (1.0625, 0.5)
"""

from __future__ import annotations

import torch
from torch import Tensor

from stages.algos.aggregation import Count, GlobalBatchInfo, aggregate_loss
from stages.algos.masked import masked_mean
from stages.algos.policy_loss_config import zero_masked


def compute_value_loss(
    vpreds: Tensor,
    returns: Tensor,
    values: Tensor,
    response_mask: Tensor,
    cliprange_value: float,
    loss_agg_mode: str = "token-mean",
    dp_size: int = 1,
    batch_num_tokens: Count | None = None,
    global_batch_size: Count | None = None,
    loss_scale_factor: float | None = None,
) -> tuple[Tensor, Tensor]:
    """Clipped critic loss (module formula) with verl's signature.

    Args:
        vpreds: (B, R) values predicted by the critic being trained, differentiable.
        returns: (B, R) regression targets (GAE returns).
        values: (B, R) values of the critic that produced the rollout (v_old).
        response_mask: (B, R) 1 = token counts.
        cliprange_value: c, the half-width of the trust region around v_old (verl default 0.5).
        loss_agg_mode, dp_size, batch_num_tokens, global_batch_size, loss_scale_factor: as in
            ``agg_loss``; pass ``**GlobalBatchInfo(...).as_kwargs()`` for the global form.

    Returns:
        (vf_loss scalar, vf_clipfrac 0-d tensor, detached).
    """
    vpreds = zero_masked(vpreds, response_mask)
    vpreds_clipped = torch.clamp(vpreds, values - cliprange_value, values + cliprange_value)
    loss_unclipped = (vpreds - returns) ** 2  # (B, R)
    loss_clipped = (vpreds_clipped - returns) ** 2  # (B, R)
    info = GlobalBatchInfo(dp_size, batch_num_tokens, global_batch_size, loss_scale_factor)
    vf_loss = 0.5 * aggregate_loss(
        torch.maximum(loss_unclipped, loss_clipped), response_mask, loss_agg_mode, info
    )
    vf_clipfrac = masked_mean((loss_clipped > loss_unclipped).float(), response_mask)
    return vf_loss, vf_clipfrac.detach()
