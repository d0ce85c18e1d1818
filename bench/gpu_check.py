"""GPU figures for ``bench/gpu_check.sh``: peak bf16 matmul, actor-update MFU, rollout tokens/s.

Run on a CUDA machine from the repository root (the shell script does this, one part per process
so a crash or a vLLM process group cannot take the other figures down):

    python bench/gpu_check.py peak    --report gpu_report.md
    python bench/gpu_check.py mfu     --report gpu_report.md [--peak-tflops 788]
    python bench/gpu_check.py rollout --report gpu_report.md
    python bench/gpu_check.py lora    --report gpu_report.md

Each part appends a markdown section to ``--report`` and prints it. Without CUDA the ``lora`` part
appends a line saying it was skipped and exits 0 (the others exit 1);
``python bench/gpu_check.py lora --report R --cpu-smoke`` runs it on the CPU with a tiny model,
to check the script where there is no GPU (its figures mean nothing).

- peak: an 8192³ bf16 matmul (3 warm-ups, best of 10, CUDA events) → TFLOP/s; the MFU
  denominator. For reference: H200 datasheet dense bf16 ≈ 989 TFLOP/s; measured on this
  workplace's H200s 769–798 TFLOP/s (device KINDS.md).
- mfu: ``update_actor`` on a DeepSpeed ZeRO-2 bf16 engine (FusedAdam) over one mini-batch of
  B × (P + R) tokens (micro-batches of ``--micro`` rows), a random-init Qwen2 of ~0.36 B
  non-embedding parameters (hidden 1024, 24 layers, 16 heads / 4 KV heads, MLP 4096, the tiny
  byte tokenizer's vocabulary). MFU = 6 · N · tokens/s ÷ peak, N = non-embedding parameters,
  tokens = non-padding tokens of the mini-batch (attention FLOPs are not counted).
- rollout: the same model in bf16: ``rollout_hf.generate_sequences`` (all rows in one batch)
  through two HF decode paths, ``generate`` (HF's) and ``cuda_graphs`` (a static cache, finished
  rows dropped, each step a CUDA graph: ``stages.engines.hf_decode``), with their ratio, and,
  when ``vllm`` imports, ``VLLMRollout`` (bf16, eager mode) on the same prompts and sampling
  settings. tokens/s = generated tokens (Σ response_mask) ÷ wall time. ``rollout --cpu-smoke``
  runs ``generate`` and the same loop eager on the CPU with a tiny model (figures mean nothing).
- lora: full training against LoRA rank 8 and rank 64 (α = 2r, every linear layer, PEFT) of a
  random Qwen2 of Qwen2.5-0.5B's shape built from its config (hidden 896, 24 layers, 14 heads /
  2 KV heads, MLP 4864, vocabulary 151,936, tied embeddings: 494 M parameters), bf16, DeepSpeed
  ZeRO-``--zero-stage`` with FusedAdam: ``update_actor`` over one mini-batch of
  ``--lora-rows`` × (P + R) tokens; per variant, in a process of its own (so each peak is its
  own): the best of 3 steps after a warm-up, the peak GPU memory allocated, the trainable
  parameters and the optimizer state bytes; then the ratios LoRA ÷ full.
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

#: Qwen2.5-0.5B's shape (its config.json: the mfu and lora parts, bench/gpu_train.py), built at
#: random from a config: nothing is downloaded
QWEN_05B_CONFIG = dict(
    vocab_size=151936,
    hidden_size=896,
    intermediate_size=4864,
    num_hidden_layers=24,
    num_attention_heads=14,
    num_key_value_heads=2,
    max_position_embeddings=4096,
    tie_word_embeddings=True,
)
#: the ``--cpu-smoke`` shape: the script's path on a machine without a GPU
SMOKE_SHAPE = dict(QWEN_05B_CONFIG, vocab_size=512, hidden_size=64, intermediate_size=128,
                   num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1)  # fmt: skip
#: the rollout part's model: the shape of the first GPU check's rollout figures
MODEL_SHAPE = dict(
    hidden_size=1024,
    num_layers=24,
    num_heads=16,
    num_kv_heads=4,
    intermediate_size=4096,
    max_position_embeddings=4096,
)


def cuda_seconds(fn: Callable[[], object], warmup: int, repeats: int) -> float:
    """Best seconds of ``repeats`` calls of ``fn`` after ``warmup`` calls, timed with CUDA events."""
    for _ in range(warmup):
        fn()
    best = float("inf")
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        best = min(best, start.elapsed_time(end) / 1e3)
    return best


def peak_part(args: argparse.Namespace) -> list[str]:
    n = 8192
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    seconds = cuda_seconds(lambda: a @ b, warmup=3, repeats=10)
    tflops = 2 * n**3 / seconds / 1e12
    return [
        "## Peak bf16 matmul",
        f"- {n}³ bf16 matmul, best of 10: **{tflops:.0f} TFLOP/s** (datasheet dense bf16 ≈ 989)",
        f"<!-- peak_tflops={tflops:.1f} -->",
    ]


def build_model_dir(root: Path) -> Path:
    from stages.data.tiny_model import make_tiny_model

    return make_tiny_model(root / "model", **MODEL_SHAPE)


def non_embedding_params(model: torch.nn.Module) -> int:
    """Parameters outside the input embedding (the tied LM head counts once, as the embedding)."""
    embedding = model.get_input_embeddings().weight
    return sum(p.numel() for p in model.parameters() if p is not embedding)


def mfu_batch(rows: int, prompt: int, response: int, vocab: int, device: str = "cuda"):
    """Random rollout-shaped batch on ``device``: left-padded prompts, right-padded responses."""
    from tensordict import TensorDict

    from dataproto import DataProto

    gen = torch.Generator().manual_seed(0)
    prompt_lens = torch.randint(prompt // 2, prompt + 1, (rows,), generator=gen)
    response_lens = torch.randint(response // 2, response + 1, (rows,), generator=gen)
    cols = torch.arange(prompt + response)
    mask = (
        (cols >= prompt - prompt_lens[:, None]) & (cols < prompt + response_lens[:, None])
    ).long()
    ids = torch.randint(3, vocab, (rows, prompt + response), generator=gen).masked_fill(
        mask == 0, 0
    )
    response_mask = mask[:, prompt:]
    tensors = {
        "input_ids": ids,
        "attention_mask": mask,
        "position_ids": (mask.cumsum(-1) - 1).clamp(min=0),
        "responses": ids[:, prompt:],
        "response_mask": response_mask,
        "advantages": torch.randn(rows, response, generator=gen) * response_mask,
        "old_log_probs": (-5.0 + 0.3 * torch.randn(rows, response, generator=gen)) * response_mask,
    }
    td = TensorDict(tensors, batch_size=[rows]).to(device)
    return DataProto(batch=td, non_tensor_batch={}, meta_info={})


#: the MFU part's forward layouts (stages.engines.response_hidden.FORWARD_LAYOUTS): the padded
#: columns some row needs, and one packed row per micro-batch by a VARLEN_KERNELS kernel
MFU_LAYOUTS = ("trimmed", "packed")


def mfu_part(args: argparse.Namespace) -> list[str]:
    """The actor update's MFU at Qwen2.5-0.5B's shape (151,936-row vocabulary), padded and
    packed: 6·N (non-embedding N) and verl's estimate (``stages.metrics.flops``: LM head and
    attention counted, what ``perf/mfu/actor`` reports), each over the measured peak."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from stages.engines.actor import PPOUpdateSettings, update_actor
    from stages.engines.attention import varlen_kernel
    from stages.engines.batching import MicroBatching
    from stages.engines.deepspeed_setup import EngineSettings, initialize_engine
    from stages.engines.logprob import ResponseLogProbModel
    from stages.metrics.flops import DecoderShape, training_flops

    cuda = torch.cuda.is_available()
    shape = SMOKE_SHAPE if args.cpu_smoke else QWEN_05B_CONFIG
    rows, prompt, response = (
        (4, 8, 8) if args.cpu_smoke else (args.rows, args.prompt, args.response)
    )
    micro = min(args.micro, rows)
    dtype = torch.bfloat16 if cuda else torch.float32
    batch = mfu_batch(rows, prompt, response, shape["vocab_size"], "cuda" if cuda else "cpu")
    seq_lens = batch.batch["attention_mask"].sum(-1).tolist()
    tokens = sum(seq_lens)
    kernel = varlen_kernel(batch.batch.device, dtype)
    shape_name = "CPU smoke: a tiny shape" if args.cpu_smoke else "Qwen2.5-0.5B's shape"
    lines = [
        f"## Actor update MFU (DeepSpeed ZeRO-{args.zero_stage}, {dtype}, {shape_name})",
        f"- mini-batch: {rows} rows × ({prompt} + {response}), micro-batch {micro} rows, "
        f"{tokens} real tokens; best of 3 steps; packed attention kernel: "
        f"{'none (mask)' if kernel is None else kernel.run.__name__}",
    ]
    for layout in MFU_LAYOUTS:
        torch.manual_seed(0)
        with torch.device("cuda" if cuda else "cpu"):  # initialised where it trains
            lm = Qwen2ForCausalLM(Qwen2Config(**shape)).to(dtype)
        n_params = non_embedding_params(lm)
        flops = training_flops(DecoderShape.of(lm.config), seq_lens)
        engine = initialize_engine(
            ResponseLogProbModel(lm, layout),
            EngineSettings(zero_stage=args.zero_stage, dtype="bf16" if cuda else "fp32", lr=1e-6),
        )
        settings = PPOUpdateSettings(mini_batch_size=rows, micro=MicroBatching(micro))
        loss = {"clip_ratio": 0.2, "loss_agg_mode": "token-mean", "entropy_coeff": 0.0}
        step = functools.partial(update_actor, engine, batch, settings, loss)
        seconds = cuda_seconds(step, warmup=1, repeats=3) if cuda else timed(step)[0]
        six_n = 6 * n_params * tokens / seconds / 1e12
        verl = flops / seconds / 1e12
        memory = torch.cuda.max_memory_allocated() / 2**30 if cuda else float("nan")
        lines.append(
            f"- `{layout}`: {seconds:.3f} s, **{tokens / seconds:,.0f} tokens/s**; 6·N "
            f"(N = {n_params / 1e6:.0f} M) {six_n:.0f} TFLOP/s = **MFU {six_n / args.peak_tflops:.1%}**; "
            f"verl's estimate {verl:.0f} TFLOP/s = **{verl / args.peak_tflops:.1%}** of "
            f"{args.peak_tflops:.0f} TFLOP/s measured ({verl / 989:.1%} of 989); peak "
            f"allocated {memory:.1f} GiB"
        )
        del step, engine, lm
        gc.collect()
        if cuda:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
    return lines


