"""compute_advantage (delta, no mutation) and compute_advantage_inplace (verl port)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from tensordict import TensorDict
from torch.testing import assert_close

from dataproto.protocol import DataProto
from stages.algos.advantages import ADV_ESTIMATORS, register_adv_est
from stages.algos.compute_advantage import (
    compute_advantage,
    compute_advantage_inplace,
    compute_response_mask,
    response_mask_from_attention,
)

# prompts P = 3 (left-padded), responses R = 3 (right-padded)
ATTENTION = torch.tensor([[0, 1, 1, 1, 1, 0], [1, 1, 1, 1, 1, 1], [0, 0, 1, 1, 0, 0]])
RESPONSE_MASK = torch.tensor([[1, 1, 0], [1, 1, 1], [1, 0, 0]])


def make_batch(**extra_tensors) -> DataProto:
    tensors = {
        "token_level_rewards": torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.0, 0.0], [0.5, 0.0, 0.0]]),
        "attention_mask": ATTENTION,
        "responses": torch.zeros(3, 3, dtype=torch.long),
        **extra_tensors,
    }
    uid = np.array(["p0", "p0", "p1"], dtype=object)
    return DataProto(
        batch=TensorDict(tensors, batch_size=[3]), non_tensor_batch={"uid": uid}, meta_info={"k": 1}
    )


def test_delta_holds_only_advantages_and_returns_and_input_is_untouched():
    batch = make_batch(response_mask=RESPONSE_MASK)
    before = {key: value.clone() for key, value in batch.batch.items()}
    delta = compute_advantage(batch, "grpo")
    assert set(delta.batch.keys()) == {"advantages", "returns"}
    assert set(batch.batch.keys()) == set(before)
    assert all(torch.equal(batch.batch[key], value) for key, value in before.items())
    assert_close(
        delta.batch["advantages"][:, 0], torch.tensor([0.7071, -0.7071, 0.5]), atol=1e-4, rtol=0
    )


def test_response_mask_is_derived_from_attention_when_missing():
    derived = compute_advantage(make_batch(), "rloo").batch["advantages"]
    given = compute_advantage(make_batch(response_mask=RESPONSE_MASK), "rloo").batch["advantages"]
    assert torch.equal(derived, given)
    assert torch.equal(compute_response_mask(make_batch()), RESPONSE_MASK)


@pytest.mark.parametrize(
    ("attention", "part"),
    [
        (torch.tensor([[1, 1, 1, 0, 1, 0]]), "response"),  # a hole inside the response
        (torch.tensor([[1, 0, 1, 1, 0, 0]]), "prompt"),  # prompt right-padded
    ],
)
def test_bad_padding_layout_is_a_clear_error(attention, part):
    with pytest.raises(ValueError, match=rf"row 0's {part} part is not"):
        response_mask_from_attention(attention, 3)


def test_missing_keys_name_the_estimator_and_the_key():
    with pytest.raises(KeyError, match=r"estimator 'gae' needs 'values'"):
        compute_advantage(make_batch(response_mask=RESPONSE_MASK), "gae")
    no_rewards = make_batch()
    del no_rewards.batch["token_level_rewards"]
    with pytest.raises(KeyError, match=r"estimator 'grpo'.*'token_level_rewards'"):
        compute_advantage(no_rewards, "grpo")
    no_uid = make_batch()
    no_uid.non_tensor_batch.clear()
    with pytest.raises(KeyError, match=r"estimator 'grpo' needs 'uid'"):
        compute_advantage(no_uid, "grpo")


def test_gae_and_remax_read_their_extra_inputs():
    values = torch.zeros(3, 3)
    delta = compute_advantage(make_batch(values=values), "gae", gamma=1.0, lam=1.0)
    assert_close(delta.batch["returns"][0], torch.tensor([1.0, 1.0, 0.0]))
    remax = compute_advantage(make_batch(reward_baselines=torch.tensor([0.4, 0.0, 0.0])), "remax")
    assert_close(remax.batch["advantages"][0], torch.tensor([0.6, 0.6, 0.0]))


def test_keyword_and_config_parameters():
    batch = make_batch(response_mask=RESPONSE_MASK)
    from_kwarg = compute_advantage(batch, "grpo", norm_adv_by_std_in_grpo=False)
    from_config = compute_advantage(batch, "grpo", config={"norm_adv_by_std_in_grpo": False})
    assert torch.equal(from_kwarg.batch["advantages"], from_config.batch["advantages"])
    assert_close(from_kwarg.batch["advantages"][:, 0], torch.tensor([0.5, -0.5, 0.5]))
    with pytest.raises(ValueError, match="gamma is given twice"):
        compute_advantage(batch, "reinforce_plus_plus", gamma=0.9, config={"gamma": 0.99})
    with pytest.raises(NotImplementedError, match="use_pf_ppo"):
        compute_advantage(make_batch(values=torch.zeros(3, 3)), "gae", config={"use_pf_ppo": True})


def test_inplace_variant_matches_verl_behaviour():
    batch = make_batch()
    result = compute_advantage_inplace(batch, "grpo", 1.0, 1.0, 1, True, None)
    assert result is batch
    assert {"advantages", "returns", "response_mask"} <= set(batch.batch.keys())
    expected = compute_advantage(make_batch(), "grpo").batch["advantages"]
    assert torch.equal(batch.batch["advantages"], expected)


def test_verl_style_custom_estimator_gets_verl_keywords():
    seen = {}

    @register_adv_est("test_constant_advantage")
    def constant(token_level_rewards, response_mask, index=None, config=None, **kwargs):
        seen.update(kwargs, index=index, config=config)
        advantages = torch.ones_like(token_level_rewards) * response_mask
        return advantages, advantages

    try:
        delta = compute_advantage(
            make_batch(response_mask=RESPONSE_MASK), "test_constant_advantage", config={"x": 1}
        )
    finally:
        ADV_ESTIMATORS.remove("test_constant_advantage")
    assert torch.equal(delta.batch["advantages"], RESPONSE_MASK.float())
    assert list(seen["index"]) == ["p0", "p0", "p1"] and seen["config"] == {"x": 1}
