"""HF rollout: output layout, log-probs equal the actor's recomputation, greedy determinism, and
the prefill a prompt's samples share."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict
from transformers import Qwen2Config, Qwen2ForCausalLM

from dataproto import DataProto
from stages.engines.logprob import response_logprobs
from stages.engines.rollout_hf import (
    SamplingSettings,
    generate_sequences,
    response_mask_from_tokens,
    shared_prompt_cache,
)

EOS, PAD, VOCAB = 2, 0, 61


@pytest.fixture(scope="module")
def tiny_lm() -> Qwen2ForCausalLM:
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=64,
        eos_token_id=EOS,
        pad_token_id=PAD,
    )
    model = Qwen2ForCausalLM(config).eval()
    with torch.no_grad():  # make EOS likely so that some rows stop early
        model.lm_head.weight[EOS] += 0.6 * model.lm_head.weight.abs().mean()
    return model


def prompt_batch(lengths: list[int], width: int, seed: int = 0) -> DataProto:
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, VOCAB, (len(lengths), width), generator=generator)
    mask = torch.zeros(len(lengths), width, dtype=torch.long)
    for i, n in enumerate(lengths):
        mask[i, width - n :] = 1
    ids = ids.masked_fill(mask == 0, PAD)
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    td = TensorDict(
        {"input_ids": ids, "attention_mask": mask, "position_ids": pos}, batch_size=[len(lengths)]
    )
    return DataProto(batch=td, non_tensor_batch={}, meta_info={})


def test_layout_invariants(tiny_lm):
    torch.manual_seed(3)
    settings = SamplingSettings(
        response_length=12, eos_token_id=EOS, pad_token_id=PAD, temperature=1.0
    )
    prompts = prompt_batch([5, 2, 7, 7, 1, 3], width=7)
    out = generate_sequences(
        tiny_lm,
        prompts,
        settings,
    ).batch
    B, P, R = 6, 7, 12
    assert out["responses"].shape == (B, R) and out["input_ids"].shape == (B, P + R)
    assert torch.equal(out["prompts"], prompts.batch["input_ids"])
    assert torch.equal(out["input_ids"], torch.cat([out["prompts"], out["responses"]], 1))
    mask = out["response_mask"]
    lengths = mask.sum(-1)
    assert torch.equal(mask, (torch.arange(R) < lengths[:, None]).long()), (
        "mask is a prefix of ones"
    )
    assert torch.equal(out["attention_mask"][:, P:], mask)
    assert (out["responses"][mask == 0] == PAD).all()
    for row, n in zip(out["responses"], lengths.tolist()):
        eos_positions = (row[:n] == EOS).nonzero().flatten().tolist()
        assert eos_positions in ([], [n - 1]), "EOS, when present, is the last valid token"
    assert (lengths < R).any() and (lengths >= 1).all()
    positions = out["position_ids"]
    assert torch.equal(positions[:, P:], positions[:, P - 1 : P] + torch.arange(1, R + 1))
    assert (out["rollout_log_probs"][mask == 0] == 0).all()


@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_rollout_log_probs_match_actor_recomputation(tiny_lm, temperature):
    torch.manual_seed(5)
    settings = SamplingSettings(
        response_length=10,
        eos_token_id=EOS,
        pad_token_id=PAD,
        temperature=temperature,
        top_k=20,
        top_p=0.9,
    )
    out = generate_sequences(tiny_lm, prompt_batch([4, 6, 2], width=6, seed=1), settings).batch
    with torch.no_grad():
        recomputed, _ = response_logprobs(
            tiny_lm,
            out["input_ids"],
            out["attention_mask"],
            out["position_ids"],
            10,
            temperature=temperature,
        )
    mask = out["response_mask"].bool()
    torch.testing.assert_close(
        out["rollout_log_probs"][mask], recomputed[mask], atol=1e-4, rtol=1e-4
    )


def test_greedy_is_deterministic_and_chunking_does_not_change_it(tiny_lm):
    prompts = prompt_batch([3, 5, 5, 1], width=5, seed=2)
    greedy = SamplingSettings(
        response_length=8, eos_token_id=EOS, pad_token_id=PAD, do_sample=False
    )
    first = generate_sequences(tiny_lm, prompts, greedy).batch["responses"]
    second = generate_sequences(tiny_lm, prompts, greedy).batch["responses"]
    chunked = SamplingSettings(
        response_length=8, eos_token_id=EOS, pad_token_id=PAD, do_sample=False, max_batch_rows=1
    )
    assert torch.equal(first, second)
    assert torch.equal(first, generate_sequences(tiny_lm, prompts, chunked).batch["responses"])


def test_a_prompts_samples_share_its_prefill_and_generate_what_separate_rows_do(tiny_lm):
    # 1-token prompt included: its cached columns are all padding
    prompts = prompt_batch([4, 1, 6], width=6, seed=3).repeat(3)
    greedy = dict(response_length=8, eos_token_id=EOS, pad_token_id=PAD, do_sample=False)
    shared = generate_sequences(tiny_lm, prompts, SamplingSettings(**greedy)).batch
    # one row per generate call: no prompt repeats in a chunk, generate does its own prefill
    alone = generate_sequences(tiny_lm, prompts, SamplingSettings(**greedy, max_batch_rows=1)).batch
    assert torch.equal(shared["responses"], alone["responses"])
    torch.testing.assert_close(
        shared["rollout_log_probs"], alone["rollout_log_probs"], atol=1e-5, rtol=1e-5
    )


def test_sampled_rows_of_repeated_prompts_have_the_actors_log_probs(tiny_lm):
    torch.manual_seed(11)
    settings = SamplingSettings(response_length=10, eos_token_id=EOS, pad_token_id=PAD)
    out = generate_sequences(
        tiny_lm, prompt_batch([3, 6, 2], width=6, seed=4).repeat(4), settings
    ).batch
    with torch.no_grad():
        recomputed, _ = response_logprobs(
            tiny_lm, out["input_ids"], out["attention_mask"], out["position_ids"], 10
        )
    mask = out["response_mask"].bool()
    torch.testing.assert_close(
        out["rollout_log_probs"][mask], recomputed[mask], atol=1e-4, rtol=1e-4
    )
    assert len({tuple(r) for r in out["responses"][:4].tolist()}) > 1, "samples differ"


def test_shared_prompt_cache_holds_every_row_but_the_last_column_and_only_when_prompts_repeat(
    tiny_lm,
):
    prompts = prompt_batch([2, 5], width=5, seed=5).repeat(3).batch
    ids, mask = prompts["input_ids"], prompts["attention_mask"]
    with torch.no_grad():
        cache = shared_prompt_cache(tiny_lm, ids, mask)
        positions = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 0)
        full = tiny_lm(
            input_ids=ids[:, :-1],
            attention_mask=mask[:, :-1],
            position_ids=positions[:, :-1],
            use_cache=True,
        ).past_key_values
        distinct = prompt_batch([2, 5], width=5, seed=6).batch
        none_repeat = shared_prompt_cache(
            tiny_lm, distinct["input_ids"], distinct["attention_mask"]
        )
        one_column = shared_prompt_cache(tiny_lm, ids[:, -1:], mask[:, -1:])
    assert cache.get_seq_length() == 4
    for layer, reference in zip(cache.layers, full.layers, strict=True):
        assert layer.keys.shape[0] == 6
        real = mask[:, :-1].bool()  # padded columns are never attended to
        torch.testing.assert_close(
            layer.keys.transpose(1, 2)[real], reference.keys.transpose(1, 2)[real]
        )
        torch.testing.assert_close(
            layer.values.transpose(1, 2)[real], reference.values.transpose(1, 2)[real]
        )
    assert none_repeat is None and one_column is None


def test_response_mask_stops_at_first_eos():
    responses = torch.tensor([[7, EOS, 9, EOS], [EOS, 1, 1, 1], [5, 5, 5, 5]])
    expected = torch.tensor([[1, 1, 0, 0], [1, 0, 0, 0], [1, 1, 1, 1]])
    assert torch.equal(response_mask_from_tokens(responses, (EOS,)), expected)


def test_bad_sampling_settings_are_named():
    with pytest.raises(ValueError, match="temperature"):
        SamplingSettings(response_length=4, eos_token_id=EOS, pad_token_id=PAD, temperature=0.0)
    with pytest.raises(ValueError, match="response_length"):
        SamplingSettings(response_length=0, eos_token_id=EOS, pad_token_id=PAD)
