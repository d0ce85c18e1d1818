"""The hf rollout replica (stages/engines/rollout_replica.py): HF generate in a process of its own
samples what the actor samples with the same weights and seed, holds the weights of its last
sync while the actor's change, and ends when the trainer's end of its pipe closes."""

from __future__ import annotations

import pytest
import torch

from dataproto import DataProto
from stages.data.tiny_model import make_tiny_model
from stages.engines.roles import ActorWorker
from stages.engines.rollout_replica import HFChild, ProcessReplica, build_replica, hf_replica


@pytest.fixture(scope="module")
def actor(tmp_path_factory, actor_config):
    model_dir = make_tiny_model(tmp_path_factory.mktemp("model"))
    config = actor_config(model_dir, "ppoflow.schedule=one_step_off")
    return ActorWorker(config, total_training_steps=3)


@pytest.fixture(scope="module")
def replica(actor):
    made = build_replica(actor.config, actor.tokenizer)
    yield made
    made.close()


@pytest.fixture
def prompts(actor, encode_prompts) -> DataProto:
    """2 prompts × 3 rows."""
    return encode_prompts(actor.tokenizer, ["abc", "hello"], 3)


def test_the_hf_backend_builds_a_process_replica(replica) -> None:
    assert isinstance(replica, ProcessReplica) and replica.child is HFChild
    assert replica.pid is not None


def test_it_samples_what_the_actor_samples_with_the_same_weights_and_seed(
    actor, replica, prompts
) -> None:
    replica.sync(actor.full_weights().items())
    batch = prompts
    got = replica.call("generate_sequences", batch, seed=11)
    want = actor.generate_sequences(batch, seed=11)
    for key in ("responses", "response_mask", "input_ids", "attention_mask", "position_ids"):
        assert torch.equal(got.batch[key], want.batch[key]), key
    torch.testing.assert_close(got.batch["rollout_log_probs"], want.batch["rollout_log_probs"])
    greedy = replica.call("generate_sequences", batch, validate=True)
    assert torch.equal(
        greedy.batch["responses"], actor.generate_sequences(batch, validate=True).batch["responses"]
    )


def test_it_keeps_the_weights_of_its_last_sync(actor, replica, prompts) -> None:
    replica.sync(actor.full_weights().items())
    batch = prompts
    before = replica.call("generate_sequences", batch, seed=3).batch["responses"]
    saved = {name: p.detach().clone() for name, p in actor.lm.named_parameters()}
    try:
        with torch.no_grad():
            for p in actor.lm.parameters():
                p.add_(torch.randn_like(p))
        assert torch.equal(
            replica.call("generate_sequences", batch, seed=3).batch["responses"], before
        )
        replica.sync(actor.full_weights().items())
        after = replica.call("generate_sequences", batch, seed=3).batch["responses"]
        assert torch.equal(after, actor.generate_sequences(batch, seed=3).batch["responses"])
    finally:
        with torch.no_grad():
            for name, p in actor.lm.named_parameters():
                p.copy_(saved[name])


def test_it_refuses_what_is_not_a_rollout(replica, prompts) -> None:
    with pytest.raises(ValueError, match="'compute_log_prob' runs on the actor"):
        replica.call("compute_log_prob", prompts)


def test_before_its_first_sync_it_refuses_and_it_ends_with_the_trainers_pipe(
    actor, prompts
) -> None:
    replica = hf_replica(actor.config, actor.tokenizer)
    with pytest.raises(RuntimeError, match="has no weights yet: sync it first"):
        replica.call("generate_sequences", prompts)
    replica._conn.close()  # as when the trainer's process dies: the child's recv sees EOF
    replica._process.join(timeout=120)
    assert replica._process.exitcode == 0


def test_each_sync_is_probed_and_one_that_reached_nothing_is_named(actor, replica, prompts) -> None:
    """The weight_sync health check's probe on the replica: after a sync its normalisation
    weights are the ones sent; planted fault: the trainer fills buffers the replica does not
    share (the sync reaches nothing), so the replica keeps its weights."""
    replica.sync(actor.full_weights().items())
    assert (replica.last_sync.probed, replica.last_sync.mismatched) == (5, ())
    out = replica.call("generate_sequences", prompts, seed=3)
    assert out.meta_info["metrics"] == {
        "rollout/weight_sync/probed": 5.0,
        "rollout/weight_sync/mismatched": 0.0,
    }
    shared = replica._buffers
    replica._buffers = {name: buffer.clone() for name, buffer in shared.items()}
    try:
        moved = {name: tensor + 0.5 for name, tensor in actor.full_weights().items()}
        replica.sync(moved.items())
        assert len(replica.last_sync.mismatched) == 5
    finally:
        replica._buffers = shared
        replica.sync(actor.full_weights().items())
    assert replica.last_sync.mismatched == ()


def test_an_engine_that_cannot_be_built_is_named_at_the_first_call(actor, tmp_path) -> None:
    spec = {"path": str(tmp_path / "no-model"), "dtype": "float32", "enforce_eager": False}
    replica = ProcessReplica(actor.config, actor.tokenizer, HFChild, spec)
    try:
        with pytest.raises(RuntimeError, match=r"building its engine failed(.|\n)*no-model"):
            replica.sync(actor.full_weights().items())
    finally:
        replica.close()
