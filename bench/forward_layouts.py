"""Log-prob and update passes in each forward layout: full width, trimmed, packed.

    .venv/bin/python bench/forward_layouts.py [--pairs 5] [--threads 2] [--only demo|varied]

Batches are verl-layout: prompts left-padded to ``max_prompt_length``, responses right-padded to
``max_response_length``. Two shapes, 256 rows each (64 prompts × 4 samples), the demo's tiny model
(``make_tiny_model``), fp32, ZeRO-0:

* ``demo``: the demo's shape, prompts of 7–11 tokens padded to 64, responses of 16 tokens (one row
  in ten shorter), about 25 real tokens in 80 columns;
* ``varied``: prompts of 8–120 tokens padded to 128, responses of 4–64 padded to 64, drawn
  uniformly (real data varies like this: many short rows, a few long ones).

Passes, each as in the demo's step (configs/demo-cpu.yaml): ``compute_log_prob`` over the batch
in micro-batches of 32 (the old-log-prob stage), and ``update_actor`` with one mini-batch of all
256 rows in micro-batches of 16 (the update stage: one on-policy optimizer step). Layouts (``stages.engines.response_hidden``): ``full``
(every forward at P + R columns, the baseline), ``trimmed`` (the columns some row of the
micro-batch needs) and ``packed`` (``use_remove_padding``: the rows' real tokens back to back).
They alternate in the same run (full, trimmed, packed, full, …), each a fresh engine from the
same weights; the script prints medians and per-round ratios (full ÷ layout time: > 1 is faster)
and the load average.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tensordict import TensorDict

from dataproto import DataProto
from stages.engines.actor import PPOUpdateSettings, compute_log_prob, update_actor
from stages.engines.batching import MicroBatching
from stages.engines.deepspeed_setup import EngineSettings, initialize_engine
from stages.engines.logprob import ResponseLogProbModel
from stages.engines.models import load_causal_lm

LOSS = {"clip_ratio": 0.2, "loss_agg_mode": "token-mean", "entropy_coeff": 0.0}
#: the demo config's: log_prob_micro_batch_size_per_gpu, ppo_micro_batch_size_per_gpu, and one
#: mini-batch of all 256 sequences (ppo_mini_batch_size 64 prompts × n 4)
ROWS, LOG_PROB_MICRO, UPDATE_MICRO, MINI_BATCH = 256, 32, 16, 256
LAYOUTS = ("full", "trimmed", "packed")


def demo_lengths(gen: torch.Generator) -> tuple[int, int, torch.Tensor, torch.Tensor]:
    """(P, R, prompt lengths, response lengths): 7–11 of 64, 16 of 16 (10 % shorter)."""
    P, R = 64, 16
    prompt_lens = torch.randint(7, 12, (ROWS,), generator=gen)
    response_lens = torch.full((ROWS,), R)
    short = torch.rand(ROWS, generator=gen) < 0.1
    response_lens[short] = torch.randint(4, R, (int(short.sum()),), generator=gen)
    return P, R, prompt_lens, response_lens


def varied_lengths(gen: torch.Generator) -> tuple[int, int, torch.Tensor, torch.Tensor]:
    """(P, R, prompt lengths, response lengths): 8–120 of 128, 4–64 of 64, uniform."""
    return (
        128,
        64,
        torch.randint(8, 121, (ROWS,), generator=gen),
        torch.randint(4, 65, (ROWS,), generator=gen),
    )


SHAPES = {"demo": demo_lengths, "varied": varied_lengths}


def shaped_batch(shape: str, vocab: int, pad: int, seed: int = 0) -> DataProto:
    """256 rows of the ``shape``'s lengths, random tokens, advantages and old log-probs."""
    gen = torch.Generator().manual_seed(seed)
    P, R, prompt_lens, response_lens = SHAPES[shape](gen)
    columns = torch.arange(P + R)
    mask = ((columns >= P - prompt_lens[:, None]) & (columns < P + response_lens[:, None])).long()
    ids = torch.randint(3, vocab, (ROWS, P + R), generator=gen).masked_fill(mask == 0, pad)
    response_mask = mask[:, P:]
    tensors = {
        "input_ids": ids,
        "attention_mask": mask,
        "position_ids": (mask.cumsum(-1) - 1).clamp(min=0),
        "prompts": ids[:, :P],
        "responses": ids[:, P:],
        "response_mask": response_mask,
        "advantages": torch.randn(ROWS, R, generator=gen) * response_mask,
        "old_log_probs": (-5.0 + 0.3 * torch.randn(ROWS, R, generator=gen)) * response_mask,
    }
    return DataProto(batch=TensorDict(tensors, batch_size=[ROWS]), meta_info={"temperature": 1.0})


def time_passes(model_dir: Path, batch: DataProto, layout: str) -> tuple[float, float]:
    """Seconds of (old log-prob pass, update pass) on a fresh ZeRO-0 fp32 engine."""
    torch.manual_seed(0)
    engine = initialize_engine(
        ResponseLogProbModel(load_causal_lm(model_dir), layout),
        EngineSettings(zero_stage=0, lr=1e-4, clip_grad=1.0),
    )
    start = time.perf_counter()
    with torch.no_grad():
        compute_log_prob(engine, batch, MicroBatching(micro_batch_size=LOG_PROB_MICRO))
    middle = time.perf_counter()
    settings = PPOUpdateSettings(
        mini_batch_size=MINI_BATCH, micro=MicroBatching(micro_batch_size=UPDATE_MICRO)
    )
    update_actor(engine, batch, settings, LOSS)
    end = time.perf_counter()
    return middle - start, end - middle


def report(shape: str, rounds: list[dict[str, tuple[float, float]]]) -> None:
    """Medians per layout and pass, and the per-round ratios full ÷ layout."""
    for index, name in enumerate(("old log-prob", "update")):
        cells = []
        for layout in LAYOUTS:
            times = [r[layout][index] for r in rounds]
            ratios = [r["full"][index] / r[layout][index] for r in rounds]
            cells.append(
                f"{layout} {statistics.median(times):.3f} s"
                + (
                    ""
                    if layout == "full"
                    else f" ×{statistics.median(ratios):.2f} ({min(ratios):.2f}–{max(ratios):.2f})"
                )
            )
        print(f"{shape:<7}{name:<13}" + "  ".join(cells))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=5, help="rounds of the three layouts")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--only", choices=sorted(SHAPES))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from transformers.utils import logging as hf_logging

    from stages.data.tiny_model import make_tiny_model

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = make_tiny_model(Path(tmp) / "model")
        config = load_causal_lm(model_dir).config
        for shape in [args.only] if args.only else list(SHAPES):
            batch = shaped_batch(shape, config.vocab_size, config.pad_token_id or 0)
            mask = batch.batch["attention_mask"]
            real = mask.float().sum(-1).mean().item()
            print(f"{shape}: {ROWS} rows × {mask.shape[1]} columns, {real:.1f} real tokens per row")
            time_passes(model_dir, batch, "full")  # warm-up (DeepSpeed ops, allocator)
            results[shape] = [
                {layout: time_passes(model_dir, batch, layout) for layout in LAYOUTS}
                for _ in range(args.pairs)
            ]
    for shape, rounds in results.items():
        report(shape, rounds)
    print(f"load average (1, 5, 15 min): {os.getloadavg()}; torch threads {args.threads}")


if __name__ == "__main__":
    main()
