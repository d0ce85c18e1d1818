"""LoRA against full training on the CPU: memory, step time, optimizer state, checkpoint bytes,
the reference policy, and the weight sync into vLLM (merged weights, or vLLM's LoRA slot).

    .venv-vllm/bin/python bench/lora.py [--pairs 3] [--steps 3] [--sync-pairs 5] [--threads 1]
    .venv-vllm/bin/python bench/lora.py --small      # the tiny model, 1 pair: a smoke run

(``.venv/bin/python`` runs the training part and reports the vLLM part as not measured.)

Model: ``make_tiny_model`` at the ``100m`` shape of ``bench/weight_sync.py`` — Qwen2, hidden 768,
16 layers, 12 heads / 4 KV heads, MLP 2048, the tiny tokenizer's vocabulary, tied embeddings:
100.9M parameters, fp32. Variants: ``full`` (``lora_rank`` 0), ``lora-r8`` (rank 8, α 16) and
``lora-r64`` (rank 64, α 128), adapters on every linear layer (``all-linear``), each an
``ActorWorker`` on DeepSpeed ZeRO-0 fp32 with AdamW, as ``ppoflow train`` builds it from
``configs/demo-cpu.yaml``.

Training part. Each pair runs every variant once, each in a fresh interpreter, the order rotating
from pair to pair (so no variant always runs first, or after the same one). In it: the actor is
built; one warm-up update, then ``--steps`` timed updates of B=8 rows × (P=32 + R=32) tokens
(micro-batches of 4 rows, one optimizer step per update). Measured: the resident set after the
build, and its peak during the updates (warm-up included: AdamW's state and the gradients appear
at the first step) above that level, sampled every 2 ms; the median update time; the bytes of the
optimizer's state tensors and the trainable parameters; the bytes ``save_checkpoint`` writes. For
full training also the reference policy a KL term needs — a ``RefWorker``, a second model: the
resident set its build and one log-prob pass add, and its parameter bytes. LoRA's reference is the actor's own module
with its adapters off (``derived.reference_in_actor``): no second model, nothing to measure.

Sync part (vLLM's CPU build, the engine in-process, fp32; the first interpreter that imports vllm
is a child, so the training part's figures are not affected). ``merged``: one engine on the base;
``sync_weights`` of the full model's parameters (what a full-training actor sends) alternating with
``merged_named_weights`` of the rank-8 and rank-64 PEFT models (what a LoRA actor sends: the base
with W + (α/r)·B·A merged, computed on the fly), ``--sync-pairs`` rounds after one warm-up each.
``slot``: an engine built with ``enable_lora`` (``max_lora_rank`` 64); a sync is PEFT's
``save_pretrained`` of the adapters into a fresh directory plus ``add_lora`` of a new
``LoRARequest`` (the previous one removed), rank 8 and 64 alternating. Every sync, on either
engine, ends with one 1-token request (the slot's adapter is put in place at its first request),
so a sync is timed up to the first token it serves. Each engine also decodes 8 prompts greedily,
32 tokens each, after its last sync (rank 8), 3 times after a warm-up: the tokens are compared
with transformers' greedy decoding of the rank-8 PEFT model (``equal``), and the median wall
time gives the decode tokens/s (a LoRA slot computes its adapters at every token; merged weights
cost nothing there). A part vLLM cannot run is reported with its error.

Printed: per variant the medians, per pair the ratios against full training (median and range),
the load average before and after, the thread count.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

SHAPE = {  # bench/weight_sync.py's 100m
    "hidden_size": 768,
    "num_layers": 16,
    "num_heads": 12,
    "num_kv_heads": 4,
    "intermediate_size": 2048,
}
VARIANTS = {"full": (0, 16), "lora-r8": (8, 16), "lora-r64": (64, 128)}  # rank, alpha
ROWS, PROMPT, RESPONSE, MICRO = 8, 32, 32, 4
DECODE_ROWS, DECODE_TOKENS = 8, 32


def rss() -> int:
    import psutil

    return psutil.Process().memory_info().rss


def worker_config(model_dir: str, variant: str, *extra: str) -> Any:
    from stages.config import load_config

    rank, alpha = VARIANTS[variant]
    return load_config(
        REPO / "configs" / "demo-cpu.yaml",
        [
            f"actor_rollout_ref.model.path={model_dir}",
            f"actor_rollout_ref.model.lora_rank={rank}",
            f"actor_rollout_ref.model.lora_alpha={alpha}",
            "actor_rollout_ref.model.target_modules=all-linear",
            "actor_rollout_ref.actor.zero_stage=0",
            f"data.train_batch_size={ROWS}",
            "actor_rollout_ref.rollout.n=1",
            "algorithm.adv_estimator=reinforce_plus_plus",  # rows of their own (n = 1)
            f"actor_rollout_ref.actor.ppo_mini_batch_size={ROWS}",  # one optimizer step
            f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={MICRO}",
            f"actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu={MICRO}",
            *extra,
        ],
    )


def update_batch(vocab: int) -> Any:
    """B rows of P prompt + R response tokens (all real), random advantages and old log-probs."""
    import torch
    from tensordict import TensorDict

    from dataproto import DataProto

    gen = torch.Generator().manual_seed(0)
    mask = torch.ones(ROWS, PROMPT + RESPONSE, dtype=torch.long)
    ids = torch.randint(3, vocab, (ROWS, PROMPT + RESPONSE), generator=gen)
    tensors = {
        "input_ids": ids,
        "attention_mask": mask,
        "position_ids": (mask.cumsum(-1) - 1).clamp(min=0),
        "prompts": ids[:, :PROMPT],
        "responses": ids[:, PROMPT:],
        "response_mask": mask[:, PROMPT:],
        "advantages": torch.randn(ROWS, RESPONSE, generator=gen),
        "old_log_probs": -5.0 + 0.3 * torch.randn(ROWS, RESPONSE, generator=gen),
    }
    return DataProto(TensorDict(tensors, [ROWS]), {}, {"temperature": 1.0})


def torch_optimizer(optimizer: Any) -> Any:
    """The ``torch.optim.Optimizer`` inside DeepSpeed's optimizer wrappers."""
    import torch

    while not isinstance(optimizer, torch.optim.Optimizer):
        optimizer = optimizer.optimizer
    return optimizer


