"""Packed rows by a variable-length kernel (stages/engines/attention.py ``VARLEN_KERNELS``): the
kernel is picked by what it needs; where one fits, the packed forward is one row, the sequence
boundaries are handed to the attention, no (N × N) mask is built, and the log-probs, values and
gradients are the padded forward's (fp32, 1e-5). On the CPU, where no registered kernel fits,
tests register the reference kernel (or eager flex_attention, forward only) for the CPU; the real
kernels run in the ``gpu`` tests at the end."""

from __future__ import annotations

import functools
import itertools

import pytest
import torch

from stages.engines import attention
from stages.engines.attention import (
    VARLEN_KERNELS,
    VarlenKernel,
    flex_varlen,
    varlen_kernel,
    varlen_reference,
)
from stages.engines.critic import ValueModel
from stages.engines.logprob import response_logprobs
from stages.engines.models import load_causal_lm, load_value_model
from stages.engines.packing import ROWS, pack_rows, packed_layout
from stages.registry import Registry

PROMPTS, RESPONSES, P, R = [3, 5, 1, 4, 2, 5, 5, 1], [4, 2, 1, 3, 4, 0, 1, 4], 5, 4
FP32 = (torch.float32,)
#: eager flex_attention (the CPU tests) warns that it is not compiled
pytestmark = pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")


def cpu_kernel(run, dtypes=FP32, package="torch", preference=10) -> VarlenKernel:
    return VarlenKernel(
        run=run, devices=("cpu",), dtypes=dtypes, package=package, preference=preference
    )


def kernel_registry(**kernels: VarlenKernel) -> Registry[VarlenKernel]:
    registry: Registry[VarlenKernel] = Registry("varlen attention kernel")
    for name, kernel in kernels.items():
        registry.add(name, kernel)
    return registry


@pytest.fixture
def on_cpu(monkeypatch):
    """Registers ``run`` as the preferred varlen kernel for CPU float32; returns the calls'
    boundaries."""
    calls: list[tuple[list[int], int]] = []

    def register(run):
        def recorded(query, key, value, cu_seq_lens, max_length, scale):
            calls.append((cu_seq_lens.tolist(), max_length))
            return run(query, key, value, cu_seq_lens, max_length, scale)

        kernels = {name: VARLEN_KERNELS.get(name) for name in VARLEN_KERNELS}
        registry = kernel_registry(cpu_test=cpu_kernel(recorded), **kernels)
        monkeypatch.setattr(attention, "VARLEN_KERNELS", registry)
        return calls

    return register


@pytest.fixture
def built_masks(monkeypatch):
    """The (q_length, kv_length) of every mask transformers' ``sdpa_mask`` builds."""
    from transformers import masking_utils

    sizes: list[tuple[int, int]] = []
    original = masking_utils.sdpa_mask

    def recorded(**kwargs):
        sizes.append((kwargs["q_length"], kwargs["kv_length"]))
        return original(**kwargs)

    monkeypatch.setattr(masking_utils, "sdpa_mask", recorded)
    return sizes


def qkv(lengths, heads=4, kv_heads=2, dim=8, grad=False):
    generator = torch.Generator().manual_seed(0)
    tokens = sum(lengths)
    shapes = [(tokens, heads, dim), (tokens, kv_heads, dim), (tokens, kv_heads, dim)]
    tensors = [torch.randn(s, generator=generator).requires_grad_(grad) for s in shapes]
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    return (*tensors, cu, max(lengths))


def block_diagonal_sdpa(query, key, value, cu_seq_lens):
    """The dense oracle: one (N × N) mask, causal inside each sequence."""
    sequence = torch.repeat_interleave(torch.arange(len(cu_seq_lens) - 1), cu_seq_lens.diff())
    causal = torch.ones(len(sequence), len(sequence), dtype=torch.bool).tril()
    mask = (sequence[:, None] == sequence[None, :]) & causal
    out = torch.nn.functional.scaled_dot_product_attention(
        query.transpose(0, 1), key.transpose(0, 1), value.transpose(0, 1), attn_mask=mask,
        enable_gqa=True,
    )  # fmt: skip
    return out.transpose(0, 1)


def test_no_registered_kernel_fits_the_cpu_and_the_first_fitting_entry_wins(
    tiny_model_dir, monkeypatch
):
    assert varlen_kernel("cpu", torch.float32) is None
    assert packed_layout(load_causal_lm(tiny_model_dir)) == ROWS  # the fallback: rows and a mask
    missing = cpu_kernel(varlen_reference, package="no_such_package_for_ppoflow", preference=4)
    bf16_only = cpu_kernel(varlen_reference, dtypes=(torch.bfloat16,), preference=3)
    wanted = cpu_kernel(varlen_reference, preference=2)
    kernels = kernel_registry(
        missing=missing, bf16=bf16_only, wanted=wanted, later=cpu_kernel(None, preference=1)
    )
    monkeypatch.setattr(attention, "VARLEN_KERNELS", kernels)
    assert varlen_kernel("cpu", torch.float32) is wanted
    assert varlen_kernel("cpu", torch.bfloat16) is bf16_only
    assert varlen_kernel(torch.device("cpu"), torch.float16) is None


