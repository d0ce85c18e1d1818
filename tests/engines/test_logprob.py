"""Chunked response log-probs equal a direct forward + log-softmax + gather at the real response
tokens (0 elsewhere), with gradients; the chunks hold far less memory than (B, R, V) logits at a
151k vocabulary."""

from __future__ import annotations

import weakref

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from transformers import Qwen2Config, Qwen2ForCausalLM

import stages.engines.logprob as logprob
from stages.engines.logprob import (
    chunk_tokens_for,
    chunked_logprobs,
    response_logprobs,
    token_logprobs_and_entropy,
)


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


def response_real(mask: torch.Tensor, R: int) -> torch.Tensor:
    return mask[:, -R:].bool()


@pytest.mark.parametrize("chunk_tokens", [1, 3, 256, None])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_chunked_logprobs_match_direct_forward(tiny_lm, chunk_tokens, temperature):
    ids, mask, pos = left_right_padded_batch([3, 5, 1], [4, 2, 0], P=5, R=4)
    expected = direct_logprobs(tiny_lm, ids, mask, pos, 4, temperature)
    with torch.no_grad():
        got, entropy = response_logprobs(
            tiny_lm, ids, mask, pos, 4, temperature=temperature, chunk_tokens=chunk_tokens
        )
    real = response_real(mask, 4)
    torch.testing.assert_close(got[real], expected[real], atol=1e-5, rtol=1e-5)
    assert (got[~real] == 0).all()  # response padding is not projected
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
    real = response_real(mask, 3)
    torch.testing.assert_close(entropy[real], expected[real], atol=1e-5, rtol=1e-5)


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
    (direct_logprobs(tiny_lm, ids, mask, pos, 3, 1.0) * response_real(mask, 3)).sum().backward()
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


def flat_oracle(hidden, labels, lm_head, temperature):
    """(B, R) log-probs and entropy from the whole (B, R, V) logits at once."""
    return token_logprobs_and_entropy(lm_head(hidden) / temperature, labels, True)


