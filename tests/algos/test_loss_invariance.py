"""The loss of a mini-batch does not depend on its split into micro-batches and DP ranks.

Composition modelled (as in verl's engine workers): the mini-batch's B rows are cut into d ranks ×
k micro-batches (contiguous, possibly uneven, possibly with empty rows); every micro-batch
computes its partial loss with the mini-batch's global counts (N_tok = Σ mask over all B rows,
N_seq = B, dp_size = d); each rank sums its partial losses and backpropagates the sum (gradient
accumulation); DP averages the d gradients. Then

    (1/d) Σ_r Σ_m partial(r, m)  ==  loss of the whole batch at once with dp_size = 1 (same counts)

and the averaged gradient of a *shared* parameter equals the whole-batch gradient.
"""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.testing import assert_close

from stages.algos.actor_loss import compute_actor_loss
from stages.algos.aggregation import GlobalBatchInfo, aggregate_loss

ALL_MODES = [
    "token-mean",
    "token-sum",
    "seq-mean-token-sum",
    "seq-mean-token-mean",
    "seq-mean-token-sum-norm",
]
FEATURES = 3


@st.composite
def split_batches(draw: st.DrawFn) -> dict:
    """A random (B, R) batch with a random mask (empty rows allowed) and a d × k row split."""
    dp_size = draw(st.integers(1, 3))
    micro_batches = draw(st.integers(1, 3))
    num_rows = draw(st.integers(dp_size * micro_batches, 10))
    width = draw(st.integers(1, 6))
    seed = draw(st.integers(0, 2**31 - 1))
    generator = torch.Generator().manual_seed(seed)
    mask = torch.rand(num_rows, width, generator=generator) < draw(
        st.sampled_from([0.0, 0.3, 0.7, 1.0])
    )
    cuts = (
        sorted(
            draw(
                st.lists(
                    st.integers(1, num_rows - 1),
                    min_size=dp_size * micro_batches - 1,
                    max_size=dp_size * micro_batches - 1,
                    unique=True,
                )
            )
        )
        if num_rows > 1
        else []
    )
    bounds = [0, *cuts, num_rows]
    pieces = [slice(bounds[i], bounds[i + 1]) for i in range(len(bounds) - 1)]
    ranks = [pieces[r * micro_batches : (r + 1) * micro_batches] for r in range(dp_size)]
    return {"mask": mask, "ranks": ranks, "dp_size": dp_size, "generator": generator}


def _features(case: dict) -> torch.Tensor:
    num_rows, width = case["mask"].shape
    return torch.randn(num_rows, width, FEATURES, generator=case["generator"], dtype=torch.float64)


def _split_loss_and_grad(
    case: dict, loss_of_rows, weights: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Σ over ranks of (Σ_m partial) / d, and the DP average of the per-rank gradients of ``weights``."""
    total, grads = torch.zeros((), dtype=torch.float64), []
    for rank_pieces in case["ranks"]:
        shared = weights.detach().clone().requires_grad_(True)  # each rank holds a replica
        rank_loss = sum(loss_of_rows(rows, shared) for rows in rank_pieces)
        (grad,) = torch.autograd.grad(rank_loss, shared)
        grads.append(grad)
        total = total + rank_loss.detach()
    return total / case["dp_size"], torch.stack(grads).mean(dim=0)


@settings(max_examples=40, deadline=None)
@given(case=split_batches(), mode=st.sampled_from(ALL_MODES), explicit_scale=st.booleans())
def test_agg_loss_is_split_invariant(case: dict, mode: str, explicit_scale: bool) -> None:
    mask, features = case["mask"], _features(case)
    scale = 2.5 if explicit_scale else None
    global_info = GlobalBatchInfo(case["dp_size"], mask.sum(), mask.shape[0], scale)
    whole_info = GlobalBatchInfo(1, mask.sum(), mask.shape[0], scale)
    weights = torch.tensor([0.3, -0.7, 1.1], dtype=torch.float64)

    def token_loss(rows: slice, w: torch.Tensor) -> torch.Tensor:
        z = features[rows] @ w  # (b, R)
        return z + 0.5 * z**2

    def partial(rows: slice, w: torch.Tensor) -> torch.Tensor:
        return aggregate_loss(token_loss(rows, w), mask[rows], mode, global_info)

    split_loss, split_grad = _split_loss_and_grad(case, partial, weights)
    shared = weights.clone().requires_grad_(True)
    whole = aggregate_loss(token_loss(slice(None), shared), mask, mode, whole_info)
    (whole_grad,) = torch.autograd.grad(whole, shared)
    assert_close(split_loss, whole.detach())
    assert_close(split_grad, whole_grad)


@settings(max_examples=25, deadline=None)
@given(
    case=split_batches(),
    mode=st.sampled_from(ALL_MODES),
    loss_mode=st.sampled_from(["vanilla", "gspo", "sapo", "gpg", "cispo"]),
)
def test_actor_loss_with_entropy_and_kl_is_split_invariant(
    case: dict, mode: str, loss_mode: str
) -> None:
    mask, features = case["mask"], _features(case)
    num_rows, width = mask.shape
    old_log_prob = -torch.rand(num_rows, width, generator=case["generator"], dtype=torch.float64)
    ref_log_prob = -torch.rand(num_rows, width, generator=case["generator"], dtype=torch.float64)
    advantages = torch.randn(num_rows, width, generator=case["generator"], dtype=torch.float64)
    config = {
        "loss_agg_mode": mode,
        "policy_loss": {"loss_mode": loss_mode},
        "entropy_coeff": 0.01,
        "use_kl_loss": True,
        "kl_loss_coef": 0.1,
        "kl_loss_type": "k3",
    }
    weights = torch.tensor([0.2, -0.1, 0.3], dtype=torch.float64)

    def loss_of_rows(rows: slice, w: torch.Tensor, info: GlobalBatchInfo) -> torch.Tensor:
        log_prob = -torch.nn.functional.softplus(features[rows] @ w)  # (b, R), ≤ 0
        entropy = torch.sigmoid(features[rows, :, 0] * w[0])  # (b, R), any differentiable stand-in
        loss, _ = compute_actor_loss(
            log_prob,
            old_log_prob[rows],
            advantages[rows],
            mask[rows],
            config,
            entropy=entropy,
            ref_log_prob=ref_log_prob[rows],
            global_batch_info=info,
        )
        return loss

    global_info = GlobalBatchInfo(case["dp_size"], mask.sum(), num_rows)
    split_loss, split_grad = _split_loss_and_grad(
        case, lambda rows, w: loss_of_rows(rows, w, global_info), weights
    )
    shared = weights.clone().requires_grad_(True)
    whole = loss_of_rows(slice(None), shared, GlobalBatchInfo(1, mask.sum(), num_rows))
    (whole_grad,) = torch.autograd.grad(whole, shared)
    assert_close(split_loss, whole.detach())
    assert_close(split_grad, whole_grad)


@settings(max_examples=30, deadline=None)
@given(case=split_batches(), mode=st.sampled_from(ALL_MODES))
def test_explicit_counts_match_local_defaults_without_empty_rows(case: dict, mode: str) -> None:
    """With dp_size 1, passing N_tok = Σ mask and N_seq = #non-empty rows reproduces the local defaults."""
    mask, features = case["mask"], _features(case)
    loss_mat = features[..., 0]
    explicit = GlobalBatchInfo(1, mask.sum(), (mask.sum(dim=-1) > 0).sum())
    assert_close(
        aggregate_loss(loss_mat, mask, mode, explicit), aggregate_loss(loss_mat, mask, mode)
    )
