"""Artifact bytes per step, and save / load time: tensors wide, integers narrow, padding left off.

    .venv/bin/python bench/artifact_bytes.py [--pairs 3] [--only demo|large]

A GRPO step writes, in verl's layout (P = max prompt length, R = max response length, B rows),
these tensors (the non-tensor columns and meta_info are small and left out):

- the step input: ``prompt_input_ids``, ``prompt_attention_mask``, ``prompt_position_ids``
  (B × P, int64);
- the rollout: ``prompts`` (B × P), ``responses``, ``response_mask`` (B × R),
  ``input_ids``, ``attention_mask``, ``position_ids`` (B × (P + R)), all int64, and
  ``rollout_log_probs`` (B × R, fp32);
- the reward: ``token_level_scores`` (B × R, fp32); the old log-probs: ``old_log_probs``;
  the advantage: ``advantages``, ``returns`` (B × R, fp32 each).

Two sizes: the demo's (256 rows = 64 prompts × 4, P 64, R 16, prompts of 7–11 tokens, vocab 40)
and a real run's (8,192 rows = 1024 prompts × 8, P 512, R 1024, prompts of 50–512 tokens and
responses of 20–1024, vocab 151,936). Each side saves every artifact of the step with BLAKE3 and
loads it back (``verify="full"``). Three sides alternate in the same run (A B C A B C …): the
baseline ``wide`` (``narrow=False, trim=False``: every tensor dense in its in-memory dtype, as
format version 2 wrote them), ``narrow`` (``trim=False``: integers in their narrowest lossless
dtype, format 3) and ``trimmed`` (the default, format 4: also each padded row stored from its first
to its last real entry, dataproto/trimmed_rows.py) and ``lean`` (what a ppoflow step writes:
trimmed, and the rollout's derived keys — ``prompts``, ``input_ids``, ``attention_mask``,
``position_ids`` — left out after checking they rebuild exactly, and rebuilt from the step input
on load, flows/runs/derived_keys.py). Printed: bytes per step and the ratios wide ÷ side, median save /
load seconds per step with the per-round ratios, and the load average.
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
from flows.runs.derived_keys import rebuild_derived, stored_delta
from stages.rollout import ROLLOUT_STAGE

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
    prompt_positions = (prompt_mask.cumsum(-1) - 1).clamp(min=0)
    # the rollout's: prompt positions, then the last one + 1, + 2, … through the response padding
    positions = torch.cat([prompt_positions, prompt_positions[:, -1:] + torch.arange(1, r + 1)], 1)

    def floats() -> torch.Tensor:
        return torch.randn(rows, r, generator=gen) * response_mask

    return {
        "input": DataProto.from_dict(
            {
                "prompt_input_ids": prompts,
                "prompt_attention_mask": prompt_mask,
                "prompt_position_ids": prompt_positions,
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


#: side → save_artifact's storage arguments
SIDES = {
    "wide": {"narrow": False, "trim": False},
    "narrow": {"narrow": True, "trim": False},
    "trimmed": {"narrow": True, "trim": True},
    "lean": {"narrow": True, "trim": True},  # and the rollout's derived keys left out
}


def one_step(artifacts: dict[str, DataProto], root: Path, side: str) -> tuple[int, float, float]:
    """(bytes, save seconds, load seconds) of the step's artifacts under ``root``."""
    shutil.rmtree(root, ignore_errors=True)
    start = time.perf_counter()
    refs, derived = {}, []
    for name, data in artifacts.items():
        if side == "lean" and name == "rollout":
            data, derived = stored_delta(ROLLOUT_STAGE, artifacts["input"], data)
        refs[name] = save_artifact(data, root / name, stage=name, **SIDES[side])
    saved = time.perf_counter()
    loaded = {name: load_artifact(ref.path, verify="full") for name, ref in refs.items()}
    if derived:
        rebuild_derived(ROLLOUT_STAGE, loaded["input"], loaded["rollout"], derived)
    for data in loaded.values():
        data.batch.to_dict()
    done = time.perf_counter()
    return sum(ref.nbytes for ref in refs.values()), saved - start, done - saved


def run(size: str, pairs: int) -> None:
    artifacts = step_artifacts(size)
    rows, p, r = SIZES[size][:3]
    sides: dict[str, list[tuple[int, float, float]]] = {side: [] for side in SIDES}
    with tempfile.TemporaryDirectory(prefix="artifact-bytes-") as tmp:
        for _ in range(pairs):
            for side in SIDES:
                sides[side].append(one_step(artifacts, Path(tmp) / "step", side))
    print(f"\n{size}: {rows} rows, P {p}, R {r}")
    wide = sides["wide"]
    cells = [f"{side} {sides[side][0][0] / 2**20:.1f} MiB" for side in SIDES]
    ratios = [
        f"wide/{side} {wide[0][0] / sides[side][0][0]:.2f}" for side in SIDES if side != "wide"
    ]
    print("  bytes per step   " + "   ".join(cells) + "   " + "   ".join(ratios))
    for index, what in ((1, "save"), (2, "load")):
        cells = []
        for side, samples in sides.items():
            times = [sample[index] for sample in samples]
            cell = f"{side} {statistics.median(times):.3f}"
            if side != "wide":
                per_round = sorted(w[index] / t for w, t in zip(wide, times, strict=True))
                cell += f" (wide/{side} {statistics.median(per_round):.2f}, {per_round[0]:.2f}–{per_round[-1]:.2f})"
            cells.append(cell)
        print(f"  {what} s/step      " + "   ".join(cells))


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
