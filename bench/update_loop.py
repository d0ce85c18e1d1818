"""The critic's update with rows taken as views (where consecutive) vs always gathered.

    .venv/bin/python bench/update_loop.py [--pairs 9] [--threads 1]

``update_critic`` on a DeepSpeed ZeRO-0 fp32 engine of the demo's tiny model (``make_tiny_model``,
with a one-output value head), one mini-batch of all B rows (one optimizer step) per call. The
shared loop (``stages.engines.ppo_update``) takes mini-batch and micro-batch rows with
``take_rows`` (a view for consecutive rows, a gather otherwise); the old path, which the critic
used before the loop was shared, gathers every time (``gather_rows``, swapped in for the run).

Shapes: prompts left-padded to P, responses right-padded to R, lengths drawn uniformly from
[P/2, P] and [R/2, R]:

* ``rows-8``: B=32 × (P=32 + R=64), micro-batches of 8 rows grouped by length: the mini-batch is a
  view, most micro-batches are gathers on both paths;
* ``whole``: B=16 × (P=16 + R=32), the whole mini-batch in one micro-batch: every take is a view.

Each pair times one call of each path (order alternating pair to pair) after one warm-up call of
each (the view path's warm-up counts its views), each path on its own engine from the same
weights. Printed per shape: the median seconds per path, the median of the per-pair ratios
gather ÷ view (> 1: the view path is faster) with its range, how many of the loop's row takes
were views, and the median time of the row takes alone per update (101 runs each).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tensordict import TensorDict
from transformers.utils import logging as hf_logging

from bench.engines import Shape, rollout_batch
from dataproto import DataProto
from stages.data.tiny_model import make_tiny_model
from stages.engines import ppo_update as loop
from stages.engines.batching import MicroBatching, mini_batch_indices
from stages.engines.critic import ValueModel, update_critic
from stages.engines.deepspeed_setup import EngineSettings, initialize_engine
from stages.engines.models import load_value_model

LOSS_CONFIG = {"cliprange_value": 0.5, "loss_agg_mode": "token-mean"}


#: (name, shape): B rows of P prompt + R response tokens, micro rows per micro-batch (B = all)
SHAPES = (("rows-8", Shape(32, 32, 64, micro=8)), ("whole", Shape(16, 16, 32, micro=16)))


def critic_batch(shape: Shape, vocab: int, seed: int = 0) -> DataProto:
    """``bench/engines.py``'s rollout batch (random lengths) with old values and returns."""
    batch = rollout_batch(shape, vocab, pad=0, seed=seed)
    gen = torch.Generator().manual_seed(seed + 1)
    mask = batch.batch["response_mask"]
    for key in ("values", "returns"):
        batch.batch[key] = torch.randn(mask.shape, generator=gen) * mask
    return batch


@contextlib.contextmanager
def gathering() -> Iterator[None]:
    """The loop takes every row set by gathering (the critic's path before the loop was shared)."""
    view = loop.take_rows
    loop.take_rows = loop.gather_rows
    try:
        yield
    finally:
        loop.take_rows = view


@contextlib.contextmanager
def counting_views(counts: list[int]) -> Iterator[None]:
    """Count the loop's row takes: ``counts`` += [views, all takes] (for the warm-up call only)."""
    take = loop.take_rows

    def counting(tensors: TensorDict, idx) -> TensorDict:
        rows = take(tensors, idx)
        storage = rows["input_ids"].untyped_storage().data_ptr()
        counts[0] += storage == tensors["input_ids"].untyped_storage().data_ptr()
        counts[1] += 1
        return rows

    loop.take_rows = counting
    try:
        yield
    finally:
        loop.take_rows = take


