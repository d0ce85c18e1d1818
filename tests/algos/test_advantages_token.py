"""GAE, REINFORCE++ and ReMax: worked numbers, scalar-loop oracles and mask invariance."""

from __future__ import annotations

import math

import pytest
import torch
from torch.testing import assert_close

from stages.algos.advantages_token import (
    compute_gae_advantage_return,
    compute_reinforce_plus_plus_outcome_advantage,
    compute_remax_outcome_advantage,
    discounted_returns,
    gae_returns,
)
from stages.algos.masked import masked_whiten


def t(rows):
    return torch.tensor(rows, dtype=torch.float32)


def test_gae_three_tokens_undiscounted():  # STYLE.md's example
    adv, ret = gae_returns(
        t([[0.0, 0.0, 1.0]]), t([[0.5, 0.5, 0.5]]), t([[1, 1, 1]]), gamma=1.0, lam=1.0
    )
    assert_close(adv, t([[0.5, 0.5, 0.5]]))
    assert_close(ret, t([[1.0, 1.0, 1.0]]))


def test_gae_one_row_constant_advantage_whitens_to_exact_zero():
    adv, ret = compute_gae_advantage_return(
        t([[0.0, 0.0, 0.0, 1.0]]), torch.zeros(1, 4), torch.ones(1, 4)
    )
    assert torch.equal(adv, torch.zeros(1, 4))
    assert_close(ret, t([[1.0, 1.0, 1.0, 1.0]]))


def test_gae_masked_position_holds_whitened_carried_value():
    """As in verl 0.9.1: masked positions are not zeroed after whitening.

    Row 0: reward 2 at the end, V = 0 → A = [2, 2, 2].
    Row 1: mask [1, 0, 1], reward 1 at the end, V = 0 on valid tokens (9 on the masked one):
      t=2: δ = 1 → A = 1; t=1 (masked): carries A_next = 1 and V_next = 0; t=0: δ = 0 → A = 1.
    Valid advantages {2, 2, 2, 1, 1}: mean 1.6, unbiased var (3·0.16 + 2·0.36)/4 = 0.3.
    The masked slot holds (1 − 1.6)/√0.3 ≈ −1.0954; its return is A + V = 1 + 9 = 10.
    """
    rewards = t([[0.0, 0.0, 2.0], [0.0, 5.0, 1.0]])
    values = t([[0.0, 0.0, 0.0], [0.0, 9.0, 0.0]])
    mask = t([[1, 1, 1], [1, 0, 1]])
    adv, ret = compute_gae_advantage_return(rewards, values, mask)
    assert adv[1, 1].item() == pytest.approx((1 - 1.6) / math.sqrt(0.3 + 1e-8), abs=1e-4)
    assert adv[0, 0].item() == pytest.approx(0.4 / math.sqrt(0.3), abs=1e-4)
    assert ret[1].tolist() == [1.0, 10.0, 1.0]


def _gae_oracle(rewards, values, mask, gamma, lam):
    """Scalar per-row loop: the recursion written over valid tokens only."""
    adv = torch.zeros_like(rewards)
    for i in range(rewards.shape[0]):
        next_value, next_adv = 0.0, 0.0
        for step in reversed(range(rewards.shape[1])):
            if mask[i, step]:
                delta = rewards[i, step].item() + gamma * next_value - values[i, step].item()
                next_adv = delta + gamma * lam * next_adv
                next_value = values[i, step].item()
            adv[i, step] = next_adv
    return adv, adv + values


def _rpp_oracle(rewards, mask, gamma):
    returns = torch.zeros_like(rewards)
    for i in range(rewards.shape[0]):
        running = 0.0
        for step in reversed(range(rewards.shape[1])):
            if mask[i, step]:
                running = rewards[i, step].item() + gamma * running
                returns[i, step] = running
    return returns


def _random_case(seed, rows=6, width=9, holes=True):
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, width + 1, (rows,), generator=gen)
    mask = (torch.arange(width)[None] < lengths[:, None]).float()
    if holes:  # observation tokens inside responses (multi-turn)
        mask = mask * (torch.rand(rows, width, generator=gen) > 0.25).float()
        mask[:, 0] = 1.0
    return torch.randn(rows, width, generator=gen), torch.randn(rows, width, generator=gen), mask


