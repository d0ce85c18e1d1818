"""Masked reductions over token tensors, shared by estimators, losses and metrics.

Every function takes ``values`` and a same-shaped ``mask`` (1 = counts, 0 = ignored; bool, int or
float). Out-of-mask entries never reach the result, even when they hold NaN or inf.
"""

from __future__ import annotations

import torch
from torch import Tensor

#: the epsilon verl adds to a mask count before dividing (keeps all-masked rows finite)
MASK_EPS = 1e-8


def masked_sum(values: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Σ values·[mask], with out-of-mask entries (NaN included) replaced by 0 first.

    Example:
        >>> masked_sum(torch.tensor([1., float("nan"), 3.]), torch.tensor([1, 0, 1]))
        tensor(4.)
    """
    kept = torch.where(
        mask.bool(), values, torch.zeros((), dtype=values.dtype, device=values.device)
    )
    return kept.sum() if dim is None else kept.sum(dim=dim)


def masked_mean(values: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Σ values·[mask] / (Σ mask + 1e-8): an all-masked slice gives 0, not NaN.

    Example:
        >>> masked_mean(torch.tensor([[1., 2.], [3., 9.]]), torch.tensor([[1, 1], [1, 0]]), dim=-1)
        tensor([1.5000, 3.0000])
    """
    return masked_sum(values, mask, dim) / (mask.sum() if dim is None else mask.sum(dim=dim)).add(
        MASK_EPS
    )


def masked_var(values: Tensor, mask: Tensor, unbiased: bool = True) -> Tensor:
    """Variance over all masked entries, Bessel-corrected (n/(n−1)) when ``unbiased``.

    Raises ``ValueError`` when fewer than 2 entries are masked in (the correction is undefined).

    Example:
        >>> masked_var(torch.tensor([1., 3., 100.]), torch.tensor([1, 1, 0]))
        tensor(2.)
    """
    mean = masked_mean(values, mask)
    variance = masked_mean((values - mean) ** 2, mask)
    if not unbiased:
        return variance
    count = mask.sum()
    if count <= 1:
        raise ValueError(
            f"masked_var needs at least 2 masked-in entries for the unbiased estimate, got {int(count)}; "
            "check that response_mask is not empty"
        )
    return variance * count / (count - 1)


def masked_whiten(values: Tensor, mask: Tensor, shift_mean: bool = True) -> Tensor:
    """(values − mean) · rsqrt(var + 1e-8), statistics over every masked entry of the batch.

    The result is not re-masked: out-of-mask positions hold whitened values of whatever was
    there (verl's behaviour). Callers multiply by the mask when they need zeros.

    Example:
        >>> masked_whiten(torch.tensor([1., 3., 5.]), torch.tensor([1, 1, 1]))
        tensor([-1.,  0.,  1.])
    """
    mean = masked_mean(values, mask)
    whitened = (values - mean) * torch.rsqrt(masked_var(values, mask) + MASK_EPS)
    return whitened if shift_mean else whitened + mean