def prompt_batch(rows: int, width: int, vocab: int, pad: int):
    from tensordict import TensorDict

    from dataproto import DataProto

    gen = torch.Generator().manual_seed(1)
    lengths = torch.randint(width // 2, width + 1, (rows,), generator=gen)
    mask = (torch.arange(width) >= width - lengths[:, None]).long()
    ids = torch.randint(3, vocab, (rows, width), generator=gen).masked_fill(mask == 0, pad)
    tensors = {
        "input_ids": ids,
        "attention_mask": mask,
        "position_ids": (mask.cumsum(-1) - 1).clamp(min=0),
    }
    return DataProto(
        batch=TensorDict(tensors, batch_size=[rows]), non_tensor_batch={}, meta_info={}
    )


def timed(fn: Callable[[], object]) -> tuple[float, object]:
    sync = torch.cuda.synchronize if torch.cuda.is_available() else lambda: None
    sync()
    start = time.perf_counter()
    out = fn()
    sync()
    return time.perf_counter() - start, out


def hf_rollout(model_dir: Path, prompts, settings, decode_path: str) -> tuple[float, int]:
    """One timed call of ``generate_sequences`` through the ``HF_DECODE_PATHS`` entry
    ``decode_path`` (bf16 on CUDA, fp32 on the CPU), after a warm-up call (which compiles and
    records the CUDA graphs on the compiled path)."""
    from stages.engines.hf_decode import release_decode_buffers
    from stages.engines.models import load_causal_lm
    from stages.engines.rollout_hf import HF_DECODE_PATHS, generate_sequences

    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = load_causal_lm(model_dir, dtype="bf16" if device == "cuda" else "float32").to(device)
    on_device = type(prompts)(batch=prompts.batch.to(device), non_tensor_batch={}, meta_info={})
    decode = HF_DECODE_PATHS.get(decode_path).run
    generate_sequences(model, on_device, settings, decode)  # warm-up
    seconds, out = timed(lambda: generate_sequences(model, on_device, settings, decode))
    release_decode_buffers(model)
    return seconds, int(out.batch["response_mask"].sum())


def vllm_rollout(model_dir: Path, prompts, settings, max_model_len: int) -> tuple[float, int]:
    from stages.engines.rollout_vllm import VLLMRollout

    with VLLMRollout(
        model_dir,
        dtype="bfloat16",
        max_model_len=max_model_len,
        gpu_memory_utilization=0.4,
        enforce_eager=True,
        seed=0,
    ) as engine:
        engine.generate_sequences(prompts, settings)  # warm-up
        seconds, out = timed(lambda: engine.generate_sequences(prompts, settings))
    return seconds, int(out.batch["response_mask"].sum())


#: the HF decode paths the rollout part times (``stages.engines.hf_decode``): today's
#: ``generate`` and the static-cache loop compiled into CUDA graphs; on the CPU (``--cpu-smoke``)
#: the same loop eager
HF_DECODE_PATHS_TIMED = {"cuda": ("generate", "cuda_graphs"), "cpu": ("generate", "static")}
#: the rollout part's ``--cpu-smoke`` model: the tiny model's default shape
SMOKE_ROLLOUT_SHAPE = dict(hidden_size=64, num_layers=2, num_heads=2, num_kv_heads=1,
                           intermediate_size=128)  # fmt: skip


def rollout_part(args: argparse.Namespace) -> list[str]:
    from stages.data.tiny_model import make_tiny_model
    from stages.data.tokenizer import build_tiny_tokenizer
    from stages.engines.rollout_hf import SamplingSettings

    tokenizer = build_tiny_tokenizer()
    rows, prompt, response = (
        (8, 16, 16) if args.cpu_smoke else (args.rows, args.prompt, args.response)
    )
    settings = SamplingSettings(
        response_length=response,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        temperature=1.0,
        seed=0,  # the warm-up call samples what the timed call does: the same batch sizes
    )
    prompts = prompt_batch(rows, prompt, len(tokenizer), tokenizer.pad_token_id)
    smoke = ", CPU smoke run: tiny shape, fp32, figures mean nothing" if args.cpu_smoke else ""
    lines = [
        f"## Rollout tokens/s (bf16, same prompts and sampling{smoke})",
        f"- {rows} prompts × P={prompt}, R ≤ {response}, temperature 1, seed 0; "
        "generated tokens (Σ response_mask) ÷ wall time of one call after a warm-up call (which "
        "compiles the `cuda_graphs` path's step and records its graphs)",
    ]
    paths = HF_DECODE_PATHS_TIMED["cuda" if torch.cuda.is_available() else "cpu"]
    with tempfile.TemporaryDirectory(prefix="ppoflow-gpu-") as root:
        shape = SMOKE_ROLLOUT_SHAPE if args.cpu_smoke else MODEL_SHAPE
        model_dir = make_tiny_model(Path(root) / "model", **shape)
        rates = {}
        for path in paths:
            seconds, tokens = hf_rollout(model_dir, prompts, settings, path)
            gc.collect()  # the HF model's memory back before the next one / vLLM sizes its cache
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
            rates[path] = tokens / seconds
            lines.append(
                f"- hf `{path}`: **{rates[path]:,.0f} tokens/s** ({tokens} tokens, {seconds:.2f} s)"
            )
        for path in paths[1:]:
            ratio = rates[path] / rates["generate"]
            lines.append(f"- hf `{path}` ÷ hf `generate`: **{ratio:.2f}×**")
        if args.cpu_smoke:
            return lines
        try:
            import vllm  # noqa: F401
        except ImportError as error:
            lines.append(f"- vllm: not measured, vllm does not import here ({error})")
            return lines
        v_s, v_tokens = vllm_rollout(model_dir, prompts, settings, prompt + response)
    lines.append(
        f"- vllm (eager): **{v_tokens / v_s:,.0f} tokens/s** ({v_tokens} tokens, {v_s:.2f} s)"
    )
    lines.append(f"- vllm ÷ hf `generate`: **{(v_tokens / v_s) / rates['generate']:.1f}×**")
    return lines


LORA_RANKS = {"full": 0, "lora-r8": 8, "lora-r64": 64}


def lora_variant(args: argparse.Namespace) -> dict[str, float]:
    """One variant of the lora part in this process: step time, peak memory, optimizer bytes."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from stages.engines.actor import PPOUpdateSettings, update_actor
    from stages.engines.adapters import AdapterSettings, with_adapters
    from stages.engines.batching import MicroBatching
    from stages.engines.deepspeed_setup import EngineSettings, initialize_engine
    from stages.engines.logprob import ResponseLogProbModel

    cuda = torch.cuda.is_available()
    device, dtype = ("cuda", "bf16") if cuda else ("cpu", "float32")
    shape = SMOKE_SHAPE if args.cpu_smoke else QWEN_05B_CONFIG
    torch.manual_seed(0)
    with torch.device(device):
        lm = Qwen2ForCausalLM(Qwen2Config(**shape)).to(torch.bfloat16 if cuda else torch.float32)
    rank = LORA_RANKS[args.lora_variant]
    if rank:
        settings = AdapterSettings(
            variant="lora", rank=rank, alpha=2.0 * rank, dropout=0.0, target_modules="all-linear",
            exclude_modules=None, adapter_path=None, init_a="kaiming", keys="bench",
        )  # fmt: skip
        lm = with_adapters(lm, settings, "CAUSAL_LM")
    engine = initialize_engine(
        ResponseLogProbModel(lm),
        EngineSettings(zero_stage=args.zero_stage, dtype=dtype, lr=1e-5),
    )
    rows = 4 if args.cpu_smoke else args.lora_rows
    prompt, response = (8, 8) if args.cpu_smoke else (args.prompt, args.response)
    batch = mfu_batch(rows, prompt, response, shape["vocab_size"], device)
    settings = PPOUpdateSettings(
        mini_batch_size=rows, micro=MicroBatching(micro_batch_size=min(args.micro, rows))
    )
    loss = {"clip_ratio": 0.2, "loss_agg_mode": "token-mean", "entropy_coeff": 0.0}
    step = lambda: update_actor(engine, batch, settings, loss)  # noqa: E731
    if cuda:
        torch.cuda.reset_peak_memory_stats()
        seconds = cuda_seconds(step, warmup=1, repeats=3)
        peak = torch.cuda.max_memory_allocated()
    else:
        step()
        start = time.perf_counter()
        step()
        seconds, peak = time.perf_counter() - start, 0
    optimizer = engine.optimizer
    while not isinstance(optimizer, torch.optim.Optimizer):
        optimizer = optimizer.optimizer
    state = [t for s in optimizer.state.values() for t in s.values() if torch.is_tensor(t)]
    return {
        "params": sum(p.numel() for p in lm.parameters()),
        "trainable": sum(p.numel() for p in lm.parameters() if p.requires_grad),
        "seconds": seconds,
        "peak_gib": peak / 2**30,
        "optimizer_gib": sum(t.numel() * t.element_size() for t in state) / 2**30,
        "tokens": int(batch.batch["attention_mask"].sum()),
    }


def lora_part(args: argparse.Namespace) -> list[str]:
    if not (torch.cuda.is_available() or args.cpu_smoke):
        return [
            "## LoRA vs full training",
            "- skipped: no CUDA device (torch.cuda.is_available() is False)",
        ]
    runs = {}
    for variant in LORA_RANKS:
        command = [
            sys.executable, __file__, "lora", "--report", os.devnull, "--lora-variant", variant,
            "--zero-stage", str(args.zero_stage), "--lora-rows", str(args.lora_rows),
            "--prompt", str(args.prompt), "--response", str(args.response),
            "--micro", str(args.micro), *(["--cpu-smoke"] if args.cpu_smoke else []),
        ]  # fmt: skip
        done = subprocess.run(command, capture_output=True, text=True, timeout=600)
        found = [line for line in done.stdout.splitlines() if line.startswith("LORA ")]
        if done.returncode or not found:
            tail = " | ".join(done.stderr.strip().splitlines()[-3:])[-400:]
            runs[variant] = {"error": tail or f"exit status {done.returncode}"}
        else:
            runs[variant] = json.loads(found[-1].removeprefix("LORA "))
    full = runs["full"]
    device = "CPU smoke run (tiny shape: figures mean nothing)" if args.cpu_smoke else "bf16"
    shape_name = "a tiny shape" if args.cpu_smoke else "Qwen2.5-0.5B's shape"
    lines = [
        f"## LoRA vs full training (DeepSpeed ZeRO-{args.zero_stage}, {device})",
        f"- model: random Qwen2 of {shape_name}, {full.get('params', 0) / 1e6:.1f} M "
        f"parameters; mini-batch {full.get('tokens', 0)} tokens, "
        f"{'one step after a warm-up' if args.cpu_smoke else 'best of 3 steps'}",
        "",
        "| variant | trainable | step s | peak GPU GiB | optimizer state GiB |",
        "|---|---|---|---|---|",
    ]
    for variant, got in runs.items():
        if "error" in got:
            lines.append(f"| {variant} | failed: {got['error']} | | | |")
            continue
        lines.append(
            f"| {variant} | {got['trainable'] / 1e6:.2f} M | {got['seconds']:.3f} | "
            f"{got['peak_gib']:.2f} | {got['optimizer_gib']:.3f} |"
        )
    for variant, got in runs.items():
        if variant != "full" and "error" not in got and "error" not in full:
            memory = (
                f", peak memory {got['peak_gib'] / full['peak_gib']:.2f}"
                if full["peak_gib"]
                else ""
            )
            lines.append(
                f"- {variant} ÷ full: step time {got['seconds'] / full['seconds']:.2f}{memory}"
            )
    return lines


PARTS = {"peak": peak_part, "mfu": mfu_part, "rollout": rollout_part, "lora": lora_part}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("part", choices=sorted(PARTS))
    parser.add_argument("--report", type=Path, required=True, help="markdown file to append to")
    parser.add_argument("--peak-tflops", type=float, default=788.0, help="MFU denominator")
    parser.add_argument("--zero-stage", type=int, default=2)
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--prompt", type=int, default=512)
    parser.add_argument("--response", type=int, default=512)
    parser.add_argument("--micro", type=int, default=16, help="rows per micro-batch (mfu, lora)")
    parser.add_argument("--lora-rows", type=int, default=32, help="mini-batch rows (lora)")
    parser.add_argument(
        "--cpu-smoke", action="store_true", help="lora / rollout / mfu on the CPU, tiny shape"
    )
    parser.add_argument("--lora-variant", choices=sorted(LORA_RANKS), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.lora_variant:  # one variant of the lora part, in a process of its own
        print("LORA " + json.dumps(lora_variant(args)), flush=True)
        return
    runs_on_cpu = args.part == "lora" or (args.cpu_smoke and args.part in ("rollout", "mfu"))
    if not torch.cuda.is_available() and not runs_on_cpu:
        raise SystemExit("gpu_check.py needs CUDA: torch.cuda.is_available() is False")
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    lines = PARTS[args.part](args)
    text = "\n".join(lines) + "\n\n"
    print(text, flush=True)
    with args.report.open("a") as report:
        report.write(text)


if __name__ == "__main__":
    main()
