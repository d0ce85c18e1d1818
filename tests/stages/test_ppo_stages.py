"""Each PPO stage function on a hand-built batch with fake engines (no model, no Prefect)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from tensordict import TensorDict

from dataproto import DataProto
from flows.dag import batch_keys, plan_step
from stages.advantage import advantage_fn
from stages.balance import balance_fn
from stages.old_log_prob import old_log_prob_fn
from stages.ppo import PPO_STAGES, make_step_input
from stages.ref_log_prob import ref_log_prob_fn
from stages.rollout import ROLLOUT_KEYS, rollout_fn
from stages.stage import StageContext, step_seed
from stages.update_actor import UPDATE_ACTOR_STAGE, update_actor_fn
from stages.update_critic import update_critic_fn
from stages.values import values_fn


def delta_of(**tensors) -> DataProto:
    rows = len(next(iter(tensors.values())))
    return DataProto(
        batch=TensorDict(tensors, batch_size=[rows]), non_tensor_batch={}, meta_info={}
    )


def prompt_batch(rows: int = 2, width: int = 3) -> DataProto:
    ids = torch.arange(rows * width).reshape(rows, width) + 10
    mask = torch.ones(rows, width, dtype=torch.long)
    mask[0, 0] = 0
    return DataProto(
        batch=TensorDict(
            {"input_ids": ids, "attention_mask": mask, "position_ids": mask.cumsum(-1) - 1},
            batch_size=[rows],
        ),
        non_tensor_batch={
            "data_source": np.array(["s"] * rows, dtype=object),
            "reward_model": np.array([{"ground_truth": "a"}] * rows, dtype=object),
            "uid": np.array(["dataset-uid"] * rows, dtype=object),
        },
        meta_info={},
    )


# --- the step input ---


def test_step_input_uid_per_prompt_interleaved_repeat_and_renamed_prompts():
    prompts = prompt_batch()
    step_input = make_step_input(prompts, 3, temperature=0.7, global_steps=5, kl_coef=0.01)
    assert len(step_input) == 6
    uids = list(step_input.non_tensor_batch["uid"])
    assert uids[:3] == [uids[0]] * 3 and uids[3:] == [uids[3]] * 3 and uids[0] != uids[3]
    assert "dataset-uid" not in uids  # verl: a fresh uuid4 per prompt
    assert sorted(step_input.batch.keys()) == [
        "prompt_attention_mask",
        "prompt_input_ids",
        "prompt_position_ids",
    ]
    expected = prompts.batch["input_ids"].repeat_interleave(3, dim=0)
    assert torch.equal(step_input.batch["prompt_input_ids"], expected)
    assert step_input.meta_info == {"temperature": 0.7, "global_steps": 5, "kl_coef": 0.01}
    assert "prompt_input_ids" not in prompts.batch  # the loader batch is not modified


# --- rollout ---


def test_rollout_passes_prompt_tensors_under_engine_names_and_keeps_declared_keys(
    fake_engine, make_config
):
    seeds = []

    def generate(batch, validate, seed):
        assert validate is False
        seeds.append(seed)
        rows, width = batch.batch["input_ids"].shape
        out = {key: torch.zeros(rows, width + 2, dtype=torch.long) for key in ROLLOUT_KEYS}
        out["extra_engine_key"] = torch.zeros(rows)
        return delta_of(**out)

    actor = fake_engine(generate_sequences=generate)
    step_input = make_step_input(prompt_batch(), 2, temperature=1.0, global_steps=1)
    ctx = StageContext(make_config(), {"actor": actor}, step=3)
    delta = rollout_fn(step_input, ctx)
    assert actor.calls == [("generate_sequences", ["attention_mask", "input_ids", "position_ids"])]
    assert sorted(delta.batch.keys()) == sorted(ROLLOUT_KEYS)
    assert seeds == [step_seed(ctx.config.trainer.seed, 3, "rollout")]  # seeded per step


def test_rollout_names_keys_the_engine_did_not_return(fake_engine, make_config):
    actor = fake_engine(
        generate_sequences=lambda batch, validate, seed: delta_of(prompts=torch.zeros(4, 2))
    )
    step_input = make_step_input(prompt_batch(), 2, temperature=1.0, global_steps=1)
    with pytest.raises(KeyError, match="responses"):
        rollout_fn(step_input, StageContext(make_config(), {"actor": actor}))


# --- balance ---


def test_balance_returns_a_permutation_and_seqlen_metrics(rollout_batch, make_config):
    ctx = StageContext(make_config())
    delta = balance_fn(rollout_batch, ctx)
    order = delta.batch["balance_order"]
    assert sorted(order.tolist()) == [0, 1, 2, 3]
    # dp 1: one partition; L = 3, 5, 2, 2 sorted by (workload, index) = rows 2, 3, 0, 1,
    # then evens (2, 0) followed by the reversed odds (1, 3)
    assert order.tolist() == [2, 0, 1, 3]
    assert ctx.metrics["global_seqlen/mean"] == 12.0
    assert ctx.metrics["global_seqlen/balanced_max"] == 12.0


# --- old_log_prob ---


def test_old_log_prob_bypass_copies_rollout_log_probs(rollout_batch, make_config):
    cfg = make_config("algorithm.rollout_correction.bypass_mode=true")
    delta = old_log_prob_fn(rollout_batch, StageContext(cfg, {}))
    assert torch.equal(delta.batch["old_log_probs"], rollout_batch.batch["rollout_log_probs"])
    assert list(delta.batch.keys()) == ["old_log_probs"]


#: the hf rollout's default is bypass (its log-probs are the actor's): these test the recompute
RECOMPUTE = "algorithm.rollout_correction.bypass_mode=false"


def test_old_log_prob_reports_entropy_over_the_batch_and_keeps_entropys(
    fake_engine, rollout_batch, make_config
):
    entropys = torch.tensor([[1.0, 2.0, 9.0], [1.0, 1.0, 1.0], [4.0, 9.0, 9.0], [9.0, 9.0, 9.0]])
    actor = fake_engine(
        compute_log_prob=lambda batch: delta_of(
            old_log_probs=torch.full((4, 3), -1.0), entropys=entropys
        )
    )
    ctx = StageContext(
        make_config("actor_rollout_ref.actor.loss_agg_mode=token-mean", RECOMPUTE), {"actor": actor}
    )
    delta = old_log_prob_fn(rollout_batch, ctx)
    assert sorted(delta.batch.keys()) == ["entropys", "old_log_probs"]
    assert torch.equal(delta.batch["entropys"], entropys)  # for the sample page
    # token-mean over the 6 response tokens: (1 + 2 + 1 + 1 + 1 + 4) / 6
    assert ctx.metrics["actor/entropy"] == pytest.approx(10 / 6)


def test_old_log_prob_seq_mean_token_mean_entropy(fake_engine, rollout_batch, make_config):
    entropys = torch.tensor([[1.0, 3.0, 9.0], [1.0, 1.0, 1.0], [4.0, 9.0, 9.0], [9.0, 9.0, 9.0]])
    actor = fake_engine(
        compute_log_prob=lambda batch: delta_of(old_log_probs=torch.zeros(4, 3), entropys=entropys)
    )
    cfg = make_config("actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-mean", RECOMPUTE)
    ctx = StageContext(cfg, {"actor": actor})
    old_log_prob_fn(rollout_batch, ctx)
    # rows with tokens: means 2, 1, 4 (the empty row contributes nothing) → 7 / 3
    assert ctx.metrics["actor/entropy"] == pytest.approx(7 / 3)


# --- ref, values, updates ---


def test_ref_and_values_take_the_engine_outputs(fake_engine, rollout_batch, make_config):
    ref = fake_engine(
        compute_ref_log_prob=lambda b: delta_of(ref_log_prob=torch.full((4, 3), -2.0))
    )
    critic = fake_engine(compute_values=lambda b: delta_of(values=torch.full((4, 3), 0.5)))
    ctx = StageContext(make_config(), {"ref": ref, "critic": critic})
    assert torch.equal(
        ref_log_prob_fn(rollout_batch, ctx).batch["ref_log_prob"], torch.full((4, 3), -2.0)
    )
    assert torch.equal(values_fn(rollout_batch, ctx).batch["values"], torch.full((4, 3), 0.5))


def test_missing_engine_is_named(rollout_batch, make_config):
    with pytest.raises(KeyError, match="'ref' engine"):
        ref_log_prob_fn(rollout_batch, StageContext(make_config(), {}))


def test_updates_return_empty_deltas_and_reduced_metrics(fake_engine, rollout_batch, make_config):
    from stages.metrics.metric import Metric

    def update(batch):
        out = DataProto(batch=None, non_tensor_batch={}, meta_info={})
        out.meta_info["metrics"] = {"actor/pg_loss": Metric("mean", [1.0, 3.0]), "actor/lr": 0.1}
        return out

    actor = fake_engine(update_actor=update)
    critic = fake_engine(update_critic=update)
    ctx = StageContext(make_config(), {"actor": actor, "critic": critic})
    delta = update_actor_fn(rollout_batch, ctx)
    assert delta.batch is None and not delta.non_tensor_batch
    assert ctx.metrics == {"actor/pg_loss": 2.0, "actor/lr": 0.1}
    assert (
        update_critic_fn(rollout_batch, StageContext(make_config(), {"critic": critic})).batch
        is None
    )


def test_update_actor_with_kl_loss_needs_ref_log_prob(fake_engine, rollout_batch, make_config):
    cfg = make_config("actor_rollout_ref.actor.use_kl_loss=true")
    with pytest.raises(KeyError, match="ref_log_prob"):
        update_actor_fn(rollout_batch, StageContext(cfg, {"actor": fake_engine()}))


def test_update_actor_waits_for_the_critic_warmup(make_config):
    cfg = make_config("trainer.critic_warmup=2")
    assert [UPDATE_ACTOR_STAGE.enabled(cfg, step) for step in (1, 2, 3)] == [False, False, True]


# --- advantage ---


def test_advantage_grpo_without_kl(rollout_batch, make_config):
    ctx = StageContext(make_config("algorithm.adv_estimator=grpo"))
    delta = advantage_fn(rollout_batch, ctx)
    scores = rollout_batch.batch["rm_scores"]
    assert torch.equal(delta.batch["token_level_scores"], scores)
    assert torch.equal(delta.batch["token_level_rewards"], scores)
    # group a: scores 1.0, 0.5 → ±0.7071 (std ddof 1); group b: 0.25, 0 → ±0.7071
    adv = delta.batch["advantages"]
    assert adv[0, 0].item() == pytest.approx(0.7071, abs=1e-4)
    assert adv[1, 0].item() == pytest.approx(-0.7071, abs=1e-4)
    assert adv[2, 0].item() == pytest.approx(0.7071, abs=1e-4)
    assert torch.all(adv[3] == 0)  # no response tokens
    assert ctx.metrics == {}


def test_advantage_kl_in_reward_uses_the_step_beta(rollout_batch, make_config):
    cfg = make_config("algorithm.adv_estimator=grpo", "algorithm.use_kl_in_reward=true")
    batch = rollout_batch | delta_of(
        old_log_probs=torch.zeros(4, 3), ref_log_prob=torch.full((4, 3), -0.5)
    )
    batch.meta_info["kl_coef"] = 0.1
    ctx = StageContext(cfg)
    delta = advantage_fn(batch, ctx)
    mask = rollout_batch.batch["response_mask"]
    expected = rollout_batch.batch["rm_scores"] - 0.1 * 0.5 * mask  # kl "k1": d = old − ref = 0.5
    torch.testing.assert_close(delta.batch["token_level_rewards"], expected)
    # per-row masked means 0.5, 0.5, 0.5 and 0 for the empty row → batch mean 0.375
    assert ctx.metrics["actor/reward_kl_penalty"] == pytest.approx(0.375)
    assert ctx.metrics["actor/reward_kl_penalty_coeff"] == 0.1


def test_advantage_kl_in_reward_without_beta_is_an_error(rollout_batch, make_config):
    cfg = make_config("algorithm.use_kl_in_reward=true")
    with pytest.raises(KeyError, match="kl_coef"):
        advantage_fn(rollout_batch, StageContext(cfg))


def test_advantage_gae_reads_values(rollout_batch, make_config):
    cfg = make_config("algorithm.adv_estimator=gae", "algorithm.gamma=1.0", "algorithm.lam=1.0")
    batch = rollout_batch | delta_of(values=torch.zeros(4, 3))
    delta = advantage_fn(batch, StageContext(cfg))
    # γ = λ = 1, V = 0: returns = reward-to-go (row 0: 1, 1, 0 → masked to the 2 tokens)
    torch.testing.assert_close(delta.batch["returns"][0, :2], torch.tensor([1.0, 1.0]))


# --- the plan ---


def step_keys():
    return batch_keys(make_step_input(prompt_batch(), 2, temperature=1.0, global_steps=1))


def test_grpo_plan_skips_reference_and_critic(make_config):
    plan = plan_step(PPO_STAGES, make_config(), step_keys(), step=1)
    assert plan.names == [
        "rollout",
        "balance",
        "reward",
        "old_log_prob",
        "advantage",
        "update_actor",
    ]
    assert set(plan.skipped) == {
        "baseline_rollout", "baseline_reward", "ref_log_prob", "values", "update_critic",
        "rollout_correction", "rollout_is", "rollout_rs",  # the hf rollout's bypass mode
    }  # fmt: skip


def test_ppo_plan_with_critic_and_kl(make_config):
    cfg = make_config(
        "algorithm.adv_estimator=gae",
        "algorithm.use_kl_in_reward=true",
        "actor_rollout_ref.actor.use_kl_loss=true",
        "trainer.balance_batch=false",
        "trainer.critic_warmup=1",
    )
    keys = step_keys()
    first = plan_step(PPO_STAGES, cfg, keys, step=1)
    assert first.names == [
        "rollout", "reward", "old_log_prob", "ref_log_prob", "values", "advantage", "update_critic"
    ]  # fmt: skip
    assert "update_actor" in plan_step(PPO_STAGES, cfg, keys, step=2).names
