"""stages/engines/hf_decode.py: the static-cache decode loop generates what HF ``generate`` does
(greedy tokens, masks, log-probs), drops finished rows in the bucket schedule it states, samples
from the processed distribution under the call's seed, compiles into one graph per batch size
that later calls replay, and the decode path is chosen by what each registry entry needs."""

from __future__ import annotations

import functools
from types import SimpleNamespace

import pytest
import torch
import torch._dynamo.utils
from tensordict import TensorDict
from transformers import AutoModelForCausalLM, Qwen2Config, Qwen2ForCausalLM

from dataproto import DataProto
from stages.engines.hf_decode import (
    _POOLED_BUFFERS,
    CompileSettings,
    bucket_sizes,
    static_decode,
)
from stages.engines.logprob import response_logprobs
from stages.engines.rollout_backends import ROLLOUT_BACKENDS
from stages.engines.rollout_hf import (
    HF_DECODE_PATHS,
    SamplingSettings,
    choose_decode_path,
    generate_sequences,
)

PAD, VOCAB, R = 0, 61, 12
STATIC = HF_DECODE_PATHS.get("static").run


@pytest.fixture(scope="module")
def tiny_lm() -> Qwen2ForCausalLM:
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64,
        eos_token_id=2, pad_token_id=PAD,
    )  # fmt: skip
    return Qwen2ForCausalLM(config).eval()


def prompt_batch(lengths: list[int], width: int, seed: int = 0) -> DataProto:
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, VOCAB, (len(lengths), width), generator=generator)
    mask = (torch.arange(width) >= width - torch.tensor(lengths)[:, None]).long()
    tensors = {
        "input_ids": ids.masked_fill(mask == 0, PAD),
        "attention_mask": mask,
        "position_ids": (mask.cumsum(-1) - 1).clamp(min=0),
    }
    return DataProto(TensorDict(tensors, batch_size=[len(lengths)]), {}, {})


@pytest.fixture(scope="module")
def prompts() -> DataProto:
    """12 rows: 4 prompts (one of a single token) × 3 adjacent samples, plus leading columns that
    are padding in every row."""
    return prompt_batch([4, 1, 6, 3], width=8, seed=3).repeat(3, interleave=True)


@pytest.fixture(scope="module")
def stop_id(tiny_lm, prompts) -> int:
    """The token whose first greedy occurrence falls at the most different steps, used as EOS so
    that rows end at different steps (the random model's greedy decoding never picks its
    configured EOS)."""
    free = SamplingSettings(response_length=R, eos_token_id=(), pad_token_id=PAD, do_sample=False)
    tokens = generate_sequences(tiny_lm, prompts, free).batch["responses"][:, : R - 1]

    def first_steps(token: int) -> int:
        return len({row.index(token) for row in tokens.tolist() if token in row})

    return max(range(3, VOCAB), key=first_steps)


def greedy(stop_ids, **overrides) -> SamplingSettings:
    settings = dict(response_length=R, eos_token_id=stop_ids, pad_token_id=PAD, do_sample=False)
    return SamplingSettings(**{**settings, **overrides})


def assert_same_rollout(ours: TensorDict, reference: TensorDict) -> None:
    for key in ("responses", "response_mask", "input_ids", "attention_mask", "position_ids"):
        assert torch.equal(ours[key], reference[key]), key
    torch.testing.assert_close(
        ours["rollout_log_probs"], reference["rollout_log_probs"], atol=1e-5, rtol=1e-5
    )


@pytest.mark.parametrize(
    "case",
    ["shared prompts", "distinct prompts", "two stop ids", "ignore_eos", "chunks of 4 rows"],
)
def test_greedy_static_decode_equals_generate(tiny_lm, prompts, stop_id, case):
    batch, settings = prompts, greedy(stop_id)
    if case == "distinct prompts":
        batch = prompt_batch([4, 1, 6, 2, 8, 3], width=8, seed=4)
    elif case == "two stop ids":
        settings = greedy((stop_id, 7))
    elif case == "ignore_eos":
        settings = greedy(stop_id, ignore_eos=True)
    elif case == "chunks of 4 rows":
        settings = greedy(stop_id, max_batch_rows=4)
    reference = generate_sequences(tiny_lm, batch, settings).batch
    ours = generate_sequences(tiny_lm, batch, settings, STATIC).batch
    assert_same_rollout(ours, reference)
    lengths = ours["response_mask"].sum(-1)
    if case == "ignore_eos":
        assert (lengths == R).all() and (ours["responses"] == stop_id).any()
    elif case != "distinct prompts":
        assert len(set(lengths.tolist())) >= 3 and (lengths < R).any()


