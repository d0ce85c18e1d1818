"""The shared PPO update loop (stages/engines/ppo_update.py): rows are taken as views where they
are consecutive and the critic's update is bit-identical to always gathering them; the actor and
the critic both step through this one loop, the only place that sets the accumulation boundary."""

from __future__ import annotations

import sys
from pathlib import Path

import deepspeed
import pytest
import torch
from tensordict import TensorDict

from stages.engines import ppo_update as loop
from stages.engines.actor import update_actor
from stages.engines.batching import MicroBatching
from stages.engines.critic import ValueModel, update_critic
from stages.engines.deepspeed_setup import EngineSettings, initialize_engine
from stages.engines.logprob import ResponseLogProbModel
from stages.engines.models import load_causal_lm, load_value_model
from stages.engines.ppo_update import PPOUpdateSettings, gather_rows, take_rows

CRITIC_LOSS = {"cliprange_value": 0.5, "loss_agg_mode": "token-mean"}
ACTOR_LOSS = {"clip_ratio": 0.2, "loss_agg_mode": "token-mean", "entropy_coeff": 0.0}
STAGES_DIR = Path(__file__).resolve().parents[2] / "stages"


def test_take_rows_views_consecutive_rows_and_gathers_the_rest():
    tensors = TensorDict({"x": torch.arange(12).reshape(6, 2)}, batch_size=[6])
    base = tensors["x"].untyped_storage().data_ptr()
    for idx in ([1, 2, 3], torch.tensor([1, 2, 3]), [4], torch.arange(6)):
        rows = take_rows(tensors, idx)
        assert rows["x"].untyped_storage().data_ptr() == base  # a view: no copy
        assert torch.equal(rows["x"], gather_rows(tensors, idx)["x"])
    for idx in ([3, 1], torch.tensor([0, 2, 3]), [2, 2], [3, 2, 1]):
        rows = take_rows(tensors, idx)
        assert rows["x"].untyped_storage().data_ptr() != base  # gathered, in the order asked
        assert rows["x"][:, 0].tolist() == [2 * i for i in torch.as_tensor(idx).tolist()]
    assert len(take_rows(tensors, [])) == 0


def critic_engine(model_dir):
    torch.manual_seed(0)  # the value head is freshly initialised from the causal-LM directory
    model = ValueModel(load_value_model(model_dir))
    return initialize_engine(model, EngineSettings(zero_stage=0, lr=1e-2, eps=1e-3, clip_grad=1.0))


def full_weights(engine) -> dict[str, torch.Tensor]:
    params = dict(engine.module.named_parameters())
    with deepspeed.zero.GatheredParameters(list(params.values())):
        return {n: p.detach().clone() for n, p in params.items()}


@pytest.mark.parametrize(
    "settings",
    [
        PPOUpdateSettings(mini_batch_size=4, micro=MicroBatching()),
        PPOUpdateSettings(mini_batch_size=4, epochs=2, micro=MicroBatching(micro_batch_size=1)),
        PPOUpdateSettings(mini_batch_size=4, micro=MicroBatching(micro_batch_size=3)),
        PPOUpdateSettings(mini_batch_size=4, shuffle=True, micro=MicroBatching(micro_batch_size=2)),
    ],
    ids=["whole", "rows-1-epochs-2", "rows-3-by-length", "shuffled"],
)
def test_critic_update_is_bit_identical_with_views_and_gathers(
    tiny_model_dir, make_rollout_batch, monkeypatch, settings
):
    batch = make_rollout_batch([3, 5, 1, 4, 2, 5, 5, 1], [4, 2, 1, 3, 4, 0, 1, 4], P=5, R=4, seed=1)
    views = []

    def spy(tensors, idx):  # the loop's rows, noting which came as views
        rows = take_rows(tensors, idx)
        storage = rows["input_ids"].untyped_storage().data_ptr()
        views.append(storage == tensors["input_ids"].untyped_storage().data_ptr())
        return rows

    monkeypatch.setattr(loop, "take_rows", spy)
    view_engine = critic_engine(tiny_model_dir)
    view_metrics = update_critic(view_engine, batch, settings, CRITIC_LOSS)
    monkeypatch.setattr(loop, "take_rows", gather_rows)
    gather_engine = critic_engine(tiny_model_dir)
    gather_metrics = update_critic(gather_engine, batch, settings, CRITIC_LOSS)

    if not settings.shuffle:
        assert any(views)  # the unshuffled mini-batches at least are views
    assert view_metrics.keys() == gather_metrics.keys()
    for name, metric in view_metrics.items():
        assert metric.values == gather_metrics[name].values, name  # bit for bit
    view_weights, gather_weights = full_weights(view_engine), full_weights(gather_engine)
    for name, weight in view_weights.items():
        assert torch.equal(weight, gather_weights[name]), name
    initial = full_weights(critic_engine(tiny_model_dir))
    assert not torch.equal(view_weights["backbone.score.weight"], initial["backbone.score.weight"])


class BoundarySpy:
    """A DeepSpeed engine that notes which module sets each gradient-accumulation boundary."""

    def __init__(self, engine) -> None:
        self._engine = engine
        self.calls: list[tuple[str, bool]] = []  # (caller module, is_boundary)

    def __getattr__(self, name):
        return getattr(self._engine, name)

    def __call__(self, *args, **kwargs):
        return self._engine(*args, **kwargs)

    def set_gradient_accumulation_boundary(self, is_boundary: bool) -> None:
        self.calls.append((sys._getframe(1).f_globals["__name__"], is_boundary))
        self._engine.set_gradient_accumulation_boundary(is_boundary)


def test_actor_and_critic_step_through_the_one_loop(tiny_model_dir, make_rollout_batch):
    batch = make_rollout_batch([3, 5, 1, 4, 2, 5, 5, 1], [4, 2, 1, 3, 4, 0, 1, 4], P=5, R=4, seed=1)
    settings = PPOUpdateSettings(mini_batch_size=4, micro=MicroBatching(micro_batch_size=2))
    torch.manual_seed(0)
    actor = BoundarySpy(
        initialize_engine(
            ResponseLogProbModel(load_causal_lm(tiny_model_dir)), EngineSettings(zero_stage=0)
        )
    )
    critic = BoundarySpy(critic_engine(tiny_model_dir))
    actor_metrics = update_actor(actor, batch, settings, ACTOR_LOSS)
    critic_metrics = update_critic(critic, batch, settings, CRITIC_LOSS)
    step = [False, True]  # 2 micro-batches of 2 rows per mini-batch of 4, the step after the last
    for spy in (actor, critic):
        assert spy.calls == [("stages.engines.ppo_update", last) for last in step + step]
    assert len(actor_metrics["actor/grad_norm"].values) == 2
    assert len(critic_metrics["critic/grad_norm"].values) == 2


def test_the_loop_is_the_only_code_that_sets_the_accumulation_boundary():
    callers = sorted(
        str(path.relative_to(STAGES_DIR.parent))
        for path in STAGES_DIR.rglob("*.py")
        if "set_gradient_accumulation_boundary(" in path.read_text(encoding="utf-8")
    )
    assert callers == ["stages/engines/ppo_update.py"]
