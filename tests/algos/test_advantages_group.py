"""Group-based outcome estimators: worked numbers (verl 0.9.1's behaviour), loop oracles, edge cases."""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import pytest
import torch
from torch.testing import assert_close

from stages.algos.advantages_group import (
    compute_gpg_outcome_advantage,
    compute_grpo_outcome_advantage,
    compute_grpo_passk_outcome_advantage,
    compute_grpo_vectorized_outcome_advantage,
    compute_opo_outcome_advantage,
    compute_reinforce_plus_plus_baseline_outcome_advantage,
    compute_rloo_outcome_advantage,
    compute_rloo_vectorized_outcome_advantage,
    group_ids,
)

# verl 0.9.1's numbers: groups {1, 0}, {1, 1} and a singleton {1}
SCORES = torch.tensor([1.0, 0.0, 1.0, 1.0, 1.0])
UID = np.array(["a", "a", "b", "b", "c"], dtype=object)


def _outcome_rows(scores: torch.Tensor, width: int = 3) -> tuple[torch.Tensor, torch.Tensor]:
    """Rewards with each score at the last of `width` valid tokens; mask all ones."""
    rewards = torch.zeros(len(scores), width)
    rewards[:, -1] = scores
    return rewards, torch.ones(len(scores), width)


def _seq(advantages: torch.Tensor) -> torch.Tensor:
    return advantages[:, 0]


@pytest.mark.parametrize(
    "fn", [compute_grpo_outcome_advantage, compute_grpo_vectorized_outcome_advantage]
)
def test_grpo_worked_example(fn):
    rewards, mask = _outcome_rows(SCORES)
    adv, ret = fn(rewards, mask, UID)
    assert_close(
        _seq(adv), torch.tensor([0.70710, -0.70710, 0.0, 0.0, 0.999999]), atol=1e-5, rtol=0
    )
    assert torch.equal(adv, ret)
    dr_grpo, _ = fn(rewards, mask, UID, norm_adv_by_std_in_grpo=False)
    assert_close(_seq(dr_grpo), torch.tensor([0.5, -0.5, 0.0, 0.0, 1.0]))


def test_rloo_loop_and_vectorized_disagree_on_singletons():
    rewards, mask = _outcome_rows(SCORES)
    assert_close(
        _seq(compute_rloo_outcome_advantage(rewards, mask, UID)[0]),
        torch.tensor([1.0, -1.0, 0.0, 0.0, 1.0]),
    )
    assert_close(
        _seq(compute_rloo_vectorized_outcome_advantage(rewards, mask, UID)[0]),
        torch.tensor([1.0, -1.0, 0.0, 0.0, 0.0]),
    )


def test_gpg_opo_passk_worked_examples():
    rewards, mask = _outcome_rows(SCORES)
    assert_close(
        _seq(compute_gpg_outcome_advantage(rewards, mask, UID)[0]),
        torch.tensor([0.625, -0.625, 0.0, 0.0, 1.25]),
    )
    assert_close(
        _seq(compute_opo_outcome_advantage(rewards, mask, UID)[0]),
        torch.tensor([0.5, -0.5, 0.0, 0.0, 1.0]),
    )
    pair_rewards, pair_mask = _outcome_rows(torch.tensor([1.0, 0.0]))
    passk, _ = compute_grpo_passk_outcome_advantage(
        pair_rewards, pair_mask, np.array(["a", "a"], dtype=object)
    )
    assert_close(_seq(passk), torch.tensor([1.41421, 0.0]), atol=1e-4, rtol=0)


def test_passk_flag_from_config_and_singleton_error():
    rewards, mask = _outcome_rows(torch.tensor([3.0, 1.0, 2.0]))
    uid = np.array([0, 0, 0])
    unnormalised, _ = compute_grpo_passk_outcome_advantage(
        rewards, mask, uid, config={"norm_adv_by_std_in_grpo": False}
    )
    assert_close(_seq(unnormalised), torch.tensor([1.0, 0.0, 0.0]))  # best row only: 3 − 2
    with pytest.raises(ValueError, match=r"uid='lonely' has 1"):
        compute_grpo_passk_outcome_advantage(
            rewards, mask, np.array(["x", "x", "lonely"], dtype=object)
        )


# --- loop oracles (the fact sheet's per-row definitions) ---


def _groups(index) -> dict:
    members = defaultdict(list)
    for row, uid in enumerate(index):
        members[uid].append(row)
    return members


def _grpo_oracle(scores, index, norm: bool, eps: float = 1e-6) -> torch.Tensor:
    out = torch.zeros_like(scores)
    for rows in _groups(index).values():
        group = scores[rows]
        mean, std = (
            (group.mean(), group.std()) if len(rows) > 1 else (torch.tensor(0.0), torch.tensor(1.0))
        )
        for row in rows:
            out[row] = (scores[row] - mean) / (std + eps) if norm else scores[row] - mean
    return out