def tensor_bytes(tensors: Any) -> int:
    import torch

    return sum(t.numel() * t.element_size() for t in tensors if isinstance(t, torch.Tensor))


def dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


# --- the training part: one variant in this interpreter ---------------------------------------


def train_child(model_dir: str, variant: str, steps: int, threads: int) -> dict[str, Any]:
    import torch
    from transformers.utils import logging as hf_logging

    from bench.weight_sync import PeakTreeRSS
    from stages.engines.roles import ActorWorker, RefWorker

    hf_logging.set_verbosity_error()
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    worker = ActorWorker(worker_config(model_dir, variant), total_training_steps=steps + 1)
    built = rss()
    batch = update_batch(worker.lm.config.vocab_size)
    seconds = []
    with PeakTreeRSS() as memory:
        worker.update_actor(batch)  # warm-up: AdamW's state and the gradients appear here
        for _ in range(steps):
            start = time.perf_counter()
            worker.update_actor(batch)
            seconds.append(time.perf_counter() - start)
    optimizer = torch_optimizer(worker.engine.optimizer)
    state = [t for per_param in optimizer.state.values() for t in per_param.values()]
    out = {
        "params": sum(p.numel() for p in worker.lm.parameters()),
        "trainable": sum(p.numel() for p in worker.lm.parameters() if p.requires_grad),
        "rss_built_mib": built / 2**20,
        "update_peak_mib": memory.above_base_mib,
        "step_s": statistics.median(seconds),
        "optimizer_bytes": tensor_bytes(state),
    }
    with tempfile.TemporaryDirectory(prefix="ppoflow-bench-lora-") as tmp:
        start = time.perf_counter()
        saved = Path(worker.save_checkpoint(str(Path(tmp) / "actor")))
        out["checkpoint_s"] = time.perf_counter() - start
        out["checkpoint_bytes"] = dir_bytes(saved)
    if variant == "full":  # the second model a KL term needs; LoRA's is the actor, adapters off
        before = rss()
        ref = RefWorker(
            worker_config(model_dir, variant, "actor_rollout_ref.actor.use_kl_loss=true")
        )
        ref.compute_ref_log_prob(batch)  # its weights are paged in by the first pass
        out["reference_rss_mib"] = (rss() - before) / 2**20
        out["reference_bytes"] = tensor_bytes(ref.model.parameters())
    return out


