"""Token entropy of the policy's categorical distribution, and the entropy term of the actor loss.

H(z) = logsumexp(z) − Σ_v softmax(z)_v · z_v for logits z of shape (..., V). Both terms are
computed from the max-shifted logits, so large logits do not overflow; vocabulary entries with
z = −inf (masked tokens) have probability 0 and contribute 0, not NaN.

Memory: rows are processed ``chunk_size`` at a time and upcast to float32 per chunk, so a bf16
(B, T, V) input never gets a full float32 copy. With gradients enabled each chunk runs under
activation checkpointing: only the chunk input (a view of the logits) is saved and the softmax is
recomputed in backward, so autograd does not keep (B, T, V) intermediates either.

Example (uniform over 4 tokens: log 4; one certain token: 0; a masked vocab entry is ignored):
    >>> entropy_from_logits(torch.tensor([[0., 0., 0., 0.], [0., -1e4, -1e4, -1e4]]))
    tensor([1.3863, 0.0000])
    >>> entropy_from_logits(torch.tensor([0., 0., float("-inf")]))
    tensor(0.6931)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from stages.algos.aggregation import GlobalBatchInfo, aggregate_loss

#: rows (B·T positions) per chunk; ≈ 2048·V·4 bytes of float32 temporaries (1.2 GiB at V = 152k)
DEFAULT_ENTROPY_CHUNK_ROWS = 2048


def _entropy_rows(logits: Tensor) -> Tensor:
    """(N, V) → (N,) entropy of each row, computed in at least float32."""
    z = logits.to(torch.promote_types(logits.dtype, torch.float32))
    z = z - z.amax(dim=-1, keepdim=True).detach()  # (N, V); H is shift-invariant
    log_normaliser = torch.logsumexp(z, dim=-1)  # (N,)
    probs = torch.exp(z - log_normaliser.unsqueeze(-1))  # (N, V)
    finite_z = torch.where(
        probs > 0, z, torch.zeros((), dtype=z.dtype, device=z.device)
    )  # 0·(−inf) → 0
    expected_logit = (probs * finite_z).sum(dim=-1)  # (N,)
    return log_normaliser - expected_logit


def entropy_from_logits(logits: Tensor, chunk_size: int = DEFAULT_ENTROPY_CHUNK_ROWS) -> Tensor:
    """Entropy of softmax(logits) along the last dimension.

    Args:
        logits: (..., V), typically (B, R, V), any float dtype; rows must not be all −inf.
        chunk_size: rows (positions) processed per chunk, ≥ 1.

    Returns:
        (...) entropy in nats, dtype promote(logits.dtype, float32); differentiable.
    """
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be ≥ 1, got {chunk_size}")
    rows = logits.reshape(-1, logits.shape[-1])  # (N, V), a view when logits are contiguous
    use_checkpoint = torch.is_grad_enabled() and logits.requires_grad
    pieces = []
    for start in range(0, rows.shape[0], chunk_size):
        chunk = rows[start : start + chunk_size]
        if use_checkpoint:
            pieces.append(checkpoint(_entropy_rows, chunk, use_reentrant=False))
        else:
            pieces.append(_entropy_rows(chunk))
    if not pieces:
        return logits.new_zeros(
            logits.shape[:-1], dtype=torch.promote_types(logits.dtype, torch.float32)
        )
    return torch.cat(pieces).reshape(logits.shape[:-1])


def compute_entropy_loss(
    logits: Tensor,
    response_mask: Tensor,
    loss_agg_mode: str = "token-mean",
    global_batch_info: GlobalBatchInfo | Mapping[str, Any] | None = None,
) -> Tensor:
    """agg_loss of the token entropy (verl's name and first three parameters).

    Args:
        logits: (B, R, V) response logits.
        response_mask: (B, R) 1 = token counts.
        loss_agg_mode: ``agg_loss`` mode.
        global_batch_info: global denominators; None = local counts (verl's behaviour).

    Returns:
        () mean entropy under the chosen aggregation; the actor subtracts entropy_coeff × this.

    Example:
        >>> compute_entropy_loss(torch.zeros(1, 2, 4), torch.tensor([[1, 0]]))
        tensor(1.3863)
    """
    token_entropy = entropy_from_logits(logits)  # (B, R)
    return aggregate_loss(token_entropy, response_mask, loss_agg_mode, global_batch_info)