@pytest.mark.parametrize("seed", range(4))
def test_gae_matches_scalar_loop(seed):
    rewards, values, mask = _random_case(seed)
    raw, ret = gae_returns(rewards, values, mask, gamma=0.9, lam=0.7)
    expected_raw, expected_ret = _gae_oracle(rewards, values, mask, 0.9, 0.7)
    assert_close(raw, expected_raw, atol=1e-5, rtol=1e-5)
    assert_close(ret, expected_ret, atol=1e-5, rtol=1e-5)
    adv, _ = compute_gae_advantage_return(rewards, values, mask, 0.9, 0.7)
    assert_close(adv, masked_whiten(expected_raw, mask), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("seed", range(4))
def test_reinforce_plus_plus_matches_scalar_loop(seed):
    rewards, _, mask = _random_case(seed)
    adv, ret = compute_reinforce_plus_plus_outcome_advantage(rewards, mask, config={"gamma": 0.8})
    expected = _rpp_oracle(rewards, mask, 0.8)
    assert_close(ret, expected, atol=1e-5, rtol=1e-5)
    assert_close(adv, masked_whiten(expected, mask) * mask, atol=1e-4, rtol=1e-4)


def test_reinforce_plus_plus_carries_return_across_observation_tokens():
    """verl 0.9.1: G is 0 at mask-0 tokens but the running value passes through (older verl reset it)."""
    assert_close(
        discounted_returns(t([[1.0, 5.0, 1.0]]), t([[1, 0, 1]]), gamma=0.5), t([[1.5, 0.0, 1.0]])
    )


def test_remax_baseline_is_subtracted_on_every_valid_token():
    adv, ret = compute_remax_outcome_advantage(
        t([[0.0, 0.0, 1.0, 0.0]]), t([0.4]), t([[1, 1, 1, 0]])
    )
    assert_close(adv, t([[0.6, 0.6, 0.6, 0.0]]))
    assert_close(ret, t([[1.0, 1.0, 1.0, 0.0]]))


def test_remax_rejects_misshaped_baselines():
    with pytest.raises(ValueError, match=r"reward_baselines must be \(B,\)"):
        compute_remax_outcome_advantage(torch.zeros(2, 3), torch.zeros(2, 1), torch.ones(2, 3))


# --- mask invariance: entries under response_mask == 0 never reach valid positions ---


def _scramble_masked(tensor, mask, seed):
    noise = torch.randn(tensor.shape, generator=torch.Generator().manual_seed(seed)) * 100
    return torch.where(mask.bool(), tensor, noise)


@pytest.mark.parametrize("seed", range(3))
def test_token_estimators_are_mask_invariant(seed):
    rewards, values, mask = _random_case(seed)
    rewards2, values2 = (
        _scramble_masked(rewards, mask, seed + 10),
        _scramble_masked(values, mask, seed + 20),
    )
    valid = mask.bool()
    for adv_a, adv_b in (
        (
            compute_gae_advantage_return(rewards, values, mask, 0.95, 0.9),
            compute_gae_advantage_return(rewards2, values2, mask, 0.95, 0.9),
        ),
        (
            compute_reinforce_plus_plus_outcome_advantage(rewards, mask, {"gamma": 0.9}),
            compute_reinforce_plus_plus_outcome_advantage(rewards2, mask, {"gamma": 0.9}),
        ),
        (
            compute_remax_outcome_advantage(rewards, t([0.3] * 6), mask),
            compute_remax_outcome_advantage(rewards2, t([0.3] * 6), mask),
        ),
    ):
        assert_close(adv_a[0][valid], adv_b[0][valid], atol=1e-5, rtol=1e-5)
        assert_close(adv_a[1][valid], adv_b[1][valid], atol=1e-5, rtol=1e-5)


def test_gae_empty_response_row_does_not_disturb_others():
    rewards, values, mask = _random_case(3, holes=False)
    with_empty = (
        torch.cat([rewards, torch.ones(1, rewards.shape[1])]),
        torch.cat([values, torch.ones(1, values.shape[1])]),
    )
    mask_with_empty = torch.cat([mask, torch.zeros(1, mask.shape[1])])
    adv, _ = compute_gae_advantage_return(*with_empty, mask_with_empty)
    expected, _ = compute_gae_advantage_return(rewards, values, mask)
    assert_close(adv[:-1][mask.bool()], expected[mask.bool()], atol=1e-5, rtol=1e-5)
