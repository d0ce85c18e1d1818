"""The rollout-correction stages (decoupled mode) and how the later stages and the actor use their
keys; bypass mode's settings handed to the actor. Hand-built batches, fake engines."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from tensordict import TensorDict

from dataproto import DataProto
from flows.dag import batch_keys, plan_step
from stages.advantage import advantage_fn
from stages.engines.actor import actor_micro_loss, update_actor
from stages.engines.ppo_update import PPOUpdateSettings
from stages.ppo import PPO_STAGES, make_step_input
from stages.rollout_correction import (
    ROLLOUT_CORRECTION_STAGE,
    ROLLOUT_IS_STAGE,
    ROLLOUT_RS_STAGE,
    actor_update_batch,
    bypass_correction,
    rollout_correction_fn,
    rollout_is_fn,
    rollout_rs_fn,
)
from stages.stage import StageContext
from stages.update_actor import update_actor_fn
from stages.update_critic import update_critic_fn

DECOUPLED = "algorithm.rollout_correction.bypass_mode=false"
BYPASS = "algorithm.rollout_correction.bypass_mode=true"

#: the worked example of tests/algos/test_rollout_correction.py as a stage batch: rows A, B
TRAIN = torch.tensor([[-0.9, -0.7, -1.6], [-0.3, -0.8, 0.0]])
ROLLOUT = torch.tensor([[-1.0, -0.5, -2.0], [-0.3, -2.0, 0.0]])
MASK = torch.tensor([[1, 1, 1], [1, 1, 0]])


def corr_batch() -> DataProto:
    return DataProto.from_dict(
        {"old_log_probs": TRAIN, "rollout_log_probs": ROLLOUT, "response_mask": MASK}
    )


def test_plan_runs_the_stages_after_old_log_prob_only_when_decoupled(make_config):
    prompts = DataProto(
        batch=TensorDict(
            {
                "input_ids": torch.ones(2, 3, dtype=torch.long),
                "attention_mask": torch.ones(2, 3, dtype=torch.long),
                "position_ids": torch.arange(3).repeat(2, 1),
            },
            batch_size=[2],
        ),
        non_tensor_batch={
            "data_source": np.array(["s", "s"], dtype=object),
            "reward_model": np.array([{"ground_truth": "a"}] * 2, dtype=object),
        },
        meta_info={},
    )
    keys = batch_keys(make_step_input(prompts, 2, temperature=1.0, global_steps=1))
    on = make_config(
        DECOUPLED,
        "algorithm.rollout_correction.rollout_is=token",
        "algorithm.rollout_correction.rollout_rs=token_k1",
        "algorithm.rollout_correction.rollout_rs_threshold=2.0",
    )
    names = plan_step(PPO_STAGES, on, keys, step=1).names
    start = names.index("old_log_prob")
    assert names[start : start + 4] == [
        "old_log_prob",
        "rollout_correction",
        "rollout_is",
        "rollout_rs",
    ]
    assert names.index("rollout_rs") < names.index("advantage")
    metrics_only = plan_step(PPO_STAGES, make_config(DECOUPLED), keys, step=1)
    assert "rollout_correction" in metrics_only.names
    assert metrics_only.skipped["rollout_is"] == "disabled: uses_rollout_is(config) is False"
    assert metrics_only.skipped["rollout_rs"] == "disabled: uses_rollout_rs(config) is False"
    bypass = plan_step(
        PPO_STAGES, make_config(BYPASS, "algorithm.rollout_correction.rollout_is=token"), keys, 1
    )
    assert {"rollout_correction", "rollout_is", "rollout_rs"} <= set(bypass.skipped)


def test_declarations():
    for stage in (ROLLOUT_CORRECTION_STAGE, ROLLOUT_IS_STAGE, ROLLOUT_RS_STAGE):
        assert [str(k) for k in stage.requires] == [
            "batch.old_log_probs",
            "batch.rollout_log_probs",
            "batch.response_mask",
        ]
        assert not stage.reads_weights and stage.fn.__module__ == "stages.rollout_correction"
    assert ROLLOUT_CORRECTION_STAGE.produces == ()
    assert [str(k) for k in ROLLOUT_IS_STAGE.produces] == ["batch.rollout_is_weights"]
    assert [str(k) for k in ROLLOUT_RS_STAGE.produces] == ["batch.rollout_rs_mask"]


def test_metrics_only_stage(make_config):
    ctx = StageContext(make_config(DECOUPLED))
    delta = rollout_correction_fn(corr_batch(), ctx)
    assert delta.batch is None
    assert ctx.metrics["rollout_corr/kl"] == pytest.approx(-0.3, abs=1e-4)
    assert ctx.metrics["rollout_corr/chi2_seq"] == pytest.approx(5.4226, abs=1e-4)
    assert not any("rollout_is" in n or "rollout_rs" in n for n in ctx.metrics)


def test_rollout_is_stage_weights(make_config):
    cfg = make_config(
        DECOUPLED,
        "algorithm.rollout_correction.rollout_is=sequence",
        "algorithm.rollout_correction.rollout_is_batch_normalize=true",
    )
    ctx = StageContext(cfg)
    delta = rollout_is_fn(corr_batch(), ctx)
    assert list(delta.batch.keys()) == ["rollout_is_weights"]
    expected = torch.tensor([[0.8059, 0.8059, 0.8059], [1.1941, 1.1941, 0.0]])
    torch.testing.assert_close(delta.batch["rollout_is_weights"], expected, atol=1e-4, rtol=0)
    assert ctx.metrics["rollout_corr/rollout_is_batch_norm_factor"] == pytest.approx(
        1.6749, abs=1e-4
    )


def test_rollout_rs_stage_mask(make_config):
    cfg = make_config(
        DECOUPLED,
        "algorithm.rollout_correction.rollout_rs=seq_sum_k1",
        "algorithm.rollout_correction.rollout_rs_threshold=0.5_2.0",
    )
    ctx = StageContext(cfg)
    delta = rollout_rs_fn(corr_batch(), ctx)
    assert delta.batch["rollout_rs_mask"].tolist() == [[1, 1, 1], [0, 0, 0]]
    assert ctx.metrics["rollout_corr/rollout_rs_masked_fraction"] == pytest.approx(0.4)


def test_advantage_uses_the_rejection_mask_and_rejected_scores_stay_in_the_group(
    rollout_batch, make_config
):
    """GRPO over group a (rows 0, 1: scores 1.0, 0.5): rejecting row 0 zeroes its advantages, but
    its score still sets the group mean and std (verl's order: RS before the advantages)."""
    rs_mask = rollout_batch.batch["response_mask"].clone()
    rs_mask[0] = 0
    with_rs = rollout_batch | DataProto.from_dict({"rollout_rs_mask": rs_mask})
    cfg = make_config("algorithm.adv_estimator=grpo")
    plain = advantage_fn(rollout_batch, StageContext(cfg)).batch["advantages"]
    rejected = advantage_fn(with_rs, StageContext(cfg)).batch["advantages"]
    assert torch.equal(rejected[0], torch.zeros(3))
    assert plain[0].abs().sum() > 0
    torch.testing.assert_close(rejected[1], plain[1])  # row 1's baseline still holds row 0


def test_update_actor_gets_the_rejection_mask_as_response_mask_and_the_weights(
    fake_engine, rollout_batch, make_config
):
    seen = {}

    def update(batch):
        seen["batch"] = batch
        return DataProto.from_dict({})

    rs_mask = torch.zeros_like(rollout_batch.batch["response_mask"])
    weights = torch.full((4, 3), 0.5)
    batch = rollout_batch | DataProto.from_dict(
        {
            "old_log_probs": torch.zeros(4, 3),
            "advantages": torch.ones(4, 3),
            "rollout_rs_mask": rs_mask,
            "rollout_is_weights": weights,
        }
    )
    ctx = StageContext(make_config(DECOUPLED), {"actor": fake_engine(update_actor=update)})
    update_actor_fn(batch, ctx)
    sent = seen["batch"]
    assert torch.equal(sent.batch["response_mask"], rs_mask)
    assert "rollout_rs_mask" not in sent.batch
    assert torch.equal(sent.batch["rollout_is_weights"], weights)
    assert "rollout_correction" not in sent.meta_info  # decoupled: nothing for the loss to compute
    assert torch.equal(batch.batch["response_mask"], rollout_batch.batch["response_mask"])


def test_update_critic_gets_the_rejection_mask(fake_engine, rollout_batch, make_config):
    seen = {}
    critic = fake_engine(
        update_critic=lambda b: seen.setdefault("b", b) and DataProto.from_dict({})
    )
    rs_mask = torch.zeros_like(rollout_batch.batch["response_mask"])
    batch = rollout_batch | DataProto.from_dict(
        {"values": torch.zeros(4, 3), "returns": torch.zeros(4, 3), "rollout_rs_mask": rs_mask}
    )
    update_critic_fn(batch, StageContext(make_config(), {"critic": critic}))
    assert torch.equal(seen["b"].batch["response_mask"], rs_mask)


def test_bypass_settings_reach_the_actor_only_when_they_change_the_loss(make_config):
    assert bypass_correction(make_config(BYPASS)) is None  # nothing to correct: the loss as before
    assert (
        bypass_correction(make_config(DECOUPLED, "algorithm.rollout_correction.rollout_is=token"))
        is None
    )
    cfg = make_config(
        BYPASS,
        "algorithm.rollout_correction.loss_type=reinforce",
        "algorithm.rollout_correction.rollout_is=token",
        "algorithm.rollout_correction.rollout_is_threshold=0.5_2.0",
    )
    settings = bypass_correction(cfg)
    assert settings["loss_type"] == "reinforce" and settings["rollout_is_threshold"] == (0.5, 2.0)
    out = actor_update_batch(corr_batch(), cfg)
    assert out.meta_info["rollout_correction"] == settings


class _FixedLogProbs(torch.nn.Module):
    """A stand-in actor engine: its forward returns fixed log-probs (and no entropy)."""

    def __init__(self, log_probs: torch.Tensor) -> None:
        super().__init__()
        self.offset = torch.nn.Parameter(torch.zeros(()))
        self.log_probs = log_probs

    def forward(
        self, input_ids, attention_mask, position_ids, width, temperature, calculate_entropy
    ):
        return self.log_probs[: input_ids.shape[0]] + self.offset, None


def test_actor_micro_loss_applies_the_batch_weights():
    """vanilla at ratio 1 with A = 1 | 2: −Σ A·w / 5 tokens, w the worked example's token weights."""
    weights = torch.tensor([[1.1052, 0.8187, 1.4918], [1.0, 2.0, 0.0]])
    micro = TensorDict(
        {
            "input_ids": torch.ones(2, 5, dtype=torch.long),
            "attention_mask": torch.ones(2, 5, dtype=torch.long),
            "position_ids": torch.arange(5).repeat(2, 1),
            "responses": torch.ones(2, 3, dtype=torch.long),
            "response_mask": MASK,
            "old_log_probs": TRAIN,
            "advantages": torch.tensor([[1.0, 1.0, 1.0], [2.0, 2.0, 2.0]]),
            "rollout_is_weights": weights,
        },
        batch_size=[2],
    )
    engine = _FixedLogProbs(TRAIN)
    loss, _ = actor_micro_loss(
        engine, micro, None, temperature=1.0, needs_entropy=False, loss_config={}
    )
    assert loss.item() == pytest.approx(
        -(1.1052 + 0.8187 + 1.4918 + 2 * 1.0 + 2 * 2.0) / 5, abs=1e-4
    )
    del micro["rollout_is_weights"]
    unweighted, _ = actor_micro_loss(
        engine, micro, None, temperature=1.0, needs_entropy=False, loss_config={}
    )
    assert unweighted.item() == pytest.approx(-7 / 5)


class _Engine(_FixedLogProbs):
    """Enough of a DeepSpeed engine for ppo_update: backward, step, lr."""

    def set_gradient_accumulation_boundary(self, flag):
        pass

    def backward(self, loss, scale_wrt_gas=False):
        loss.backward()

    def zero_optimization_stage(self):
        return 1

    def step(self):
        pass

    def get_global_grad_norm(self):
        return 0.0

    def get_lr(self):
        return [0.0]


def test_update_actor_runs_bypass_mode_loss_from_meta_info():
    batch = DataProto.from_dict(
        {
            "input_ids": torch.ones(2, 5, dtype=torch.long),
            "attention_mask": torch.ones(2, 5, dtype=torch.long),
            "position_ids": torch.arange(5).repeat(2, 1),
            "responses": torch.ones(2, 3, dtype=torch.long),
            "response_mask": MASK,
            "old_log_probs": ROLLOUT,  # bypass: the rollout's own log-probs
            "advantages": torch.ones(2, 3),
        },
        meta_info={
            "temperature": 1.0,
            "rollout_correction": {
                "rollout_rs": ["token_k1"],
                "rollout_rs_threshold": [[0.5, 2.0]],
                "loss_type": "ppo_clip",
            },
        },
    )
    metrics = update_actor(_Engine(TRAIN), batch, PPOUpdateSettings(mini_batch_size=2), {})
    assert metrics["rollout_corr/rollout_rs_masked_fraction"].aggregate() == pytest.approx(0.2)
    assert "rollout_corr/kl" in metrics