# --- the sync part: vLLM in this interpreter ---------------------------------------------------


def adapted_models(model_dir: str) -> dict[str, Any]:
    """The base (fp32) and the rank-8 / rank-64 PEFT models on copies of it, ``lora_B`` drawn
    at random (trained-looking adapters: B starts at zero)."""
    import torch
    from peft import LoraConfig, get_peft_model

    from stages.engines.models import load_causal_lm

    models = {"full": load_causal_lm(model_dir, dtype="float32").eval()}
    for variant in ("lora-r8", "lora-r64"):
        rank, alpha = VARIANTS[variant]
        peft = get_peft_model(
            load_causal_lm(model_dir, dtype="float32"),
            LoraConfig(r=rank, lora_alpha=alpha, target_modules="all-linear"),
        ).eval()
        torch.manual_seed(rank)
        with torch.no_grad():
            for name, param in peft.named_parameters():
                if ".lora_B." in name:
                    param.normal_(0, 0.02)
        models[variant] = peft
    return models


def decode_prompts(vocab: int) -> list[list[int]]:
    import torch

    gen = torch.Generator().manual_seed(1)
    return torch.randint(3, vocab, (DECODE_ROWS, 16), generator=gen).tolist()


def hf_greedy(model: Any, prompts: list[list[int]]) -> list[list[int]]:
    """Transformers' greedy decoding of each prompt, DECODE_TOKENS tokens, EOS ignored."""
    import torch

    with torch.no_grad():
        out = model.generate(
            input_ids=torch.tensor(prompts), attention_mask=torch.ones(len(prompts), 16).long(),
            do_sample=False, max_new_tokens=DECODE_TOKENS, min_new_tokens=DECODE_TOKENS,
            pad_token_id=0,
        )  # fmt: skip
    return out[:, 16:].tolist()


