"""DAPO's overlong reward shaping: verl's formula with worked numbers, and in the reward stage."""

from __future__ import annotations

import pytest
import torch

from dataproto import keys as K
from stages.config import load_config
from stages.reward.overlong import OverlongBuffer, overlong_penalty, shape_overlong
from stages.reward.settings import CONFIG_KEYS, RewardSettings, settings_from_config
from stages.reward.stage import LOOP_ENGINE, SEQ_SCORES, compute_reward


def test_verls_worked_example():
    # max_resp_len 20480, buffer 4096, factor 1.0: expected = 16384
    lengths = torch.tensor([0, 16000, 16384, 18432, 20480])
    penalty = overlong_penalty(lengths, 20480, 4096, 1.0)
    assert penalty.tolist() == [0.0, 0.0, 0.0, -0.5, -1.0]


def test_the_factor_scales_and_the_penalty_is_linear_in_the_buffer():
    # max 16, buffer 4, factor 0.5: L = 13 → −(13 − 12)/4 · 0.5 = −0.125; 15 → −0.375
    penalty = overlong_penalty(torch.tensor([12, 13, 15, 16]), 16, 4, 0.5)
    assert penalty.tolist() == [0.0, -0.125, -0.375, -0.5]


def test_shape_adds_the_penalty_and_logs_verls_extras():
    buffer = OverlongBuffer(True, 4, 1.0, True, 8)
    shaped, extras = shape_overlong(torch.tensor([1.0, 0.0, 2.0]), torch.tensor([3, 6, 8]), buffer)
    assert shaped.tolist() == [1.0, -0.5, 1.0]
    assert extras["overlong_reward"].tolist() == [0.0, -0.5, -1.0]
    assert extras["overlong"].tolist() == [False, True, True]
    _, quiet = shape_overlong(
        torch.zeros(3), torch.tensor([3, 6, 8]), OverlongBuffer(True, 4, 1.0, False, 8)
    )
    assert quiet == {}


def test_a_buffer_outside_the_response_budget_is_refused():
    with pytest.raises(ValueError, match=r"overlong_buffer.len must be in \(0, max_resp_len = 8\]"):
        OverlongBuffer(True, 9, 1.0, False, 8)


def test_the_reward_stage_adds_the_penalty_at_the_last_token(script_loop, batch_factory):
    # responses (+ EOS) of 3, 6 and 8 valid tokens in a width of 8; max_resp_len 8, buffer 4
    batch = batch_factory(["0.5", "dict:2", "1234567"], eos=True)
    lengths = batch.batch["attention_mask"][:, -8:].sum(-1).tolist()
    assert lengths == [4, 7, 8]
    settings = RewardSettings(
        num_workers=2, timeout_s=0.5, overlong=OverlongBuffer(True, 4, 1.0, True, 8)
    )
    delta, _ = compute_reward(batch, settings, {LOOP_ENGINE: script_loop})
    # penalties: L = 4 → 0, 7 → −0.75, 8 → −1; the third response scores 1234567 (a float string)
    assert delta.batch[SEQ_SCORES].tolist() == pytest.approx([0.5, 1.25, 1234566.0])
    assert delta.batch[K.RM_SCORES][1, 6] == pytest.approx(1.25)  # at the last valid token
    assert delta.non_tensor_batch["overlong"].tolist() == [False, True, True]
    assert "overlong_reward" in delta.meta_info[K.REWARD_EXTRA_KEYS]


def test_the_rollouts_own_scores_with_the_penalty_are_refused(batch_factory):
    batch = batch_factory(["1", "2"])
    batch.batch[K.RM_SCORES] = torch.ones(2, 8)
    settings = RewardSettings(overlong=OverlongBuffer(True, 4, 1.0, False, 8))
    with pytest.raises(ValueError, match="with the rollout's own scoring is not implemented"):
        compute_reward(batch, settings, engines={})


def test_settings_apply_the_buffer_only_with_the_dapo_manager():
    on = ["reward.overlong_buffer.enable=true", "reward.overlong_buffer.len=4"]
    dapo = load_config("demo-cpu", [*on, "reward.reward_manager.name=dapo"])
    assert settings_from_config(dapo).overlong == OverlongBuffer(True, 4, 1.0, False, 16)
    assert settings_from_config(load_config("demo-cpu")).overlong is None
    assert {
        f"reward.overlong_buffer.{k}" for k in ("enable", "len", "penalty_factor", "log")
    } <= set(CONFIG_KEYS)  # a changed setting misses the reward stage's cache
