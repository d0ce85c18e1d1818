"""``enable_gradient_checkpointing`` (verl's key) turns activation checkpointing on for the actor's
and the critic's models (the critic's null = the actor's): each decoder layer runs again in the
backward pass, and the critic's gradients equal those without it (fp32). The actor's gradients are
compared in tests/engines/test_models.py."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from stages.config import load_config
from stages.data.tiny_model import make_tiny_model
from stages.engines.critic import ValueModel
from stages.engines.models import load_value_model
from stages.engines.roles import ActorWorker, CriticWorker

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("model"))


def ppo_config(model_dir: Path, *overrides: str):
    return load_config(
        REPO / "configs" / "demo-cpu.yaml",
        [
            f"actor_rollout_ref.model.path={model_dir}",
            "algorithm.adv_estimator=gae",
            "data.train_batch_size=2",
            "actor_rollout_ref.actor.ppo_mini_batch_size=1",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
            *overrides,
        ],
    )


@pytest.mark.parametrize(
    ("overrides", "actor_on", "critic_on"),
    [
        (["actor_rollout_ref.model.enable_gradient_checkpointing=true"], True, True),
        (["actor_rollout_ref.model.enable_gradient_checkpointing=false"], False, False),
        (
            [
                "actor_rollout_ref.model.enable_gradient_checkpointing=true",
                "critic.model.enable_gradient_checkpointing=false",
            ],
            True,
            False,
        ),
    ],
    ids=["on", "off", "critic-off"],
)
def test_the_key_reaches_the_actor_and_the_critic(model_dir, overrides, actor_on, critic_on):
    config = ppo_config(model_dir, *overrides)
    actor = ActorWorker(config, total_training_steps=1)
    critic = CriticWorker(config, total_training_steps=1)
    assert actor.lm.is_gradient_checkpointing is actor_on
    assert critic.engine.module.hf_model.is_gradient_checkpointing is critic_on


def layer_calls(model: torch.nn.Module) -> list[int]:
    """Counts the forward calls of the first decoder layer."""
    calls: list[int] = []
    model.base_model.layers[0].register_forward_pre_hook(lambda *_: calls.append(1))
    return calls


@pytest.mark.parametrize("layout", ["trimmed", "packed"])
def test_critic_gradients_with_checkpointing_equal_those_without(
    model_dir, make_rollout_batch, layout
):
    t = make_rollout_batch([2, 3, 1], [3, 2, 3], P=3, R=3).batch
    real = t["response_mask"].bool()
    results = []
    for checkpointing in (False, True):
        torch.manual_seed(0)  # the value head is freshly initialised
        backbone = load_value_model(model_dir, gradient_checkpointing=checkpointing)
        critic = ValueModel(backbone, layout).train()
        calls = layer_calls(backbone)
        values = critic(t["input_ids"], t["attention_mask"], t["position_ids"], 3)
        (values * real).square().sum().backward()
        assert len(calls) == (2 if checkpointing else 1)  # recomputed in the backward pass
        results.append((values, {n: p.grad for n, p in critic.named_parameters()}))
    (plain, plain_grads), (checkpointed, grads) = results
    torch.testing.assert_close(checkpointed, plain, atol=1e-6, rtol=1e-6)
    for name, grad in grads.items():
        torch.testing.assert_close(grad, plain_grads[name], atol=1e-6, rtol=1e-5, msg=name)
