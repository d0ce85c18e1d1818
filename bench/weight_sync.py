"""The actor → vLLM weight sync: time and peak host memory, the streamed path against the
whole-model path it replaced, measured in the same engine, interleaved.

    make install-vllm      # once: .venv-vllm with vLLM's CPU build
    .venv-vllm/bin/python bench/weight_sync.py [--sizes tiny,100m] [--pairs 3] [--bucket-mib 64]

Per model size (``tiny``: ``make_tiny_model``'s defaults, 0.33M parameters; ``100m``: the same
Qwen2 shape at hidden 768, 16 layers, MLP 2048, ~101M parameters, fp32) and per engine layout:

- ``multi-process`` (vLLM's default: the engine core and its worker in a process of their own):
  **before** — every tensor copied to the host, the whole model serialised into one safetensors
  ``bytes`` and sent in one RPC (what ppoflow did until 2026-12-02); **after** —
  ``VLLMRollout.sync_weights``: buckets of ≤ ``--bucket-mib`` (default 64, as ppoflow's) staged on the worker, one reload.
- ``in-process`` (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, the engine beside the actor):
  **before** — a list of host copies of every tensor; **after** — the lazy stream of the
  actor's own tensors.

Each layout runs in a fresh interpreter (vLLM reads the variable at import), one engine, the two
sides alternating ``--pairs`` times after one warm-up sync each. Per sync: wall time, and the
peak host memory above the level just before it — the resident set summed over this process and
its children, sampled every 2 ms (a lower bound for syncs shorter than a few samples). Printed:
medians per side, per-pair ratios after ÷ before, the load average. Where CUDA is available the
model sits on the GPU, as the actor's does (``bench/gpu_check.sh`` runs this there), and the
before path's host copies are the whole model; on CPU the weights are host memory already.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

SIZES = {
    "tiny": {},
    "100m": {
        "hidden_size": 768,
        "num_layers": 16,
        "num_heads": 12,
        "num_kv_heads": 4,
        "intermediate_size": 2048,
    },
}
SAMPLE_EVERY_S = 0.002


class PeakTreeRSS:
    """Samples the resident set of this process and its children on a thread; ``peak`` above the
    level at ``__enter__``."""

    def __enter__(self) -> PeakTreeRSS:
        import psutil

        self._me = psutil.Process()
        self.base = self.peak = self._tree()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _tree(self) -> int:
        import psutil

        total = self._me.memory_info().rss
        for child in self._me.children(recursive=True):
            with contextlib.suppress(psutil.Error):  # a child that just exited
                total += child.memory_info().rss
        return total

    def _sample(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self._tree())
            time.sleep(SAMPLE_EVERY_S)

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self._tree())

    @property
    def above_base_mib(self) -> float:
        return (self.peak - self.base) / 2**20


def whole_model_sync(rollout, model) -> None:
    """The path ppoflow replaced: host copies of every tensor (tied ones cloned), then one
    safetensors ``bytes`` of the whole model (multi-process) or the list itself (in-process)."""
    from safetensors.torch import save

    seen, named = set(), []
    for name, tensor in model.named_parameters():
        cpu = tensor.detach().to("cpu").contiguous()
        pointer = cpu.untyped_storage().data_ptr()
        named.append((name, cpu.clone() if pointer in seen else cpu))
        seen.add(pointer)
    payload = named if rollout.in_process else save(dict(named))
    rollout.llm.collective_rpc("ppoflow_load_weights", args=(payload,))
    rollout.llm.reset_prefix_cache()


def child(model_dir: str, pairs: int, bucket_bytes: int) -> None:
    """One engine, the two syncs alternating; prints one JSON line of the measurements."""
    import torch

    from stages.data.tiny_model import load_causal_lm
    from stages.engines.rollout_vllm import VLLMRollout

    torch.set_num_threads(2)
    device = "cuda" if torch.cuda.is_available() else "cpu"  # where the actor's weights live
    model = load_causal_lm(model_dir, dtype=torch.float32).eval().to(device)
    sides = {
        "before": lambda r: whole_model_sync(r, model),
        "after": lambda r: r.sync_weights(model.named_parameters(), bucket_bytes=bucket_bytes),
    }
    results = {side: {"s": [], "peak_mib": []} for side in sides}
    with VLLMRollout(
        model_dir, dtype="float32", max_model_len=256, kv_cache_memory_bytes=64 << 20
    ) as rollout:
        for sync in sides.values():  # warm-up: first-call costs out of the figures
            sync(rollout)
        for _ in range(pairs):
            for side, sync in sides.items():
                with PeakTreeRSS() as memory:
                    start = time.perf_counter()
                    sync(rollout)
                    results[side]["s"].append(time.perf_counter() - start)
                results[side]["peak_mib"].append(memory.above_base_mib)
        params = sum(p.numel() for p in model.parameters())
    print("RESULT " + json.dumps({"params": params, "in_process": rollout.in_process, **results}))


def run_layout(model_dir: Path, in_process: bool, pairs: int, bucket_bytes: int) -> dict:
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0" if in_process else "1"}
    code = (
        f"import sys; sys.path.insert(0, {str(REPO / 'bench')!r}); import weight_sync; "
        f"weight_sync.child({str(model_dir)!r}, {pairs}, {bucket_bytes})"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=1800
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode != 0 or not lines:
        raise SystemExit(f"the {model_dir.name} run failed:\n{done.stderr[-3000:]}")
    return json.loads(lines[-1].removeprefix("RESULT "))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="tiny,100m", help=f"comma-separated, of {sorted(SIZES)}")
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--bucket-mib", type=int, default=64)
    args = parser.parse_args()
    from stages.data.tiny_model import make_tiny_model

    print(f"{'model':>6} {'engine':>13} {'side':>6} {'sync s':>9} {'peak MiB':>9}")
    with tempfile.TemporaryDirectory() as tmp:
        for size in args.sizes.split(","):
            model_dir = make_tiny_model(Path(tmp) / size, **SIZES[size])
            for in_process in (False, True):
                got = run_layout(model_dir, in_process, args.pairs, args.bucket_mib << 20)
                layout = "in-process" if in_process else "multi-process"
                for side in ("before", "after"):
                    s = statistics.median(got[side]["s"])
                    mib = statistics.median(got[side]["peak_mib"])
                    print(f"{size:>6} {layout:>13} {side:>6} {s:9.3f} {mib:9.1f}")
                time_ratios = [a / b for a, b in zip(got["after"]["s"], got["before"]["s"])]
                print(
                    f"{'':>6} {layout:>13} after ÷ before time: median "
                    f"{statistics.median(time_ratios):.2f} (pairs "
                    f"{min(time_ratios):.2f}–{max(time_ratios):.2f}); "
                    f"{got['params'] / 1e6:.1f}M parameters, "
                    f"{got['params'] * 4 / 2**20:.0f} MiB of fp32 weights"
                )
    print(f"load average {os.getloadavg()[0]:.2f}, bucket {args.bucket_mib} MiB, 2 torch threads")


if __name__ == "__main__":
    main()