def take_seconds(batch: DataProto, settings: loop.PPOUpdateSettings, take, repeats: int) -> float:
    """Median seconds of the row takes alone of one update (mini-batches, then their micro-batches,
    as the loop takes them, with ``take``), over ``repeats`` runs."""
    tensors = batch.batch
    mini_rows = list(
        mini_batch_indices(len(tensors), settings.mini_batch_size, 1, settings.shuffle, 0)
    )
    plans = [settings.micro.plan(tensors[rows]["attention_mask"]) for rows in mini_rows]
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        for rows, plan in zip(mini_rows, plans):
            mini = take(tensors, rows)
            for idx in plan:
                take(mini, idx)
        seconds.append(time.perf_counter() - start)
    return statistics.median(seconds)


def time_shape(model_dir: Path, shape: Shape, pairs: int) -> dict[str, object]:
    """Seconds per update on each path, ``pairs`` interleaved pairs after a warm-up of each."""
    backbone = load_value_model(model_dir)
    batch = critic_batch(shape, backbone.config.vocab_size)
    settings = loop.PPOUpdateSettings(
        mini_batch_size=shape.rows, micro=MicroBatching(micro_batch_size=shape.micro)
    )
    engines = {}
    for path in ("view", "gather"):
        torch.manual_seed(0)  # the same value head on both
        engines[path] = initialize_engine(
            ValueModel(load_value_model(model_dir)),
            EngineSettings(zero_stage=0, dtype="float32", lr=1e-6),
        )

    def run(path: str) -> float:
        start = time.perf_counter()
        if path == "gather":
            with gathering():
                update_critic(engines[path], batch, settings, LOSS_CONFIG)
        else:
            update_critic(engines[path], batch, settings, LOSS_CONFIG)
        return time.perf_counter() - start

    views = [0, 0]
    with counting_views(views):
        run("view")  # warm-up
    run("gather")
    seconds: dict[str, list[float]] = {"view": [], "gather": []}
    for pair in range(pairs):
        order = ("view", "gather") if pair % 2 == 0 else ("gather", "view")
        for path in order:
            seconds[path].append(run(path))
    ratios = sorted(g / v for g, v in zip(seconds["gather"], seconds["view"]))
    takes = {
        path: take_seconds(batch, settings, take, repeats=101)
        for path, take in (("view", loop.take_rows), ("gather", loop.gather_rows))
    }
    return {
        "view": statistics.median(seconds["view"]),
        "gather": statistics.median(seconds["gather"]),
        "ratio": statistics.median(ratios),
        "range": (ratios[0], ratios[-1]),
        "views": tuple(views),
        "takes": takes,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=9, help="interleaved (view, gather) pairs")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    hf_logging.set_verbosity_error()  # the value head's "newly initialised" load report
    hf_logging.disable_progress_bar()
    print(
        f"update_critic, ZeRO-0 fp32, tiny model; torch threads={torch.get_num_threads()}, "
        f"{args.pairs} pairs; load average {os.getloadavg()[0]:.2f}"
    )
    print(
        f"{'shape':8s} {'B×(P+R)':>11s} {'micro':>6s} {'view s':>8s} {'gather s':>9s} "
        f"{'gather÷view':>12s} {'range':>12s} {'views':>6s} {'takes µs view/gather':>21s}"
    )
    with tempfile.TemporaryDirectory(prefix="ppoflow-bench-") as root:
        model_dir = make_tiny_model(Path(root) / "tiny")
        for name, shape in SHAPES:
            r = time_shape(model_dir, shape, args.pairs)
            low, high = r["range"]
            views, takes = r["views"]
            take_view, take_gather = r["takes"]["view"], r["takes"]["gather"]
            print(
                f"{name:8s} {f'{shape.rows}×({shape.prompt}+{shape.response})':>11s} "
                f"{shape.micro:>6d} {r['view']:8.4f} {r['gather']:9.4f} "
                f"{r['ratio']:11.3f}× {f'{low:.3f}–{high:.3f}':>12s} {f'{views}/{takes}':>6s} "
                f"{f'{take_view * 1e6:.0f} / {take_gather * 1e6:.0f}':>21s}",
                flush=True,
            )
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
