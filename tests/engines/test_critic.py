"""Critic worker on a DeepSpeed engine: values equal a direct token-classification forward sliced at
[-R-1:-1]; the value update is invariant to the micro-batch split (global denominators, ZeRO 0–3)
and lowers the value loss; a batch without returns/values is rejected by name."""

from __future__ import annotations

import deepspeed
import pytest
import torch

from stages.engines.actor import PPOUpdateSettings
from stages.engines.batching import MicroBatching
from stages.engines.critic import ValueModel, compute_values, update_critic
from stages.engines.deepspeed_setup import EngineSettings, initialize_engine
from stages.engines.models import load_value_model

LOSS_CONFIG = {"cliprange_value": 0.5, "loss_agg_mode": "token-mean"}


def load_critic(model_dir) -> ValueModel:
    torch.manual_seed(0)  # the value head is freshly initialised from the causal-LM directory
    return ValueModel(load_value_model(model_dir))


def direct_values(backbone, batch):
    t = batch.batch
    R = t["responses"].shape[1]
    backbone.eval()  # the head's dropout off: the plain HF forward
    logits = backbone(
        input_ids=t["input_ids"],
        attention_mask=t["attention_mask"],
        position_ids=t["position_ids"],
    ).logits  # (B, T, 1)
    return logits[:, -R - 1 : -1, 0].float()


@pytest.mark.parametrize(
    "micro",
    [
        MicroBatching(),
        MicroBatching(micro_batch_size=2),
        MicroBatching(use_dynamic_bsz=True, max_token_len=12),
    ],
    ids=["whole", "fixed-2", "token-budget"],
)
def test_compute_values_matches_direct_forward(tiny_model_dir, micro, make_rollout_batch):
    model = load_critic(tiny_model_dir)
    batch = make_rollout_batch([3, 5, 1, 4, 2], [4, 2, 0, 3, 4], P=5, R=4)
    delta = compute_values(model, batch, micro)
    with torch.no_grad():
        expected = direct_values(model.backbone, batch)
    assert delta.batch["values"].dtype == torch.float32
    real = batch.batch["response_mask"].bool()  # each micro-batch runs at its rows' width
    torch.testing.assert_close(delta.batch["values"][real], expected[real], atol=1e-5, rtol=1e-5)


def test_compute_values_through_a_zero3_engine(tiny_model_dir, make_rollout_batch):
    batch = make_rollout_batch([3, 5, 1, 4], [4, 2, 1, 3], P=5, R=4)
    reference = load_critic(tiny_model_dir)
    with torch.no_grad():
        expected = direct_values(reference.backbone, batch)
    engine = initialize_engine(load_critic(tiny_model_dir), EngineSettings(zero_stage=3))
    delta = compute_values(engine, batch, MicroBatching(micro_batch_size=3))
    real = batch.batch["response_mask"].bool()  # each micro-batch runs at its rows' width
    torch.testing.assert_close(delta.batch["values"][real], expected[real], atol=1e-5, rtol=1e-5)


def updated_critic(model_dir, zero_stage, micro, batch, epochs=1, lr=1e-2):
    # A large Adam eps, as in test_actor: pure-rounding-noise gradients must not be blown up to ±lr.
    engine = initialize_engine(
        load_critic(model_dir),
        EngineSettings(zero_stage=zero_stage, lr=lr, eps=1e-3, clip_grad=1.0),
    )
    settings = PPOUpdateSettings(mini_batch_size=4, epochs=epochs, micro=micro)
    metrics = update_critic(engine, batch, settings, LOSS_CONFIG)
    params = dict(engine.module.named_parameters())
    with deepspeed.zero.GatheredParameters(list(params.values())):  # full tensors under ZeRO-3
        weights = {n: p.detach().clone() for n, p in params.items()}
    assert all(w.numel() > 0 for w in weights.values())
    return weights, metrics


