"""Token-level advantage estimators: GAE, REINFORCE++ and ReMax.

These walk the response backwards token by token, vectorised over the batch (one Python iteration
per token position, never per row). Tokens with ``response_mask == 0`` inside a response (tool
output, observations in multi-turn) are *skipped*: the running quantities pass through them
unchanged, as in verl 0.9.1.

Names and parameters are verl 0.9.1's (``verl.trainer.ppo.core_algos``). The verl-compatible
functions return what verl returns (GAE advantages already whitened); :func:`gae_returns` is the
un-whitened recursion the ppoflow estimator composes with an explicit whitening step.

The ``ADV_ESTIMATORS`` entries ``gae``, ``reinforce_plus_plus`` and ``remax`` are registered here,
each beside the math it calls (:func:`gae_advantages`, :func:`reinforce_plus_plus_advantages`,
:func:`remax_advantages`, with the registry's signature).

Shapes: B samples, R response tokens.
"""

from __future__ import annotations

import torch
from torch import Tensor

from dataproto import keys
from stages.algos.advantage_registry import register_adv_est, require_input
from stages.algos.config_view import read_field
from stages.algos.masked import masked_whiten


@torch.no_grad()
def gae_returns(
    token_level_rewards: Tensor,
    values: Tensor,
    response_mask: Tensor,
    gamma: float = 1.0,
    lam: float = 1.0,
) -> tuple[Tensor, Tensor]:
    """Generalized advantage estimation (GAE, arXiv:1506.02438) without normalisation.

    Backwards over t: δ_t = r_t + γ·V_next − V_t and A_t = δ_t + γλ·A_next, with V_next, A_next
    the value and advantage of the next *valid* token (0 past the end). At a mask-0 token V_next and
    A_next are carried through unchanged and the stored A_t is that carried A_next, so observation
    tokens are skipped and out-of-mask entries of rewards and values never reach a valid position.

    Args:
        token_level_rewards: (B, R) per-token rewards r_t.
        values: (B, R) critic values V_t.
        response_mask: (B, R) 1 on tokens the policy generated.
        gamma: discount γ. lam: GAE λ.

    Returns:
        (advantages, returns), both (B, R): the raw A_t and returns = A_t + V_t. Not masked.

    Example (3 tokens, reward at the end, V = 0.5, γ = λ = 1):
        >>> gae_returns(torch.tensor([[0., 0., 1.]]), torch.tensor([[.5, .5, .5]]), torch.ones(1, 3))
        (tensor([[0.5000, 0.5000, 0.5000]]), tensor([[1., 1., 1.]]))
    """
    is_valid = response_mask.bool()
    next_value = torch.zeros_like(values[:, 0])  # (B,)
    next_advantage = torch.zeros_like(next_value)  # (B,)
    advantages = torch.empty_like(values)  # (B, R)
    for t in reversed(range(values.shape[1])):
        delta = token_level_rewards[:, t] + gamma * next_value - values[:, t]
        advantage_t = delta + gamma * lam * next_advantage
        next_value = torch.where(is_valid[:, t], values[:, t], next_value)
        next_advantage = torch.where(is_valid[:, t], advantage_t, next_advantage)
        advantages[:, t] = next_advantage
    return advantages, advantages + values


def compute_gae_advantage_return(
    token_level_rewards: Tensor,
    values: Tensor,
    response_mask: Tensor,
    gamma: float = 1.0,
    lam: float = 1.0,
) -> tuple[Tensor, Tensor]:
    """verl's GAE: :func:`gae_returns`, then advantages whitened over every valid token of the batch.

    advantages = masked_whiten(A, response_mask) (not re-masked: out-of-mask positions hold the
    whitened carried value); returns = A + V, before whitening. Needs ≥ 2 valid tokens.

    Example (the advantages of one row are constant, so whitening gives exactly 0):
        >>> adv, ret = compute_gae_advantage_return(torch.tensor([[0., 0., 1.]]), torch.zeros(1, 3),
        ...                                         torch.ones(1, 3))
        >>> adv, ret
        (tensor([[0., 0., 0.]]), tensor([[1., 1., 1.]]))
    """
    raw_advantages, returns = gae_returns(token_level_rewards, values, response_mask, gamma, lam)
    return masked_whiten(raw_advantages, response_mask), returns


@register_adv_est("gae", needs_values=True)
def gae_advantages(
    token_level_rewards,
    response_mask,
    *,
    index=None,
    values=None,
    reward_baselines=None,
    config=None,
):
    """GAE with ``config.gamma``/``config.lam``, then whitened over the batch's valid tokens (verl)."""
    values = require_input(values, "gae", keys.VALUES, "(B, R) critic values; enable the critic")
    gamma, lam = read_field(config, "gamma"), read_field(config, "lam")
    raw_advantages, returns = gae_returns(token_level_rewards, values, response_mask, gamma, lam)
    advantages = masked_whiten(raw_advantages, response_mask)  # policy step: batch normalisation
    return advantages, returns