@pytest.mark.parametrize("chunk_tokens", [1, 4, 7, None])
@pytest.mark.parametrize("recompute_above", [0, 1 << 40], ids=["recomputed", "kept"])
def test_chunks_over_flat_tokens_cross_rows_with_equal_values_and_gradients(
    monkeypatch, chunk_tokens, recompute_above
):
    monkeypatch.setattr(logprob, "RECOMPUTE_ABOVE_BYTES", recompute_above)
    monkeypatch.setattr(logprob, "CHUNK_LOGITS_BYTES", 5 * 4 * 11)  # 5 tokens by default
    torch.manual_seed(3)
    lm_head = nn.Linear(8, 11, bias=False)
    hidden = torch.randn(3, 4, 8, requires_grad=True)
    labels = torch.randint(0, 11, (3, 4))
    needed = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [0, 0, 0, 0]], dtype=torch.bool)
    weights = torch.randn(3, 4)  # a loss that tells the positions apart
    lp, ent = chunked_logprobs(
        hidden, labels, needed, lm_head, temperature=0.7, calculate_entropy=True,
        chunk_tokens=chunk_tokens,
    )  # fmt: skip
    ((lp + ent) * weights).sum().backward()
    got = [hidden.grad.clone(), lm_head.weight.grad.clone()]
    hidden.grad = lm_head.weight.grad = None
    lp_ref, ent_ref = flat_oracle(hidden, labels, lm_head, 0.7)
    ((lp_ref + ent_ref) * weights * needed).sum().backward()
    torch.testing.assert_close(lp, lp_ref * needed, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(ent, ent_ref * needed, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(got[0], hidden.grad, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(got[1], lm_head.weight.grad, atol=1e-6, rtol=1e-5)


def test_no_real_response_token_still_backpropagates():
    lm_head = nn.Linear(8, 11, bias=False)
    hidden = torch.randn(2, 3, 8, requires_grad=True)
    needed = torch.zeros(2, 3, dtype=torch.bool)
    lp, _ = chunked_logprobs(hidden, torch.zeros(2, 3, dtype=torch.long), needed, lm_head)
    assert (lp == 0).all()
    lp.sum().backward()  # an all-padding micro-batch: zero gradients, no error
    assert (hidden.grad == 0).all()


class LiveBytes(TorchDispatchMode):
    """Bytes of the tensor storages the ops inside it allocate and that are still alive: the peak
    and the largest one. Every allocation is counted exactly (no allocator or RSS noise), on any
    device, the meta device included (sizes without memory)."""

    def __init__(self) -> None:
        super().__init__()
        self.live = self.peak = self.largest = 0
        self._holders: dict[int, int] = {}  # storage → live tensors on it

    def _release(self, storage: int, nbytes: int) -> None:
        self._holders[storage] -= 1
        if self._holders[storage] == 0:
            del self._holders[storage]
            self.live -= nbytes

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for tensor in tree_leaves(out):
            if isinstance(tensor, torch.Tensor):
                storage = tensor.untyped_storage()
                key, nbytes = storage._cdata, storage.nbytes()
                if key not in self._holders:
                    self._holders[key] = 0
                    self.live += nbytes
                    self.peak = max(self.peak, self.live)
                    self.largest = max(self.largest, nbytes)
                self._holders[key] += 1
                weakref.finalize(tensor, self._release, key, nbytes)
        return out


def logprob_memory(
    device: str, chunked: bool, B: int, R: int, V: int, H: int = 64, backward: bool = False
) -> LiveBytes:
    """Memory of log-probs and entropy of (B, R) tokens from (B, R, H) hidden states at vocab V
    (and of their backward): chunked (:func:`chunked_logprobs`) or from the full (B, R, V) float32
    logits."""
    torch.manual_seed(0)
    lm_head = nn.Linear(H, V, bias=False, device=device).requires_grad_(backward)
    hidden = torch.randn(B, R, H, device=device, requires_grad=backward)
    labels = torch.randint(0, V, (B, R), device=device)
    needed = torch.ones(B, R, dtype=torch.bool, device=device)
    with torch.set_grad_enabled(backward), LiveBytes() as memory:
        if chunked:
            lp, ent = chunked_logprobs(hidden, labels, needed, lm_head, calculate_entropy=True)
        else:
            lp, ent = flat_oracle(hidden, labels, lm_head, 1.0)
        if backward:
            (lp.sum() + ent.sum()).backward()
    return memory


def test_meta_device_counts_the_full_path_like_the_cpu():
    cpu, meta = (logprob_memory(d, False, B=2, R=8, V=1000) for d in ("cpu", "meta"))
    assert (cpu.peak, cpu.largest) == (meta.peak, meta.largest) > (0, 0)


def test_chunked_peak_memory_is_a_fraction_of_the_full_logits_at_151k_vocab():
    """B = 4, R = 256 (1,024 tokens), V = 151,936, H = 64, no grad. The full path's (B, R, V)
    float32 logits alone are 594 MiB; it runs on the meta device (counted like the CPU above)."""
    B, R, V = 4, 256, 151_936
    full = logprob_memory("meta", False, B, R, V)
    chunked = logprob_memory("cpu", True, B, R, V)
    assert full.largest == B * R * V * 4
    assert chunked.largest == chunk_tokens_for(V) * V * 4 <= logprob.CHUNK_LOGITS_BYTES
    assert chunked.peak * 4 < full.peak
    print(f"peak MiB: full {full.peak / 2**20:.0f}, chunked {chunked.peak / 2**20:.0f}")


@pytest.mark.slow
def test_chunked_training_peak_memory_is_a_fraction_of_the_full_logits_at_151k_vocab():
    """B = 8, R = 256 (2,048 tokens), V = 151,936, H = 64, forward and backward: the chunks are
    recomputed in backward, so the graph keeps no (tokens × V) logits."""
    B, R, V = 8, 256, 151_936
    full = logprob_memory("meta", False, B, R, V, backward=True)
    chunked = logprob_memory("cpu", True, B, R, V, backward=True)
    assert chunked.peak * 6 < full.peak
    print(f"peak MiB: full {full.peak / 2**20:.0f}, chunked {chunked.peak / 2**20:.0f}")
