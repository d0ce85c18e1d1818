"""KL controllers and the KL-in-reward penalty."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict
from torch.testing import assert_close

from dataproto.protocol import DataProto
from stages.algos.kl_control import (
    AdaptiveKLController,
    FixedKLController,
    apply_kl_penalty,
    get_kl_controller,
    kl_in_reward,
    kl_penalized_rewards,
)


@pytest.mark.parametrize(
    ("kl", "expected"), [(0.2, 0.102), (0.04, 0.098), (0.05, 0.1), (10.0, 0.102)]
)
def test_adaptive_controller_worked_examples(kl, expected):
    ctrl = AdaptiveKLController(init_kl_coef=0.1, target_kl=0.05, horizon=1000)
    ctrl.update(current_kl=kl, n_steps=100)
    assert ctrl.value == pytest.approx(expected)


def test_fixed_controller_never_moves():
    ctrl = FixedKLController(kl_coef=0.001)
    ctrl.update(current_kl=5.0, n_steps=1000)
    assert ctrl.value == 0.001


def test_get_kl_controller_from_mapping_object_and_defaults():
    class KLCtrl:
        type, kl_coef, horizon, target_kl = "adaptive", 0.2, 500, 0.3

    adaptive = get_kl_controller(KLCtrl())
    assert isinstance(adaptive, AdaptiveKLController) and (
        adaptive.value,
        adaptive.horizon,
        adaptive.target,
    ) == (0.2, 500, 0.3)
    default = get_kl_controller({})
    assert isinstance(default, FixedKLController) and default.value == 0.001
    with pytest.raises(ValueError, match="horizon > 0"):
        get_kl_controller({"type": "adaptive", "horizon": 0})
    with pytest.raises(
        KeyError, match=r"unknown KL controller type 'pid'; known: \['adaptive', 'fixed'\]"
    ):
        get_kl_controller({"type": "pid"})


def _batch() -> DataProto:
    tensors = {
        "token_level_scores": torch.tensor([[0.0, 0.0, 1.0], [0.0, 2.0, 0.0]]),
        "old_log_probs": torch.tensor([[-1.0, -1.0, -1.0], [-1.0, -2.0, -9.0]]),
        "ref_log_prob": torch.tensor([[-1.5, -1.0, -0.5], [-1.0, -1.0, 0.0]]),
        "response_mask": torch.tensor([[1, 1, 1], [1, 1, 0]]),
    }
    return DataProto(batch=TensorDict(tensors, batch_size=[2]), non_tensor_batch={}, meta_info={})


def test_penalty_uses_beta_before_update_and_row_mean_kl():
    """kld (k1 = old − ref, masked): row 0 [0.5, 0, −0.5] → mean 0; row 1 [0, −1, ·] → mean −0.5."""
    batch = _batch()
    ctrl = AdaptiveKLController(init_kl_coef=0.1, target_kl=0.05, horizon=1000)
    delta, metrics = kl_in_reward(batch, ctrl, kl_penalty="kl")
    assert_close(
        delta.batch["token_level_rewards"], torch.tensor([[-0.05, 0.0, 1.05], [0.0, 2.1, 0.0]])
    )
    assert metrics == {
        "actor/reward_kl_penalty": pytest.approx(-0.25),
        "actor/reward_kl_penalty_coeff": 0.1,
    }
    assert ctrl.value == pytest.approx(0.1 * (1 - 0.2 * 2 / 1000))  # n_steps = batch size 2
    assert "token_level_rewards" not in batch.batch


def test_masked_tokens_never_leak_into_the_penalty():
    batch = _batch()
    batch.batch["old_log_probs"][1, 2] = 1e6  # under mask 0
    rewards, kl = kl_penalized_rewards(
        *(
            batch.batch[k]
            for k in ("token_level_scores", "old_log_probs", "ref_log_prob", "response_mask")
        ),
        beta=0.1,
    )
    assert rewards[1, 2] == 0.0 and kl.item() == pytest.approx(-0.25)


def test_apply_kl_penalty_is_verls_in_place_form():
    batch = _batch()
    same, metrics = apply_kl_penalty(batch, FixedKLController(0.1), kl_penalty="low_var_kl")
    assert same is batch and "token_level_rewards" in batch.batch
    assert isinstance(metrics["actor/reward_kl_penalty"], float)


def test_missing_inputs_are_named():
    batch = _batch()
    del batch.batch["ref_log_prob"]
    with pytest.raises(KeyError, match=r"\['ref_log_prob'\]"):
        kl_in_reward(batch, FixedKLController(0.1))