@pytest.mark.parametrize("zero_stage", [0, 1, 2, 3])
def test_update_is_invariant_to_micro_batch_split(tiny_model_dir, zero_stage, make_rollout_batch):
    batch = make_rollout_batch([3, 5, 1, 4, 2, 5, 5, 1], [4, 2, 1, 3, 4, 0, 1, 4], P=5, R=4, seed=1)
    initial = {n: p.detach().clone() for n, p in load_critic(tiny_model_dir).named_parameters()}
    whole, whole_metrics = updated_critic(tiny_model_dir, zero_stage, MicroBatching(), batch)
    split, split_metrics = updated_critic(
        tiny_model_dir, zero_stage, MicroBatching(micro_batch_size=1), batch
    )
    for name in whole:
        torch.testing.assert_close(split[name], whole[name], atol=2e-6, rtol=1e-5, msg=name)
    head = "backbone.score.weight"
    assert not torch.equal(whole[head], initial[head])  # the update did move the head
    # vf_loss sums global-denominator partials: split-invariant (vpred_mean, a mean of
    # micro-batch means as in verl, is not)
    assert whole_metrics["critic/vf_loss"].aggregate() == pytest.approx(
        split_metrics["critic/vf_loss"].aggregate(), abs=1e-5
    )
    assert len(whole_metrics["critic/grad_norm"].values) == 2  # one optimizer step per mini-batch
    assert whole_metrics["critic/lr"].aggregate() == pytest.approx(1e-2)


def test_vf_loss_metric_is_the_mini_batch_loss(tiny_model_dir, make_rollout_batch):
    """The summed micro-batch partials equal ½·token-mean of the squared error at the start
    (no clipping: v_old = the critic's own values, so v_pred = v_old lies inside the clip range)."""
    batch = make_rollout_batch([3, 5, 1, 4], [4, 2, 3, 3], P=5, R=4, seed=3)
    model = load_critic(tiny_model_dir)
    values = compute_values(model, batch, MicroBatching()).batch["values"]
    batch.batch["values"] = values
    t = batch.batch
    mask = t["response_mask"].float()
    expected = 0.5 * (((values - t["returns"]) ** 2) * mask).sum() / mask.sum()
    _, metrics = updated_critic(tiny_model_dir, 0, MicroBatching(micro_batch_size=1), batch)
    assert metrics["critic/vf_loss"].values[0] == pytest.approx(float(expected), rel=1e-5)
    assert metrics["critic/vf_clipfrac"].values[0] == 0.0


def test_critic_updates_lower_the_value_loss(tiny_model_dir, make_rollout_batch):
    batch = make_rollout_batch([3, 5, 1, 4], [4, 2, 3, 3], P=5, R=4, seed=2)
    model = load_critic(tiny_model_dir)
    batch.batch["values"] = compute_values(model, batch, MicroBatching()).batch["values"]
    _, metrics = updated_critic(tiny_model_dir, 0, MicroBatching(), batch, epochs=6, lr=3e-3)
    losses = metrics["critic/vf_loss"].values
    assert losses[-1] < 0.8 * losses[0], losses


@pytest.mark.parametrize("missing", ["returns", "values", "response_mask"])
def test_update_rejects_a_batch_without_its_inputs(tiny_model_dir, make_rollout_batch, missing):
    batch = make_rollout_batch([3, 5, 1, 4], [4, 2, 3, 3], P=5, R=4)
    del batch.batch[missing]
    settings = PPOUpdateSettings(mini_batch_size=4)
    with pytest.raises(KeyError, match=f"update_critic needs the batch key '{missing}'"):
        update_critic(object(), batch, settings, LOSS_CONFIG)


def test_compute_values_rejects_a_batch_without_responses(tiny_model_dir, make_rollout_batch):
    batch = make_rollout_batch([3, 5], [4, 2], P=5, R=4)
    del batch.batch["responses"]
    with pytest.raises(KeyError, match="compute_values needs the batch key 'responses'"):
        compute_values(load_critic(tiny_model_dir), batch, MicroBatching())


def test_value_model_needs_a_single_label(tiny_model_dir):
    from transformers import AutoModelForTokenClassification

    backbone = AutoModelForTokenClassification.from_pretrained(tiny_model_dir, num_labels=3)
    with pytest.raises(ValueError, match="num_labels=3"):
        ValueModel(backbone)