@pytest.mark.parametrize("lengths", [[5, 3, 7], [1], [4, 1, 1, 6]])
def test_reference_and_eager_flex_equal_a_block_diagonal_mask(lengths):
    query, key, value, cu, longest = qkv(lengths)
    expected = block_diagonal_sdpa(query, key, value, cu)
    torch.testing.assert_close(varlen_reference(query, key, value, cu, longest, None), expected)
    flex = flex_varlen(query, key, value, cu, longest, None, compile=False)  # CPU: forward only
    torch.testing.assert_close(flex, expected, atol=1e-6, rtol=1e-5)


def padded_and_packed(model_dir, layout_model, t, calculate_entropy=True):
    """(log-probs, entropy, gradients) of the full and the packed forward of the tiny actor on the
    batch tensors ``t``."""
    real = t["response_mask"].bool()
    results = []
    for layout in ("full", "packed"):
        model = layout_model(model_dir)
        logprobs, entropy = response_logprobs(
            model, t["input_ids"], t["attention_mask"], t["position_ids"], R,
            temperature=0.7, calculate_entropy=calculate_entropy, layout=layout,
        )  # fmt: skip
        grads = {}
        if torch.is_grad_enabled():
            (logprobs * real).sum().backward()
            grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
        results.append((logprobs, entropy, grads))
    return results


def test_packed_varlen_forward_equals_the_padded_with_gradients(
    tiny_model_dir, make_rollout_batch, on_cpu, built_masks
):
    calls = on_cpu(varlen_reference)
    t = make_rollout_batch(PROMPTS, RESPONSES, P, R).batch
    model = load_causal_lm(tiny_model_dir)
    assert packed_layout(model).varlen and packed_layout(model).one_row
    (lp_full, ent_full, grads_full), (lp, ent, grads) = padded_and_packed(
        tiny_model_dir, load_causal_lm, t
    )
    real = t["response_mask"].bool()
    torch.testing.assert_close(lp[real], lp_full[real], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ent[real], ent_full[real], atol=1e-5, rtol=1e-5)
    assert grads.keys() == grads_full.keys()
    for name in grads:
        torch.testing.assert_close(grads[name], grads_full[name], atol=1e-5, rtol=1e-4, msg=name)
    lengths = [p + r for p, r in zip(PROMPTS, RESPONSES)]
    packed = pack_rows(
        t["input_ids"], t["attention_mask"], t["position_ids"], R, packed_layout(model)
    )
    assert packed.input_ids.shape == (1, sum(lengths))  # one row of the 45 real tokens
    bounds = packed.cu_seq_lens.tolist()
    assert sorted(b - a for a, b in itertools.pairwise(bounds)) == sorted(lengths)
    assert calls == [(bounds, max(lengths))] * 2  # handed in, the same in both layers
    assert built_masks == [(P + R, P + R)]  # the padded forward's; none (45 × 45) for the packed


def test_packed_varlen_values_and_gradients_equal_the_padded(
    tiny_model_dir, make_rollout_batch, on_cpu, built_masks
):
    on_cpu(varlen_reference)
    t = make_rollout_batch(PROMPTS, RESPONSES, P, R, seed=2).batch
    real = t["response_mask"].bool()
    results = []
    for layout in ("full", "packed"):
        torch.manual_seed(0)  # the value head is freshly initialised
        critic = ValueModel(load_value_model(tiny_model_dir), layout)
        values = critic(t["input_ids"], t["attention_mask"], t["position_ids"], R)
        (values * real).sum().backward()
        results.append((values, {n: p.grad for n, p in critic.named_parameters()}))
    (v_full, g_full), (values, grads) = results
    torch.testing.assert_close(values[real], v_full[real], atol=1e-5, rtol=1e-5)
    assert built_masks == [(P + R, P + R)]  # the padded forward's only
    for name in grads:
        torch.testing.assert_close(grads[name], g_full[name], atol=1e-5, rtol=1e-4, msg=name)


def test_eager_flex_attention_packed_forward_equals_the_padded(
    tiny_model_dir, make_rollout_batch, on_cpu, built_masks
):
    calls = on_cpu(functools.partial(flex_varlen, compile=False))
    t = make_rollout_batch(PROMPTS, RESPONSES, P, R, seed=1).batch
    with torch.no_grad():  # flex_attention has no CPU backward
        (lp_full, ent_full, _), (lp, ent, _) = padded_and_packed(tiny_model_dir, load_causal_lm, t)
    real = t["response_mask"].bool()
    torch.testing.assert_close(lp[real], lp_full[real], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ent[real], ent_full[real], atol=1e-5, rtol=1e-5)
    assert len(calls) == 2 and built_masks == [(P + R, P + R)]


