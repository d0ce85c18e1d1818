"""The critic worker built from a run config, and the workers' checkpoint round trip."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from stages.config import load_config
from stages.data.tiny_model import make_tiny_model
from stages.engines.roles import ActorWorker, CriticWorker

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def ppo_config(tmp_path_factory):
    model_dir = make_tiny_model(tmp_path_factory.mktemp("model"))
    return load_config(
        REPO / "configs" / "demo-cpu.yaml",
        [
            f"actor_rollout_ref.model.path={model_dir}",
            "algorithm.adv_estimator=gae",
            "data.train_batch_size=2",
            "actor_rollout_ref.rollout.n=2",
            "actor_rollout_ref.actor.ppo_mini_batch_size=1",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
            "critic.optim.lr=1e-3",
        ],
    )


def test_critic_values_update_and_checkpoint(ppo_config, make_rollout_batch, tmp_path):
    torch.manual_seed(0)
    batch = make_rollout_batch([3, 2, 4, 1], [2, 3, 1, 0], P=4, R=3)
    critic = CriticWorker(ppo_config, total_training_steps=2)
    values = critic.compute_values(batch).batch["values"]
    assert values.shape == (4, 3) and torch.isfinite(values).all()
    assert ppo_config.derived.critic_mini_batch_size_per_rank == 2
    critic.save_checkpoint(str(tmp_path / "critic"), {"global_step": 0})
    out = critic.update_critic(batch)  # the fixture's values / returns: a loss to follow
    metrics = out.meta_info["metrics"]
    assert len(metrics["critic/vf_loss"].values) == 2  # 4 rows / 2 per mini-batch
    after = critic.compute_values(batch).batch["values"]
    assert not torch.equal(after, values), "the update changed no value"
    assert critic.load_checkpoint(str(tmp_path / "critic")) == {"global_step": 0}
    torch.testing.assert_close(critic.compute_values(batch).batch["values"], values)


def test_actor_checkpoint_round_trip(ppo_config, tmp_path):
    actor = ActorWorker(ppo_config, total_training_steps=2)
    before = {n: p.detach().clone() for n, p in actor.lm.named_parameters()}
    actor.save_checkpoint(str(tmp_path / "actor"), {"global_step": 3})
    with torch.no_grad():
        for param in actor.lm.parameters():
            param.add_(1.0)
    assert actor.load_checkpoint(str(tmp_path / "actor")) == {"global_step": 3}
    for name, param in actor.lm.named_parameters():
        assert torch.equal(param, before[name]), name
