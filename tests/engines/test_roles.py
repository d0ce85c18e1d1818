"""Role workers built from a run config: rollout → log-probs → update on the tiny model."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from dataproto import DataProto
from stages.config import load_config
from stages.data.tiny_model import make_tiny_model
from stages.engines.roles import ActorWorker, RefWorker

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def demo_config(tmp_path_factory, actor_config):
    return actor_config(make_tiny_model(tmp_path_factory.mktemp("model")))


def test_actor_rollout_logprobs_update_round(demo_config, encode_prompts):
    torch.manual_seed(0)
    actor = ActorWorker(demo_config, total_training_steps=3)
    gen = actor.generate_sequences(encode_prompts(actor.tokenizer, ["abc", "hello"], 4))
    assert gen.batch["responses"].shape == (8, 6)
    batch = DataProto(batch=gen.batch, non_tensor_batch={}, meta_info={"temperature": 1.0})
    delta = actor.compute_log_prob(batch)
    mask = gen.batch["response_mask"].bool()
    torch.testing.assert_close(
        delta.batch["old_log_probs"][mask],
        gen.batch["rollout_log_probs"][mask],
        atol=1e-4,
        rtol=1e-4,
    )
    before = {n: p.detach().clone() for n, p in actor.lm.named_parameters()}
    batch.batch["old_log_probs"] = delta.batch["old_log_probs"]
    batch.batch["advantages"] = torch.randn(8, 6) * gen.batch["response_mask"]
    out = actor.update_actor(batch)
    metrics = out.meta_info["metrics"]
    assert len(metrics["actor/pg_loss"].values) == 2  # 8 rows / mini-batch of 1 prompt × 4 samples
    assert torch.isfinite(torch.tensor(metrics["actor/pg_loss"].values)).all()
    changed = [n for n, p in actor.lm.named_parameters() if not torch.equal(p, before[n])]
    assert changed, "the update changed no weight"

    ref = RefWorker(demo_config)
    ref_lp = ref.compute_ref_log_prob(batch).batch["ref_log_prob"]
    torch.testing.assert_close(
        ref_lp[mask], gen.batch["rollout_log_probs"][mask], atol=1e-4, rtol=1e-4
    )


def test_zero3_weights_stream_one_gathered_parameter_at_a_time(demo_config):
    """The weight-sync stream of a ZeRO-3 actor: every parameter whole, and while the consumer
    holds one, no parameter of the module is gathered (the host never holds the whole model)."""
    import deepspeed
    from deepspeed.runtime.zero.partition_parameters import ZeroParamStatus

    config = load_config(
        REPO / "configs" / "demo-cpu.yaml",
        [
            f"actor_rollout_ref.model.path={demo_config.actor_rollout_ref.model.path}",
            "actor_rollout_ref.actor.zero_stage=3",
        ],
    )
    actor = ActorWorker(config, total_training_steps=1)
    streamed = {}
    for name, tensor in actor.named_weights():
        gathered = [
            n
            for n, p in actor.lm.named_parameters()
            if p.ds_status != ZeroParamStatus.NOT_AVAILABLE
        ]
        assert gathered == [], (name, gathered)
        streamed[name] = tensor
    params = dict(actor.lm.named_parameters())
    assert streamed.keys() == params.keys()
    with deepspeed.zero.GatheredParameters(list(params.values())):
        for name, param in params.items():
            assert torch.equal(streamed[name], param.detach()), name