def decoded_row_steps(model, run) -> int:
    """Rows fed through the model one token at a time (the decode steps' batch sizes, summed)."""
    counted = []

    def count(module, args, kwargs):
        ids = kwargs["input_ids"]
        if ids.shape[1] == 1:
            counted.append(ids.shape[0])

    handle = model.register_forward_pre_hook(count, with_kwargs=True)
    try:
        out = run()
    finally:
        handle.remove()
    return sum(counted), out


def test_finished_rows_leave_the_batch_in_halving_buckets(tiny_lm, prompts, stop_id):
    settings = greedy(stop_id)
    steps_generate, reference = decoded_row_steps(
        tiny_lm, lambda: generate_sequences(tiny_lm, prompts, settings).batch
    )
    steps_static, ours = decoded_row_steps(
        tiny_lm, lambda: generate_sequences(tiny_lm, prompts, settings, STATIC).batch
    )
    assert_same_rollout(ours, reference)
    rows, lengths = prompts.batch.batch_size[0], ours["response_mask"].sum(-1)
    expected = 0
    for step in range(R - 1):  # the forward after token `step` runs the live rows' bucket
        live = int((lengths > step + 1).sum())
        if live == 0:
            break
        expected += min(size for size in bucket_sizes(rows, 1) if size >= live)
    assert steps_static == expected
    assert steps_static < 0.8 * steps_generate  # generate decodes all 12 rows to the last one


def test_bucket_sizes_halve_down_to_the_smallest_batch():
    assert bucket_sizes(64, 8) == [64, 32, 16, 8]
    assert bucket_sizes(9, 1) == [9, 8, 4, 2, 1]
    assert bucket_sizes(3, 8) == [3]


def test_sampling_is_seeded_and_keeps_the_actors_log_probs(tiny_lm, prompts, stop_id):
    sampled = dict(response_length=R, eos_token_id=stop_id, pad_token_id=PAD, temperature=0.7)
    settings = SamplingSettings(**sampled, top_k=20, top_p=0.9, seed=5)
    first = generate_sequences(tiny_lm, prompts, settings, STATIC).batch
    again = generate_sequences(tiny_lm, prompts, settings, STATIC).batch
    other = SamplingSettings(**sampled, top_k=20, top_p=0.9, seed=6)
    assert torch.equal(first["responses"], again["responses"])
    assert not torch.equal(
        first["responses"], generate_sequences(tiny_lm, prompts, other, STATIC).batch["responses"]
    )
    with torch.no_grad():
        recomputed, _ = response_logprobs(
            tiny_lm, first["input_ids"], first["attention_mask"], first["position_ids"], R,
            temperature=0.7,
        )  # fmt: skip
    mask = first["response_mask"].bool()
    torch.testing.assert_close(
        first["rollout_log_probs"][mask], recomputed[mask], atol=1e-4, rtol=1e-4
    )


def test_sampled_tokens_follow_the_processed_distribution(tiny_lm):
    """One prompt sampled 4000 times: the first token's frequencies are softmax(top-5 of
    logits / 0.8), as ``generate`` samples it (total variation within sampling noise)."""
    rows, temperature = 4000, 0.8
    prompts = prompt_batch([5], width=5, seed=7).repeat(rows)
    settings = SamplingSettings(
        response_length=2, eos_token_id=(), pad_token_id=PAD, temperature=temperature, top_k=5,
        seed=0,
    )  # fmt: skip
    first = generate_sequences(tiny_lm, prompts, settings, STATIC).batch["responses"][:, 0]
    with torch.no_grad():
        logits = tiny_lm(input_ids=prompts.batch["input_ids"][:1]).logits[0, -1] / temperature
    top = logits.topk(5)
    expected = torch.zeros(VOCAB).index_put_((top.indices,), torch.softmax(top.values, -1))
    observed = torch.bincount(first, minlength=VOCAB).float() / rows
    assert set(first.unique().tolist()) <= set(top.indices.tolist())
    assert 0.5 * (observed - expected).abs().sum() < 0.04


