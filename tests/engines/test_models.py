"""Loading role models by path: dtype, gradient checkpointing, the critic head, clear errors."""

from __future__ import annotations

import pytest
import torch

from stages.engines.logprob import response_logprobs
from stages.engines.models import load_causal_lm, load_value_model


def test_gradient_checkpointing_gives_the_same_gradients(tiny_model_dir, make_rollout_batch):
    t = make_rollout_batch([2, 3], [3, 2], P=3, R=3).batch
    grads = []
    for checkpointing in (False, True):
        model = load_causal_lm(tiny_model_dir, gradient_checkpointing=checkpointing).train()
        logprobs, _ = response_logprobs(
            model, t["input_ids"], t["attention_mask"], t["position_ids"], 3
        )
        (logprobs * t["response_mask"]).sum().backward()
        grads.append([p.grad.clone() for p in model.parameters()])
    for plain, checkpointed in zip(*grads):
        torch.testing.assert_close(checkpointed, plain, atol=1e-6, rtol=1e-5)


def test_dtype_is_applied(tiny_model_dir):
    assert next(load_causal_lm(tiny_model_dir, dtype="bf16").parameters()).dtype == torch.bfloat16
    with pytest.raises(ValueError, match="unknown model dtype 'half8'"):
        load_causal_lm(tiny_model_dir, dtype="half8")


def test_critic_from_the_actor_directory_has_a_scalar_head(tiny_model_dir):
    critic = load_value_model(tiny_model_dir)
    assert critic.config.num_labels == 1
    out = critic(input_ids=torch.tensor([[3, 4, 5]])).logits
    assert out.shape == (1, 3, 1)


def test_missing_model_directory_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"no config\.json.*make-tiny-model"):
        load_causal_lm(tmp_path / "nowhere")