def vllm_decode(
    llm: Any, prompts: list[list[int]], lora: Any = None, tokens: int = DECODE_TOKENS
) -> tuple[list, float]:
    """vLLM's greedy tokens of each prompt (EOS ignored) and the wall time of the call."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    params = SamplingParams(temperature=0.0, max_tokens=tokens, ignore_eos=True)
    start = time.perf_counter()
    done = llm.generate(
        [TokensPrompt(prompt_token_ids=p) for p in prompts], params, lora_request=lora,
        use_tqdm=False,
    )  # fmt: skip
    return [list(o.outputs[0].token_ids) for o in done], time.perf_counter() - start


def sync_child(model_dir: str, kind: str, pairs: int, threads: int) -> dict[str, Any]:
    import torch

    from bench.weight_sync import PeakTreeRSS
    from stages.engines.adapters import merged_named_weights
    from stages.engines.rollout_vllm import VLLMRollout

    torch.set_num_threads(threads)
    models = adapted_models(model_dir)
    prompts = decode_prompts(models["full"].config.vocab_size)
    expected = hf_greedy(models["lora-r8"], prompts)
    scratch = Path(tempfile.mkdtemp(prefix="ppoflow-bench-lora-slot-"))
    engine_kwargs = (
        {"enable_lora": True, "max_lora_rank": 64, "max_loras": 1} if kind == "slot" else {}
    )
    state: dict[str, Any] = {"id": 0}

    def merged(rollout: Any, variant: str) -> None:
        model = models[variant]
        named = model.named_parameters() if variant == "full" else merged_named_weights(model)
        rollout.sync_weights(named)
        vllm_decode(rollout.llm, prompts[:1], None, tokens=1)  # the first token after it

    def slot(rollout: Any, variant: str) -> None:
        from vllm.lora.request import LoRARequest

        engine, previous = rollout.llm.llm_engine, state["id"]
        state["id"] += 1
        path = scratch / f"adapter-{state['id']}"
        models[variant].save_pretrained(str(path))
        state["request"] = LoRARequest(f"adapter-{state['id']}", state["id"], str(path))
        engine.add_lora(state["request"])
        if previous:
            engine.remove_lora(previous)
        vllm_decode(rollout.llm, prompts[:1], state["request"], tokens=1)  # puts it in the slot

    sync, sides = (slot, ("lora-r8", "lora-r64")) if kind == "slot" else (merged, tuple(VARIANTS))
    results: dict[str, Any] = {side: {"s": [], "peak_mib": []} for side in sides}
    with VLLMRollout(
        model_dir, dtype="float32", max_model_len=256, kv_cache_memory_bytes=256 << 20,
        enforce_eager=True, seed=0, engine_kwargs=engine_kwargs,
    ) as rollout:  # fmt: skip
        for side in sides:  # warm-up
            sync(rollout, side)
        for pair in range(pairs):
            for side in sides if pair % 2 == 0 else sides[::-1]:
                with PeakTreeRSS() as memory:
                    start = time.perf_counter()
                    sync(rollout, side)
                    results[side]["s"].append(time.perf_counter() - start)
                results[side]["peak_mib"].append(memory.above_base_mib)
        sync(rollout, "lora-r8")  # the engine serves the rank-8 adapters for the decode check
        lora = state.get("request")
        vllm_decode(rollout.llm, prompts, lora)  # warm-up
        decodes = [vllm_decode(rollout.llm, prompts, lora) for _ in range(3)]
    results["decode"] = {
        "equal": all(tokens == expected for tokens, _ in decodes),
        "tokens_per_s": DECODE_ROWS * DECODE_TOKENS / statistics.median(s for _, s in decodes),
    }
    return results


# --- the driver --------------------------------------------------------------------------------


def run_child(*args: str) -> dict[str, Any]:
    """``bench/lora.py --child ARGS…`` in a fresh interpreter; its RESULT line, or the error."""
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    done = subprocess.run(
        [sys.executable, __file__, "--child", *args],
        env=env, capture_output=True, text=True, timeout=3600,
    )  # fmt: skip
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode != 0 or not lines:
        tail = [line for line in done.stderr.strip().splitlines() if line.strip()][-3:]
        return {"error": " | ".join(tail)[-600:] or f"exit status {done.returncode}"}
    return json.loads(lines[-1].removeprefix("RESULT "))


def ratio_text(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} ({min(values):.2f}–{max(values):.2f})"


def report_training(runs: dict[str, list[dict[str, Any]]]) -> None:
    full = runs["full"]
    print(
        f"{'variant':>9} {'trainable':>11} {'built MiB':>10} {'update peak MiB':>16} "
        f"{'step s':>8} {'optimizer MiB':>14} {'checkpoint MiB':>15}"
    )
    for variant, got in runs.items():
        med = {key: statistics.median(r[key] for r in got) for key in got[0] if key != "params"}
        print(
            f"{variant:>9} {med['trainable'] / 1e6:10.2f}M {med['rss_built_mib']:10.0f} "
            f"{med['update_peak_mib']:16.0f} {med['step_s']:8.2f} "
            f"{med['optimizer_bytes'] / 2**20:14.2f} {med['checkpoint_bytes'] / 2**20:15.2f}"
        )
    for variant, got in runs.items():
        if variant == "full":
            continue
        per_pair = {
            key: [r[key] / f[key] for r, f in zip(got, full)]
            for key in ("step_s", "update_peak_mib", "optimizer_bytes", "checkpoint_bytes")
        }
        print(
            f"{variant} ÷ full, per pair median (range): step time {ratio_text(per_pair['step_s'])}, "
            f"update peak {ratio_text(per_pair['update_peak_mib'])}, optimizer state "
            f"{ratio_text(per_pair['optimizer_bytes'])}, checkpoint "
            f"{ratio_text(per_pair['checkpoint_bytes'])}"
        )
    ref_mib = statistics.median(r["reference_rss_mib"] for r in full)
    ref_bytes = statistics.median(r["reference_bytes"] for r in full)
    print(
        f"reference policy: full training builds a second model, {ref_bytes / 2**20:.0f} MiB of "
        f"parameters (+{ref_mib:.0f} MiB resident); LoRA: the actor with its adapters off, 0 bytes"
    )
    print(
        f"{full[0]['params'] / 1e6:.1f}M parameters (fp32, {full[0]['params'] * 4 / 2**20:.0f} MiB)"
    )


def report_sync(merged: dict[str, Any], slot: dict[str, Any]) -> None:
    for kind, got in (("merged", merged), ("slot", slot)):
        if "error" in got:
            print(f"{kind:>7}: not measured: {got['error']}")
            continue
        for side, values in got.items():
            if side == "decode":
                continue
            print(
                f"{kind:>7} {side:>9} sync s {statistics.median(values['s']):7.3f} "
                f"peak MiB {statistics.median(values['peak_mib']):7.1f}"
            )
        decode = got["decode"]
        print(
            f"{kind:>7} decode after the rank-8 sync: {decode['tokens_per_s']:.0f} tokens/s, "
            f"greedy = HF greedy of the PEFT model: {decode['equal']}"
        )
    if "error" not in merged:
        full = merged["full"]["s"]
        for side in ("lora-r8", "lora-r64"):
            ratios = [a / b for a, b in zip(merged[side]["s"], full)]
            print(f"merged {side} ÷ full sync time, per pair: {ratio_text(ratios)}")
    if "error" not in merged and "error" not in slot:
        for side in ("lora-r8", "lora-r64"):
            ratios = [a / b for a, b in zip(slot[side]["s"], merged[side]["s"])]
            print(f"slot ÷ merged {side} sync time, per pair: {ratio_text(ratios)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=3, help="rounds of the training part")
    parser.add_argument("--steps", type=int, default=3, help="timed updates per run")
    parser.add_argument("--sync-pairs", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--skip-sync", action="store_true", help="the training part only")
    parser.add_argument("--small", action="store_true", help="the tiny model: a smoke run")
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        part, model_dir, name, count = args.child
        child = train_child if part == "train" else sync_child
        print("RESULT " + json.dumps(child(model_dir, name, int(count), args.threads)))
        return

    from stages.data.tiny_model import make_tiny_model

    load_before = os.getloadavg()
    order = list(VARIANTS)
    runs: dict[str, list[dict[str, Any]]] = {variant: [] for variant in order}
    with tempfile.TemporaryDirectory(prefix="ppoflow-bench-lora-") as tmp:
        model_dir = str(make_tiny_model(Path(tmp) / "model", **({} if args.small else SHAPE)))
        for pair in range(args.pairs):
            rotated = order[pair % len(order) :] + order[: pair % len(order)]
            for variant in rotated:
                got = run_child(
                    "train", model_dir, variant, str(args.steps), "--threads", str(args.threads)
                )
                if "error" in got:
                    raise SystemExit(f"{variant}: {got['error']}")
                runs[variant].append(got)
                print(f"pair {pair + 1} {variant}: {got['step_s']:.2f} s/step", flush=True)
        report_training(runs)
        if importlib.util.find_spec("vllm") is None:
            print("sync: not measured, vllm is not installed here (run it with .venv-vllm)")
        elif not args.skip_sync:
            threads = ("--threads", str(args.threads))
            merged = run_child("sync", model_dir, "merged", str(args.sync_pairs), *threads)
            slot = run_child("sync", model_dir, "slot", str(args.sync_pairs), *threads)
            report_sync(merged, slot)
    load_after = os.getloadavg()
    print(
        f"load average {load_before[0]:.2f} before, {load_after[0]:.2f} after (1 min); "
        f"{args.threads} torch thread(s), {os.cpu_count()} cores; B={ROWS} × ({PROMPT} + "
        f"{RESPONSE}), micro {MICRO}, ZeRO-0 fp32 AdamW"
    )


if __name__ == "__main__":
    main()
