"""Artifact bytes per step, and save / load time, with integer tensors stored narrow vs wide.

    .venv/bin/python bench/artifact_bytes.py [--pairs 3] [--only demo|large]

A GRPO step writes, in verl's layout (P = max prompt length, R = max response length, B rows),
these tensors (the non-tensor columns and meta_info are small and left out):

- the step input: ``input_ids``, ``attention_mask``, ``position_ids`` (B × P, int64);
- the rollout: ``prompts`` (B × P), ``responses``, ``response_mask`` (B × R),
  ``input_ids``, ``attention_mask``, ``position_ids`` (B × (P + R)), all int64, and
  ``rollout_log_probs`` (B × R, fp32);
- the reward: ``token_level_scores`` (B × R, fp32); the old log-probs: ``old_log_probs``;
  the advantage: ``advantages``, ``returns`` (B × R, fp32 each).

Two sizes: the demo's (256 rows = 64 prompts × 4, P 64, R 16, prompts of 7–11 tokens, vocab 40)
and a real run's (8,192 rows = 1024 prompts × 8, P 512, R 1024, prompts of 50–512 tokens and
responses of 20–1024, vocab 151,936). Each side saves every artifact of the step with BLAKE3 and
loads it back (``verify="full"``); the baseline (``narrow=False``, every tensor in its in-memory
dtype, as format version 2 wrote them) and the narrow store alternate, A B A B …, in the same
run. Printed: bytes per step, the ratio wide ÷ narrow, and median save / load seconds per step
with the per-pair ratios, and the load average.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dataproto import DataProto
from dataproto.artifact import load_artifact, save_artifact

SIZES = {
    # name: rows, P, R, prompt lengths, response lengths, vocab
    "demo": (256, 64, 16, (7, 11), (16, 16), 40),
    "large": (8192, 512, 1024, (50, 512), (20, 1024), 151_936),
}


def step_artifacts(size: str, seed: int = 0) -> dict[str, DataProto]:
    """The tensors a GRPO step's artifacts hold (module docstring), left / right padded."""
    rows, p, r, (p_lo, p_hi), (r_lo, r_hi), vocab = SIZES[size]
    gen = torch.Generator().manual_seed(seed)
    prompt_lens = torch.randint(p_lo, p_hi + 1, (rows,), generator=gen)
    response_lens = torch.randint(r_lo, r_hi + 1, (rows,), generator=gen)
    prompt_mask = (torch.arange(p) >= p - prompt_lens[:, None]).long()
    response_mask = (torch.arange(r) < response_lens[:, None]).long()
    prompts = torch.randint(0, vocab, (rows, p), generator=gen) * prompt_mask
    responses = torch.randint(0, vocab, (rows, r), generator=gen) * response_mask
    mask = torch.cat([prompt_mask, response_mask], dim=1)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)

    def floats() -> torch.Tensor:
        return torch.randn(rows, r, generator=gen) * response_mask

    return {
        "input": DataProto.from_dict(
            {
                "input_ids": prompts,
                "attention_mask": prompt_mask,
                "position_ids": (prompt_mask.cumsum(-1) - 1).clamp(min=0),
            }
        ),
        "rollout": DataProto.from_dict(
            {
                "prompts": prompts,
                "responses": responses,
                "response_mask": response_mask,
                "input_ids": torch.cat([prompts, responses], dim=1),
                "attention_mask": mask,
                "position_ids": positions,
                "rollout_log_probs": floats(),
            }
        ),
        "reward": DataProto.from_dict({"token_level_scores": floats()}),
        "old_log_prob": DataProto.from_dict({"old_log_probs": floats()}),
        "advantage": DataProto.from_dict({"advantages": floats(), "returns": floats()}),
    }


def one_step(artifacts: dict[str, DataProto], root: Path, narrow: bool) -> tuple[int, float, float]:
    """(bytes, save seconds, load seconds) of the step's artifacts under ``root``."""
    shutil.rmtree(root, ignore_errors=True)
    start = time.perf_counter()
    refs = [
        save_artifact(data, root / name, stage=name, narrow=narrow)
        for name, data in artifacts.items()
    ]
    saved = time.perf_counter()
    for ref in refs:
        load_artifact(ref.path, verify="full").batch.to_dict()
    loaded = time.perf_counter()
    return sum(ref.nbytes for ref in refs), saved - start, loaded - saved


def run(size: str, pairs: int) -> None:
    artifacts = step_artifacts(size)
    rows, p, r = SIZES[size][:3]
    sides: dict[bool, list[tuple[int, float, float]]] = {False: [], True: []}
    with tempfile.TemporaryDirectory(prefix="artifact-bytes-") as tmp:
        for _ in range(pairs):
            for narrow in (False, True):
                sides[narrow].append(one_step(artifacts, Path(tmp) / "step", narrow))
    wide_bytes, narrow_bytes = sides[False][0][0], sides[True][0][0]
    print(f"\n{size}: {rows} rows, P {p}, R {r}")
    print(f"  bytes per step   wide {wide_bytes / 2**20:9.1f} MiB   narrow "
          f"{narrow_bytes / 2**20:9.1f} MiB   ratio {wide_bytes / narrow_bytes:.2f}")  # fmt: skip
    for index, what in ((1, "save"), (2, "load")):
        wide = [sample[index] for sample in sides[False]]
        narrow = [sample[index] for sample in sides[True]]
        ratios = sorted(w / n for w, n in zip(wide, narrow, strict=True))
        print(f"  {what} s/step      wide {statistics.median(wide):9.3f}       narrow "
              f"{statistics.median(narrow):9.3f}       ratio {statistics.median(ratios):.2f} "
              f"(pairs {ratios[0]:.2f}–{ratios[-1]:.2f})")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--only", choices=sorted(SIZES))
    args = parser.parse_args()
    torch.set_num_threads(2)
    print(f"load average {os.getloadavg()[0]:.2f}, torch {torch.__version__}, 2 threads")
    for size in [args.only] if args.only else list(SIZES):
        run(size, args.pairs)


if __name__ == "__main__":
    main()