def _rloo_oracle(scores, index, singleton_keeps: bool) -> torch.Tensor:
    out = torch.zeros_like(scores)
    for rows in _groups(index).values():
        n = len(rows)
        for row in rows:
            if n > 1:
                out[row] = scores[row] - (scores[rows].sum() - scores[row]) / (n - 1)
            else:
                out[row] = scores[row] if singleton_keeps else 0.0
    return out


def _random_batch(seed: int, rows: int = 40, width: int = 6):
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, width + 1, (rows,), generator=gen)
    mask = (torch.arange(width)[None] < lengths[:, None]).float()
    rewards = torch.randn(rows, width, generator=gen) * mask
    index = np.array(
        [f"p{v}" for v in torch.randint(0, 12, (rows,), generator=gen).tolist()], dtype=object
    )
    return rewards, mask, index


@pytest.mark.parametrize("seed", range(5))
def test_vectorised_grpo_and_rloo_match_loop_oracles(seed):
    rewards, mask, index = _random_batch(seed)
    scores = rewards.sum(-1)
    for norm in (True, False):
        adv, _ = compute_grpo_outcome_advantage(rewards, mask, index, norm_adv_by_std_in_grpo=norm)
        assert_close(adv, _grpo_oracle(scores, index, norm)[:, None] * mask, atol=1e-5, rtol=1e-5)
    assert_close(
        compute_rloo_outcome_advantage(rewards, mask, index)[0],
        _rloo_oracle(scores, index, True)[:, None] * mask,
    )
    assert_close(
        compute_rloo_vectorized_outcome_advantage(rewards, mask, index)[0],
        _rloo_oracle(scores, index, False)[:, None] * mask,
    )


# --- edge cases ---

GROUP_FNS = [
    compute_grpo_outcome_advantage,
    compute_grpo_vectorized_outcome_advantage,
    compute_rloo_outcome_advantage,
    compute_rloo_vectorized_outcome_advantage,
    compute_opo_outcome_advantage,
    compute_gpg_outcome_advantage,
    compute_reinforce_plus_plus_baseline_outcome_advantage,
]


@pytest.mark.parametrize("fn", GROUP_FNS)
def test_all_equal_groups_give_zero(fn):
    rewards, mask = _outcome_rows(torch.tensor([0.7, 0.7, 0.7, 2.0, 2.0, 2.0]))
    index = np.array([0, 0, 0, 1, 1, 1])
    adv, _ = fn(rewards, mask, index)
    assert_close(adv, torch.zeros_like(adv))


@pytest.mark.parametrize("fn", [*GROUP_FNS, compute_grpo_passk_outcome_advantage])
def test_empty_responses_and_padding_get_zero(fn):
    rewards = torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.0, 0.0], [2.0, 0.0, 0.0], [0.5, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [0.0, 0.0, 0.0], [1.0, 0.0, 0.0], [1.0, 1.0, 1.0]])
    adv, ret = fn(rewards, mask, np.array(["a", "a", "b", "b"], dtype=object))
    assert torch.isfinite(adv).all() and torch.isfinite(ret).all()
    assert torch.equal(adv[mask == 0], torch.zeros(int((mask == 0).sum())))


def test_opo_group_of_empty_responses_is_finite():
    rewards, mask = torch.zeros(2, 3), torch.zeros(2, 3)
    adv, _ = compute_opo_outcome_advantage(rewards, mask, np.array([0, 0]))
    assert torch.equal(adv, torch.zeros(2, 3))


@pytest.mark.parametrize("fn", GROUP_FNS)
def test_outputs_on_valid_tokens_ignore_where_the_score_sits(fn):
    """Only s_i = Σ_t r_t matters: moving a row's reward between its tokens changes nothing."""
    rewards, mask, index = _random_batch(7)
    moved = torch.zeros_like(rewards)
    moved[:, 0] = rewards.sum(-1)
    assert_close(fn(rewards, mask, index)[0], fn(moved, mask, index)[0], atol=1e-5, rtol=1e-5)


def test_index_may_be_ints_strings_or_tensor():
    rewards, mask = _outcome_rows(SCORES)
    expected = compute_grpo_outcome_advantage(rewards, mask, UID)[0]
    for index in (
        np.array([4, 4, 2, 2, 9]),
        torch.tensor([4, 4, 2, 2, 9]),
        ["a", "a", "b", "b", "c"],
    ):
        assert_close(compute_grpo_outcome_advantage(rewards, mask, index)[0], expected)


def test_group_ids_handles_unorderable_objects():
    group, uids = group_ids(np.array([("t", 1), "s", ("t", 1)], dtype=object))
    assert group[0] == group[2] != group[1] and len(uids) == 2


def test_index_length_mismatch_is_reported():
    rewards, mask = _outcome_rows(SCORES)
    with pytest.raises(ValueError, match="index has 4 rows but token_level_rewards has 5"):
        compute_grpo_outcome_advantage(rewards, mask, UID[:4])