def test_the_compiled_step_is_one_graph_per_batch_size_and_later_calls_replay_it(
    tiny_lm, prompts, stop_id
):
    """torch.compile with the aot_eager backend (traces without generating code, so it runs on
    the CPU) and fullgraph=True: a graph break would be an error."""
    torch._dynamo.reset()
    compiled = functools.partial(
        static_decode,
        compiled=CompileSettings(
            mode=None, backend="aot_eager", fullgraph=True, recompile_limit=64
        ),
        min_rows=1,
    )
    settings = greedy(stop_id)
    reference = generate_sequences(tiny_lm, prompts, settings).batch
    ours = generate_sequences(tiny_lm, prompts, settings, compiled).batch
    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    buffers = _POOLED_BUFFERS[tiny_lm]
    again = generate_sequences(tiny_lm, prompts, settings, compiled).batch
    assert_same_rollout(ours, reference)
    assert_same_rollout(again, reference)
    lengths = ours["response_mask"].sum(-1)
    sizes = {
        min(s for s in bucket_sizes(12, 1) if s >= int((lengths > step + 1).sum()))
        for step in range(R - 1)
        if (lengths > step + 1).any()
    }
    assert graphs == len(sizes) >= 2
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == graphs, "recompiled"
    assert _POOLED_BUFFERS[tiny_lm] is buffers, "the compiled path reuses its buffers"


def test_the_decode_path_is_the_preferred_entry_whose_needs_hold(tiny_lm, tmp_path, make_tiny_lm):
    cpu, cuda = torch.device("cpu"), torch.device("cuda", 0)  # only the device type is read

    def chosen(module, device, eager=False, gathered=False):
        spec = choose_decode_path(module, device, enforce_eager=eager, weights_gathered=gathered)
        return next(name for name in HF_DECODE_PATHS if HF_DECODE_PATHS.get(name) is spec)

    sliding = AutoModelForCausalLM.from_pretrained(
        make_tiny_lm(tmp_path, use_sliding_window=True, sliding_window=4, max_window_layers=0)
    )
    assert chosen(tiny_lm, cpu) == "generate"
    assert chosen(tiny_lm, cuda) == "cuda_graphs"
    assert chosen(tiny_lm, cuda, eager=True) == "static"  # verl: enforce_eager = no CUDA graphs
    assert chosen(tiny_lm, cuda, gathered=True) == "static"  # ZeRO-3
    assert chosen(sliding, cuda) == "generate"


def test_the_hf_backend_passes_enforce_eager_and_zero3_to_the_choice(tiny_lm, prompts, monkeypatch):
    import stages.engines.rollout_hf as rollout_hf

    asked = []

    def spy(module, device, *, enforce_eager, weights_gathered):
        asked.append((device.type, enforce_eager, weights_gathered))
        return HF_DECODE_PATHS.get("generate")

    monkeypatch.setattr(rollout_hf, "choose_decode_path", spy)
    for eager, stage in ((True, 2), (False, 3)):
        worker = SimpleNamespace(
            lm=tiny_lm,
            engine=SimpleNamespace(device="cpu", zero_optimization_stage=lambda s=stage: s),
            config=SimpleNamespace(
                actor_rollout_ref=SimpleNamespace(rollout=SimpleNamespace(enforce_eager=eager))
            ),
            full_parameters=lambda: torch.no_grad(),
        )
        out = ROLLOUT_BACKENDS.get("hf").generate(worker, prompts, greedy(2, response_length=3))
        assert out.batch["responses"].shape == (12, 3)
    assert asked == [("cpu", True, False), ("cpu", False, True)]


def test_static_decode_takes_no_generate_arguments(tiny_lm, prompts):
    with pytest.raises(TypeError, match="synced_gpus"):
        generate_sequences(tiny_lm, prompts, greedy(2), STATIC, synced_gpus=True)


@pytest.mark.gpu
def test_the_cuda_graph_path_equals_generate_on_cuda(tiny_lm, prompts, stop_id):
    """fp32 on CUDA: the compiled (inductor, reduce-overhead) decode gives generate's greedy
    tokens, and a second call (the graphs replayed) gives them again."""
    model = Qwen2ForCausalLM(tiny_lm.config).eval().cuda()
    model.load_state_dict(tiny_lm.state_dict())
    on_gpu = DataProto(prompts.batch.to("cuda"), {}, {})
    settings = greedy(stop_id)
    spec = choose_decode_path(
        model, torch.device("cuda"), enforce_eager=False, weights_gathered=False
    )
    assert spec is HF_DECODE_PATHS.get("cuda_graphs")
    reference = generate_sequences(model, on_gpu, settings).batch
    for _ in range(2):
        ours = generate_sequences(model, on_gpu, settings, spec.run).batch
        assert torch.equal(ours["responses"], reference["responses"])
        torch.testing.assert_close(
            ours["rollout_log_probs"], reference["rollout_log_probs"], atol=1e-4, rtol=1e-4
        )
