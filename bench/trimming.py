"""Log-prob and update passes at the width the rows need vs at the full P + R width.

    .venv/bin/python bench/trimming.py [--pairs 5] [--threads 2]

The demo's batches are verl-layout: prompts left-padded to ``max_prompt_length`` 64, responses
right-padded to 16, while a row holds about 25 real tokens. The batch here has that shape: 256
rows (64 prompts × 4 samples), prompts of 7–11 tokens padded to 64, responses of 16 tokens (one
row in ten shorter), the demo's tiny model (``make_tiny_model``), fp32, ZeRO-0.

Passes, each as in the demo's step: ``compute_log_prob`` over the batch in micro-batches of 16
(the old-log-prob stage), and ``update_actor`` with two mini-batches of 128 rows in
micro-batches of 16 (the update stage). The baseline is the same code with the trimming turned
off (``stages.engines.logprob.real_span`` patched to the full width), measured in the same run:
the two sides alternate (A B A B …), each pair is a fresh engine from the same weights, and the
script prints medians and the per-pair ratios (full ÷ trimmed time: > 1 is faster) with the load
average.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault(
    "TORCH_EXTENSIONS_DIR", str(Path.home() / ".cache" / "ppoflow-torch-extensions")
)

from tensordict import TensorDict

from dataproto import DataProto
from stages.engines import logprob
from stages.engines.actor import PPOUpdateSettings, compute_log_prob, update_actor
from stages.engines.batching import MicroBatching
from stages.engines.deepspeed_setup import EngineSettings, initialize_engine
from stages.engines.logprob import ResponseLogProbModel
from stages.engines.models import load_causal_lm

LOSS = {"clip_ratio": 0.2, "loss_agg_mode": "token-mean", "entropy_coeff": 0.0}
ROWS, P, R, MICRO = 256, 64, 16, 16


def demo_shaped_batch(vocab: int, pad: int, seed: int = 0) -> DataProto:
    """256 rows: prompts of 7–11 tokens left-padded to 64, responses of 16 (10 % shorter)."""
    gen = torch.Generator().manual_seed(seed)
    prompt_lens = torch.randint(7, 12, (ROWS,), generator=gen)
    response_lens = torch.full((ROWS,), R)
    short = torch.rand(ROWS, generator=gen) < 0.1
    response_lens[short] = torch.randint(4, R, (int(short.sum()),), generator=gen)
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


@contextmanager
def full_width(enabled: bool):
    """Inside: the trimming off (every forward at P + R columns) when ``enabled``."""
    original = logprob.real_span
    if enabled:
        logprob.real_span = lambda mask, _response_length: (0, mask.shape[1])
    try:
        yield
    finally:
        logprob.real_span = original


def time_passes(model_dir: Path, batch: DataProto, full: bool) -> tuple[float, float]:
    """Seconds of (old log-prob pass, update pass) on a fresh ZeRO-0 fp32 engine."""
    torch.manual_seed(0)
    engine = initialize_engine(
        ResponseLogProbModel(load_causal_lm(model_dir)),
        EngineSettings(zero_stage=0, lr=1e-4, clip_grad=1.0),
    )
    micro = MicroBatching(micro_batch_size=MICRO)
    with full_width(full):
        start = time.perf_counter()
        with torch.no_grad():
            compute_log_prob(engine, batch, micro)
        middle = time.perf_counter()
        update_actor(engine, batch, PPOUpdateSettings(mini_batch_size=128, micro=micro), LOSS)
        end = time.perf_counter()
    return middle - start, end - middle


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from transformers.utils import logging as hf_logging

    from stages.data.tiny_model import make_tiny_model

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = make_tiny_model(Path(tmp) / "model")
        config = load_causal_lm(model_dir).config
        batch = demo_shaped_batch(config.vocab_size, config.pad_token_id or 0)
        real = batch.batch["attention_mask"].float().sum(-1).mean().item()
        print(f"batch: {ROWS} rows × ({P} + {R}) columns, {real:.1f} real tokens per row")
        time_passes(model_dir, batch, full=True)  # warm-up (DeepSpeed ops, allocator)
        pairs = []
        for _ in range(args.pairs):
            full = time_passes(model_dir, batch, full=True)
            trimmed = time_passes(model_dir, batch, full=False)
            pairs.append((full, trimmed))
    for index, name in enumerate(("old log-prob", "update")):
        full = [p[0][index] for p in pairs]
        trimmed = [p[1][index] for p in pairs]
        ratios = [f / t for f, t in zip(full, trimmed)]
        print(
            f"{name:<13} full {statistics.median(full):.3f} s  trimmed "
            f"{statistics.median(trimmed):.3f} s  ratio median {statistics.median(ratios):.2f} "
            f"(pairs {min(ratios):.2f}–{max(ratios):.2f})"
        )
    print(f"load average (1, 5, 15 min): {os.getloadavg()}; torch threads {args.threads}")


if __name__ == "__main__":
    main()
