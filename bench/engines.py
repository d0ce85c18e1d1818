"""Time ppoflow's engine passes against plain PyTorch / Hugging Face baselines on the CPU.

Run from the repository root:

    .venv/bin/python bench/engines.py                  # B=64 rows × (P=64 + R=128), the full run
    .venv/bin/python bench/engines.py --small          # B=16 × (16 + 32), a smoke run
    .venv/bin/python bench/engines.py --threads 4      # torch intra-op threads (printed)
    .venv/bin/python bench/engines.py --only update --shape 256,9,16,256 --models tiny
                                                       # the demo's step: 256 rows × (9 + 16), one micro-batch

Cases, each on two random-init Qwen2 models — ``tiny`` (``make_tiny_model``: hidden 128, 2 layers,
vocab 261) and ``qwen2-256`` (hidden 256, 4 layers, vocab 1024) — with the baseline measured in
the same run on the same inputs (best of k wall-clock runs, ``time.perf_counter``, after a warm-up, ours and the
baseline timed alternately):

1. log-prob: ``stages.engines.actor.compute_log_prob`` on a ``ResponseLogProbModel``, micro-batched,
   vs a plain HF forward + log_softmax + gather on the same micro-batches (target ≥ 0.95×).
2. update: ``update_actor`` on a DeepSpeed ZeRO-0 fp32 engine (one mini-batch = one optimizer step)
   vs a plain torch AdamW loop (forward, ``compute_actor_loss`` vanilla token-mean, backward,
   gradient clipping, step) on the same micro-batches (target ≥ 0.9×).
3. rollout: ``rollout_hf.generate_sequences`` with all rows in one batch vs ``model.generate`` one
   prompt at a time (target ≥ 5×). Both generate exactly R tokens per row (``min_new_tokens``).

tokens/s counts the non-padding tokens of the batch (log-prob, update) or the generated tokens
(rollout). The ratio is ours ÷ baseline throughput (higher is better).
"""

from __future__ import annotations

import argparse
import copy
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tensordict import TensorDict
from transformers.utils import logging as hf_logging

from dataproto import DataProto
from stages.algos.actor_loss import compute_actor_loss
from stages.engines.actor import PPOUpdateSettings, compute_log_prob, update_actor
from stages.engines.batching import MicroBatching, global_batch_info
from stages.engines.deepspeed_setup import EngineSettings, initialize_engine
from stages.engines.logprob import ResponseLogProbModel
from stages.engines.models import load_causal_lm
from stages.engines.rollout_hf import SamplingSettings, generate_sequences

LOSS_CONFIG = {"clip_ratio": 0.2, "loss_agg_mode": "token-mean", "entropy_coeff": 0.0}
TARGETS = {"log-prob": 0.95, "update": 0.9, "rollout": 5.0}


@dataclass(frozen=True)
class Shape:
    """B rows of P prompt + R response tokens; micro: rows per micro-batch."""

    rows: int
    prompt: int
    response: int
    micro: int


def best_of_pair(
    ours: Callable[[], object], baseline: Callable[[], object], repeats: int
) -> tuple[float, float]:
    """Best wall-clock seconds of ``repeats`` calls of each, after one warm-up call of each.

    The two are timed alternately, so a load change on a shared machine hits both alike.
    """
    ours(), baseline()
    best = [float("inf"), float("inf")]
    for _ in range(repeats):
        for slot, fn in enumerate((ours, baseline)):
            start = time.perf_counter()
            fn()
            best[slot] = min(best[slot], time.perf_counter() - start)
    return best[0], best[1]