def test_boundaries_come_from_position_ids_when_not_handed_in(tiny_model_dir, on_cpu):
    calls = on_cpu(varlen_reference)
    model = load_causal_lm(tiny_model_dir)
    ids = torch.randint(3, 50, (1, 20), generator=torch.Generator().manual_seed(2))
    positions = torch.cat([torch.arange(7), torch.arange(13)])[None]
    with torch.no_grad():
        packed = model(input_ids=ids, position_ids=positions).logits
        alone = torch.cat(
            [model(input_ids=ids[:, :7]).logits, model(input_ids=ids[:, 7:]).logits], 1
        )
    torch.testing.assert_close(packed, alone, atol=1e-5, rtol=1e-5)
    assert calls[0] == ([0, 7, 20], 13)


def test_several_packed_rows_each_start_their_own_sequences(tiny_model_dir, on_cpu):
    calls = on_cpu(functools.partial(flex_varlen, compile=False))
    model = load_causal_lm(tiny_model_dir)
    ids = torch.randint(3, 50, (2, 10), generator=torch.Generator().manual_seed(4))
    positions = torch.stack([torch.cat([torch.arange(4), torch.arange(6)]), torch.arange(10)])
    with torch.no_grad():
        packed = model(input_ids=ids, position_ids=positions).logits  # (2, 10, V)
        pieces = [(0, 0, 4), (0, 4, 10), (1, 0, 10)]  # (row, start, stop) of each sequence
        alone = [model(input_ids=ids[r, a:b][None]).logits[0] for r, a, b in pieces]
    torch.testing.assert_close(packed.reshape(20, -1), torch.cat(alone), atol=1e-5, rtol=1e-5)
    assert calls[0] == ([0, 4, 10, 20], 10)


def test_padded_and_cached_forwards_keep_sdpa(tiny_model_dir, on_cpu):
    calls = on_cpu(varlen_reference)
    model = load_causal_lm(tiny_model_dir)
    ids = torch.randint(3, 50, (2, 6), generator=torch.Generator().manual_seed(3))
    mask = torch.tensor([[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]])
    with torch.no_grad():
        model(input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0))
        assert not calls  # a padding mask: transformers' SDPA mask and attention
        model.generate(
            input_ids=ids, attention_mask=mask, max_new_tokens=3, do_sample=False,
            pad_token_id=0, eos_token_id=[], use_cache=True,
        )  # fmt: skip
    assert not calls


def test_attention_dropout_is_refused_on_the_varlen_path(tiny_model_dir, on_cpu):
    on_cpu(varlen_reference)
    model = load_causal_lm(tiny_model_dir).train()
    for layer in model.model.layers:
        layer.self_attn.attention_dropout = 0.1
    ids = torch.randint(3, 50, (1, 8))
    with pytest.raises(ValueError, match=r"takes no attention dropout, got 0\.1"):
        model(input_ids=ids, position_ids=torch.cat([torch.arange(3), torch.arange(5)])[None])


# --- CUDA: the registered kernels themselves ---------------------------------------------------


@pytest.fixture
def exact_fp32_matmuls():
    before = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("dtype", "name", "tolerance"),
    [(torch.bfloat16, "varlen_attn", 2e-2), (torch.float32, "flex_attention", 1e-5)],
)
def test_cuda_kernels_equal_a_block_diagonal_mask(dtype, name, tolerance, exact_fp32_matmuls):
    device = torch.device("cuda", 0)
    assert varlen_kernel(device, dtype) is VARLEN_KERNELS.get(name)
    query, key, value, cu, longest = (
        x.to(device) if isinstance(x, torch.Tensor) else x for x in qkv([37, 5, 130, 1], dim=64)
    )
    query, key, value = (x.to(dtype).requires_grad_() for x in (query, key, value))
    out = VARLEN_KERNELS.get(name).run(query, key, value, cu, longest, None)
    out.float().square().sum().backward()
    grads = [x.grad for x in (query, key, value)]
    leaves = [x.detach().float().requires_grad_() for x in (query, key, value)]
    expected = block_diagonal_sdpa(*leaves, cu)
    expected.square().sum().backward()
    torch.testing.assert_close(out.float(), expected, atol=tolerance, rtol=tolerance)
    for got, leaf in zip(grads, leaves):
        torch.testing.assert_close(got.float(), leaf.grad, atol=tolerance * 5, rtol=tolerance * 5)


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("dtype", "tolerance"), [(torch.float32, 1e-5), (torch.bfloat16, 5e-2)], ids=["fp32", "bf16"]
)
def test_cuda_packed_forward_equals_the_padded(
    tiny_model_dir, make_rollout_batch, dtype, tolerance, exact_fp32_matmuls, built_masks
):
    def on_cuda(path):
        return load_causal_lm(path, dtype="float32").to("cuda", dtype)

    assert packed_layout(on_cuda(tiny_model_dir)).varlen
    t = make_rollout_batch(PROMPTS, RESPONSES, P, R).batch.to("cuda")
    (lp_full, _, grads_full), (lp, _, grads) = padded_and_packed(tiny_model_dir, on_cuda, t)
    assert built_masks == [(P + R, P + R)]  # the padded forward's; none for the packed
    real = t["response_mask"].bool()
    torch.testing.assert_close(lp[real], lp_full[real], atol=tolerance, rtol=tolerance)
    for name in grads:
        torch.testing.assert_close(
            grads[name].float(), grads_full[name].float(), atol=tolerance * 10, rtol=1e-2, msg=name
        )
