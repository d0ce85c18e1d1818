"""Actor worker on a DeepSpeed engine: log-probs equal a direct forward; the PPO update is
invariant to the micro-batch split (global denominators) and lowers the policy loss."""

from __future__ import annotations

import deepspeed
import pytest
import torch

from stages.engines.actor import PPOUpdateSettings, compute_log_prob, update_actor
from stages.engines.batching import MicroBatching
from stages.engines.deepspeed_setup import EngineSettings, initialize_engine
from stages.engines.logprob import ResponseLogProbModel
from stages.engines.models import load_causal_lm

LOSS_CONFIG = {"clip_ratio": 0.2, "loss_agg_mode": "token-mean", "entropy_coeff": 0.0}


def direct_logprobs(model, batch, temperature):
    t = batch.batch
    R = t["responses"].shape[1]
    logits = (
        model(
            input_ids=t["input_ids"],
            attention_mask=t["attention_mask"],
            position_ids=t["position_ids"],
        ).logits[:, -R - 1 : -1]
        / temperature
    )
    return (
        torch.log_softmax(logits.float(), -1).gather(-1, t["responses"].unsqueeze(-1)).squeeze(-1)
    )


@pytest.mark.parametrize(
    "micro",
    [
        MicroBatching(),
        MicroBatching(micro_batch_size=2),
        MicroBatching(use_dynamic_bsz=True, max_token_len=12),
    ],
    ids=["whole", "fixed-2", "token-budget"],
)
def test_compute_log_prob_matches_direct_forward(tiny_model_dir, micro, make_rollout_batch):
    model = load_causal_lm(tiny_model_dir).eval()
    batch = make_rollout_batch([3, 5, 1, 4, 2], [4, 2, 0, 3, 4], P=5, R=4)
    batch.meta_info["temperature"] = 0.8
    delta, metrics = compute_log_prob(
        ResponseLogProbModel(model), batch, micro, calculate_entropy=True
    )
    with torch.no_grad():
        expected = direct_logprobs(model, batch, 0.8)
    real = batch.batch["response_mask"].bool()  # each micro-batch runs at its rows' width
    torch.testing.assert_close(
        delta.batch["old_log_probs"][real], expected[real], atol=1e-5, rtol=1e-5
    )
    assert delta.batch["entropys"].shape == expected.shape
    assert metrics["actor/entropy"] > 0


def updated_weights(model_dir, zero_stage, micro, batch, epochs=1):
    torch.manual_seed(0)
    # A large Adam eps: some gradients (e.g. the key bias, which softmax ignores) are pure rounding
    # noise that Adam would otherwise blow up to ±lr whatever the split.
    engine = initialize_engine(
        ResponseLogProbModel(load_causal_lm(model_dir)),
        EngineSettings(zero_stage=zero_stage, lr=1e-2, eps=1e-3, clip_grad=1.0),
    )
    settings = PPOUpdateSettings(mini_batch_size=4, epochs=epochs, micro=micro)
    metrics = update_actor(engine, batch, settings, LOSS_CONFIG)
    params = dict(engine.module.named_parameters())
    with deepspeed.zero.GatheredParameters(list(params.values())):  # full tensors under ZeRO-3
        weights = {n: p.detach().clone() for n, p in params.items()}
    assert all(w.numel() > 0 for w in weights.values())
    return weights, metrics


@pytest.mark.parametrize("micro_rows", [1, 3])  # 3: rows grouped by length, not in order
@pytest.mark.parametrize("zero_stage", [0, 1, 2, 3])
def test_update_is_invariant_to_micro_batch_split(
    tiny_model_dir, zero_stage, micro_rows, make_rollout_batch
):
    batch = make_rollout_batch([3, 5, 1, 4, 2, 5, 5, 1], [4, 2, 1, 3, 4, 0, 1, 4], P=5, R=4, seed=1)
    whole, whole_metrics = updated_weights(tiny_model_dir, zero_stage, MicroBatching(), batch)
    split, split_metrics = updated_weights(
        tiny_model_dir, zero_stage, MicroBatching(micro_batch_size=micro_rows), batch
    )
    for name in whole:
        torch.testing.assert_close(split[name], whole[name], atol=2e-6, rtol=1e-5, msg=name)
    assert whole_metrics["actor/pg_loss"].aggregate() == pytest.approx(
        split_metrics["actor/pg_loss"].aggregate(), abs=1e-5
    )
    assert len(whole_metrics["actor/grad_norm"].values) == 2  # one optimizer step per mini-batch


def test_ppo_update_lowers_the_policy_loss(tiny_model_dir, make_rollout_batch):
    batch = make_rollout_batch([3, 5, 1, 4], [4, 2, 3, 3], P=5, R=4, seed=2)
    model = load_causal_lm(tiny_model_dir).eval()
    delta, _ = compute_log_prob(ResponseLogProbModel(model), batch, MicroBatching())
    batch.batch["old_log_probs"] = delta.batch["old_log_probs"]  # on-policy start: ratio 1
    _, metrics = updated_weights(tiny_model_dir, 0, MicroBatching(), batch, epochs=4)
    losses = metrics["actor/pg_loss"].values
    assert losses[-1] < losses[0], losses