def write_models(root: Path) -> dict[str, Path]:
    """The two benchmark models as Hugging Face directories under ``root``."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from stages.data.tiny_model import make_tiny_model

    tiny = make_tiny_model(root / "tiny")
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=1024,
        hidden_size=256,
        intermediate_size=704,
        num_hidden_layers=4,
        num_attention_heads=8,
        num_key_value_heads=4,
        max_position_embeddings=1024,
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    Qwen2ForCausalLM(config).save_pretrained(root / "qwen2-256")
    return {"tiny": tiny, "qwen2-256": root / "qwen2-256"}


def rollout_batch(shape: Shape, vocab: int, pad: int, seed: int = 0) -> DataProto:
    """Left-padded prompts ‖ right-padded responses of random lengths, advantages, old log-probs.

    Token ids are drawn from [3, vocab) so no special id appears inside a sequence.
    """
    gen = torch.Generator().manual_seed(seed)
    B, P, R = shape.rows, shape.prompt, shape.response
    prompt_lens = torch.randint(P // 2, P + 1, (B,), generator=gen)
    response_lens = torch.randint(R // 2, R + 1, (B,), generator=gen)
    columns = torch.arange(P + R)
    attention_mask = (
        (columns >= P - prompt_lens[:, None]) & (columns < P + response_lens[:, None])
    ).long()  # (B, T)
    input_ids = torch.randint(3, vocab, (B, P + R), generator=gen).masked_fill(
        attention_mask == 0, pad
    )
    response_mask = attention_mask[:, P:]
    tensors = {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "position_ids": (attention_mask.cumsum(-1) - 1).clamp(min=0),
        "prompts": input_ids[:, :P],
        "responses": input_ids[:, P:],
        "response_mask": response_mask,
        "advantages": torch.randn(B, R, generator=gen) * response_mask,
        "old_log_probs": (-5.0 + 0.3 * torch.randn(B, R, generator=gen)) * response_mask,
    }
    return DataProto(batch=TensorDict(tensors, batch_size=[B]), non_tensor_batch={}, meta_info={})


def plain_logprobs(model, micro: TensorDict) -> torch.Tensor:
    """(b, R) log-probs from a full HF forward: logits at every position, log_softmax, gather."""
    R = micro["responses"].shape[1]
    logits = model(
        input_ids=micro["input_ids"],
        attention_mask=micro["attention_mask"],
        position_ids=micro["position_ids"],
    ).logits[:, -R - 1 : -1]  # (b, R, V)
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    return logprobs.gather(-1, micro["responses"].unsqueeze(-1)).squeeze(-1)


def logprob_case(
    model_dir: Path, batch: DataProto, shape: Shape, repeats: int
) -> tuple[float, float]:
    """Seconds (ours, baseline) of one log-prob pass over the batch."""
    model = load_causal_lm(model_dir).eval()
    wrapped = ResponseLogProbModel(model)
    micro = MicroBatching(micro_batch_size=shape.micro)
    chunks = [batch.batch[i : i + shape.micro] for i in range(0, shape.rows, shape.micro)]

    @torch.no_grad()
    def baseline() -> None:
        for chunk in chunks:
            plain_logprobs(model, chunk)

    return best_of_pair(lambda: compute_log_prob(wrapped, batch, micro), baseline, repeats)


def update_case(
    model_dir: Path, batch: DataProto, shape: Shape, repeats: int
) -> tuple[float, float]:
    """Seconds (ours, baseline) of one PPO optimizer step over the whole batch (one mini-batch)."""
    lm = load_causal_lm(model_dir)
    plain = copy.deepcopy(lm).train()
    engine = initialize_engine(
        ResponseLogProbModel(lm), EngineSettings(zero_stage=0, dtype="float32", lr=1e-6)
    )
    settings = PPOUpdateSettings(
        mini_batch_size=shape.rows, micro=MicroBatching(micro_batch_size=shape.micro)
    )
    optimizer = torch.optim.AdamW(plain.parameters(), lr=1e-6, weight_decay=0.01)
    tensors = batch.batch
    chunks = [tensors[i : i + shape.micro] for i in range(0, shape.rows, shape.micro)]

    def baseline() -> None:
        info = global_batch_info(tensors["response_mask"])
        for chunk in chunks:
            loss, _ = compute_actor_loss(
                plain_logprobs(plain, chunk),
                chunk["old_log_probs"],
                chunk["advantages"],
                chunk["response_mask"],
                LOSS_CONFIG,
                global_batch_info=info,
            )
            loss.backward()
        torch.nn.utils.clip_grad_norm_(plain.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return best_of_pair(
        lambda: update_actor(engine, batch, settings, LOSS_CONFIG), baseline, repeats
    )


def rollout_case(
    model_dir: Path, batch: DataProto, shape: Shape, repeats: int
) -> tuple[float, float]:
    """Seconds (ours, baseline) to generate R tokens for each of the B prompts."""
    model = load_causal_lm(model_dir).eval()
    config = model.config
    settings = SamplingSettings(
        response_length=shape.response,
        eos_token_id=config.eos_token_id,
        pad_token_id=config.pad_token_id,
        temperature=1.0,
    )
    P = shape.prompt
    prompt_mask = batch.batch["attention_mask"][:, :P]
    prompts = DataProto(
        batch=TensorDict(
            {
                "input_ids": batch.batch["input_ids"][:, :P],
                "attention_mask": prompt_mask,
                "position_ids": (prompt_mask.cumsum(-1) - 1).clamp(min=0),
            },
            batch_size=[shape.rows],
        ),
        non_tensor_batch={},
        meta_info={},
    )
    singles = [row[mask.bool()][None] for row, mask in zip(prompts.batch["input_ids"], prompt_mask)]

    @torch.no_grad()
    def baseline() -> None:
        for ids in singles:
            model.generate(
                input_ids=ids,
                attention_mask=torch.ones_like(ids),
                generation_config=settings.generation_config(),
                min_new_tokens=shape.response,
            )

    def ours() -> None:
        generate_sequences(model, prompts, settings, min_new_tokens=shape.response)

    return best_of_pair(ours, baseline, repeats)


CASES = {"log-prob": logprob_case, "update": update_case, "rollout": rollout_case}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", action="store_true", help="B=16 × (16 + 32) smoke run")
    parser.add_argument("--repeats", type=int, default=3, help="k in best-of-k")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--only", choices=sorted(CASES), help="run a single case")
    parser.add_argument(
        "--shape", help="B,P,R,micro: rows, prompt and response widths, rows per micro-batch"
    )
    parser.add_argument("--models", help="comma-separated: tiny, qwen2-256 (default both)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    hf_logging.set_verbosity_error()  # load reports and the min_new_tokens override notice
    hf_logging.disable_progress_bar()
    shape = Shape(16, 16, 32, micro=8) if args.small else Shape(64, 64, 128, micro=16)
    if args.shape:
        rows, prompt, response, micro = (int(part) for part in args.shape.split(","))
        shape = Shape(rows, prompt, response, micro=micro)
    print(
        f"B={shape.rows} P={shape.prompt} R={shape.response} micro={shape.micro} "
        f"torch threads={torch.get_num_threads()} best of {args.repeats}"
    )
    header = f"{'case':9s} {'model':10s} {'ours tok/s':>11s} {'base tok/s':>11s} {'ratio':>7s} {'target':>7s}"
    with tempfile.TemporaryDirectory(prefix="ppoflow-bench-") as root:
        models = write_models(Path(root))
        rows = []
        for name, model_dir in models.items():
            if args.models and name not in args.models.split(","):
                continue
            vocab = load_causal_lm(model_dir).config.vocab_size
            batch = rollout_batch(shape, vocab, pad=0)
            valid = int(batch.batch["attention_mask"].sum())
            for case, run in CASES.items():
                if args.only and case != args.only:
                    continue
                ours_s, base_s = run(model_dir, batch, shape, args.repeats)
                tokens = shape.rows * shape.response if case == "rollout" else valid
                rows.append((case, name, tokens / ours_s, tokens / base_s))
                print(f"  done: {case} on {name}", flush=True)
    print(header)
    for case, name, ours, base in rows:
        ratio = ours / base
        mark = "ok" if ratio >= TARGETS[case] else "BELOW"
        print(
            f"{case:9s} {name:10s} {ours:11.0f} {base:11.0f} {ratio:6.2f}× ≥{TARGETS[case]:.2f}× {mark}"
        )


if __name__ == "__main__":
    main()
