"""Chunked response log-probs equal a direct forward + log-softmax + gather."""

from __future__ import annotations

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from stages.engines.logprob import response_logprobs, token_logprobs_and_entropy


@pytest.fixture(scope="module")
def tiny_lm() -> Qwen2ForCausalLM:
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=97,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=64,
    )
    return Qwen2ForCausalLM(config).eval()


def left_right_padded_batch(prompt_lens: list[int], response_lens: list[int], P: int, R: int):
    generator = torch.Generator().manual_seed(1)
    B = len(prompt_lens)
    input_ids = torch.randint(1, 97, (B, P + R), generator=generator)
    attention_mask = torch.zeros(B, P + R, dtype=torch.long)
    for i, (p, r) in enumerate(zip(prompt_lens, response_lens)):
        attention_mask[i, P - p : P + r] = 1
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    return input_ids, attention_mask, position_ids


def direct_logprobs(model, input_ids, attention_mask, position_ids, R, temperature):
    logits = model(
        input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids
    ).logits
    logits = logits[:, -R - 1 : -1].float() / temperature
    return torch.log_softmax(logits, -1).gather(-1, input_ids[:, -R:].unsqueeze(-1)).squeeze(-1)


@pytest.mark.parametrize("chunk_tokens", [1, 3, 256])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_chunked_logprobs_match_direct_forward(tiny_lm, chunk_tokens, temperature):
    ids, mask, pos = left_right_padded_batch([3, 5, 1], [4, 2, 0], P=5, R=4)
    expected = direct_logprobs(tiny_lm, ids, mask, pos, 4, temperature)
    with torch.no_grad():
        got, entropy = response_logprobs(
            tiny_lm, ids, mask, pos, 4, temperature=temperature, chunk_tokens=chunk_tokens
        )
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    assert entropy is None


def test_entropy_matches_softmax_definition(tiny_lm):
    ids, mask, pos = left_right_padded_batch([2, 4], [3, 3], P=4, R=3)
    with torch.no_grad():
        _, entropy = response_logprobs(
            tiny_lm, ids, mask, pos, 3, calculate_entropy=True, chunk_tokens=2
        )
        logits = tiny_lm(input_ids=ids, attention_mask=mask, position_ids=pos).logits[:, -4:-1]
    probs = torch.softmax(logits, -1)
    expected = -(probs * torch.log_softmax(logits, -1)).sum(-1)
    torch.testing.assert_close(entropy, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("recompute_above", [0, 1 << 40], ids=["recomputed", "kept"])
def test_gradients_flow_through_checkpointed_chunks(tiny_lm, monkeypatch, recompute_above):
    import stages.engines.logprob as logprob

    monkeypatch.setattr(logprob, "RECOMPUTE_ABOVE_BYTES", recompute_above)
    ids, mask, pos = left_right_padded_batch([2, 3], [3, 1], P=3, R=3)
    tiny_lm.zero_grad()
    got, _ = response_logprobs(tiny_lm, ids, mask, pos, 3, chunk_tokens=2)
    got.sum().backward()
    chunked = [p.grad.clone() for p in tiny_lm.parameters()]
    tiny_lm.zero_grad()
    direct_logprobs(tiny_lm, ids, mask, pos, 3, 1.0).sum().backward()
    for a, b in zip(chunked, (p.grad for p in tiny_lm.parameters())):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)
    tiny_lm.zero_grad()


def test_bad_arguments_are_named(tiny_lm):
    ids, mask, pos = left_right_padded_batch([2], [2], P=2, R=2)
    with pytest.raises(ValueError, match="temperature"):
        response_logprobs(tiny_lm, ids, mask, pos, 2, temperature=0.0)
    with pytest.raises(ValueError, match="response_length"):
        response_logprobs(tiny_lm, ids, mask, pos, 4)


def test_uniform_logits_give_log_vocab():
    lp, ent = token_logprobs_and_entropy(
        torch.zeros(2, 3, 8), torch.zeros(2, 3, dtype=torch.long), True
    )
    torch.testing.assert_close(lp, torch.full((2, 3), -torch.log(torch.tensor(8.0))))
    torch.testing.assert_close(ent, torch.full((2, 3), torch.log(torch.tensor(8.0))))