@torch.no_grad()
def discounted_returns(
    token_level_rewards: Tensor, response_mask: Tensor, gamma: float = 1.0
) -> Tensor:
    """Reward-to-go G_t = r_t + γ·G_next over valid tokens, (B, R); 0 at mask-0 tokens.

    The running G passes through mask-0 tokens unchanged (verl 0.9.1; older verl reset it to 0).

    Example (the middle token is an observation):
        >>> discounted_returns(torch.tensor([[1., 5., 1.]]), torch.tensor([[1, 0, 1]]), gamma=0.5)
        tensor([[1.5000, 0.0000, 1.0000]])
    """
    is_valid = response_mask.bool()
    running = torch.zeros_like(token_level_rewards[:, 0])  # (B,)
    returns = torch.zeros_like(token_level_rewards)  # (B, R)
    for t in reversed(range(token_level_rewards.shape[1])):
        candidate = token_level_rewards[:, t] + gamma * running
        returns[:, t] = torch.where(is_valid[:, t], candidate, torch.zeros_like(candidate))
        running = torch.where(is_valid[:, t], candidate, running)
    return returns


def compute_reinforce_plus_plus_outcome_advantage(
    token_level_rewards: Tensor, response_mask: Tensor, config=None, **kwargs
) -> tuple[Tensor, Tensor]:
    """REINFORCE++ (arXiv:2501.03262): whitened discounted reward-to-go.

    returns = G (:func:`discounted_returns`, γ = ``config.gamma``, default 1.0);
    advantages = masked_whiten(G, mask)·mask, statistics over all valid tokens of the batch.

    Example:
        >>> adv, ret = compute_reinforce_plus_plus_outcome_advantage(
        ...     torch.tensor([[0., 1.], [0., 0.]]), torch.ones(2, 2), {"gamma": 1.0})
        >>> adv
        tensor([[ 0.8660,  0.8660],
                [-0.8660, -0.8660]])
    """
    returns = discounted_returns(token_level_rewards, response_mask, read_field(config, "gamma"))
    advantages = masked_whiten(returns, response_mask) * response_mask
    return advantages, returns


@register_adv_est("reinforce_plus_plus")
def reinforce_plus_plus_advantages(
    token_level_rewards,
    response_mask,
    *,
    index=None,
    values=None,
    reward_baselines=None,
    config=None,
):
    """REINFORCE++: whitened reward-to-go with γ = ``config.gamma``; returns the un-whitened G."""
    return compute_reinforce_plus_plus_outcome_advantage(token_level_rewards, response_mask, config)


@torch.no_grad()
def compute_remax_outcome_advantage(
    token_level_rewards: Tensor,
    reward_baselines: Tensor,
    response_mask: Tensor,
    config=None,
    **kwargs,
) -> tuple[Tensor, Tensor]:
    """ReMax (arXiv:2310.10505): the greedy sample's reward is the baseline. Not whitened.

    returns_t = Σ_{t' ≥ t} r_{t'}·mask_{t'}; A_t = returns_t − b·mask_t with b = ``reward_baselines``.

    Args:
        reward_baselines: (B,) reward of the greedy response to the same prompt.

    Example:
        >>> compute_remax_outcome_advantage(torch.tensor([[0., 1.]]), torch.tensor([0.4]), torch.ones(1, 2))[0]
        tensor([[0.6000, 0.6000]])
    """
    if reward_baselines.shape != token_level_rewards.shape[:1]:
        raise ValueError(
            f"reward_baselines must be (B,) = {tuple(token_level_rewards.shape[:1])}, "
            f"got {tuple(reward_baselines.shape)}"
        )
    returns = (token_level_rewards * response_mask).flip(dims=[-1]).cumsum(dim=-1).flip(dims=[-1])
    advantages = returns - reward_baselines.unsqueeze(-1) * response_mask
    return advantages, returns


@register_adv_est("remax", needs_greedy_baseline=True)
def remax_advantages(
    token_level_rewards,
    response_mask,
    *,
    index=None,
    values=None,
    reward_baselines=None,
    config=None,
):
    """ReMax: reward-to-go minus the greedy sample's reward; not whitened."""
    baselines = require_input(
        reward_baselines, "remax", keys.REWARD_BASELINES, "(B,) greedy-sample rewards"
    )
    return compute_remax_outcome_advantage(token_level_rewards, baselines, response_mask)
