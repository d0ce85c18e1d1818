"""Benchmark: the per-sample reward loop vs a plain sequential for-loop.

    .venv/bin/python bench/reward.py [--small] [--samples N] [--workers 2 8]

A CPU-bound scorer (the MATH normaliser repeated to cost ~1 ms per sample) scores N samples
(4,096; 256 with --small) three ways: a plain ``for`` loop in this process, then ppoflow's
RewardLoop with each worker count. Prints wall time, samples/s and the speed-up over the for
loop (target ≥ 1.8× with 2 workers on 2 idle cores), with ``multiprocessing.Pool.map`` beside it
as the machine's ceiling (a loaded machine caps both), then the loop's overhead per trivial
sample (a scorer that returns 1.0; target ≤ 0.2 ms). Pool start-up is timed separately: the pool
lives for the whole run, so it is paid once.

Worker processes re-import this file to find the scorers, so it keeps its top-level imports light.
"""

from __future__ import annotations

import argparse
import time

from stages.reward.scorers.math import normalize_answer

ANSWER = r"\left( 3, \dfrac{1}{2} \right) + \sqrt3 - 90^\circ \text{ cm}"


def burn_score(data_source, solution_str, ground_truth, extra_info=None, repeats=1):
    """CPU-bound: normalise the answer ``repeats`` times, then compare."""
    for _ in range(repeats):
        normal = normalize_answer(solution_str)
    return float(normal == normalize_answer(ground_truth))


def trivial_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    return 1.0


def calibrate(target_s: float = 1e-3) -> int:
    """Repeats of normalize_answer that cost about ``target_s`` seconds."""
    start, n = time.perf_counter(), 2000
    for _ in range(n):
        normalize_answer(ANSWER)
    per_call = (time.perf_counter() - start) / n
    return max(1, round(target_s / per_call))


def make_calls(n: int, repeats: int | None) -> list[dict]:
    extra = {} if repeats is None else {"repeats": repeats}
    return [
        {
            "data_source": "bench",
            "solution_str": ANSWER,
            "ground_truth": ANSWER,
            "extra_info": None,
            **extra,
        }
        for _ in range(n)
    ]


def time_sequential(calls: list[dict]) -> float:
    start = time.perf_counter()
    for call in calls:
        burn_score(**call)
    return time.perf_counter() - start


def _burn_call(call: dict) -> float:
    return burn_score(**call)


def time_stdlib_pool(calls: list[dict], workers: int) -> float:
    """The ceiling on this machine: ``multiprocessing.Pool.map`` (no timeouts, no failure handling)."""
    import multiprocessing as mp

    with mp.get_context("forkserver").Pool(workers) as pool:
        pool.map(_burn_call, calls[: 4 * workers])
        start = time.perf_counter()
        pool.map(_burn_call, calls, chunksize=16)
        return time.perf_counter() - start


def time_loop(fn, calls: list[dict], workers: int) -> tuple[float, float, dict]:
    """(start-up s, scoring s, failure counts) of a RewardLoop with ``workers`` processes."""
    from stages.reward.custom import ScorerRef
    from stages.reward.loop import RewardLoop
    from stages.reward.settings import RewardSettings

    settings = RewardSettings(num_workers=workers, timeout_s=60.0)
    start = time.perf_counter()
    loop = RewardLoop(tokenizer=None, settings=settings, scorer=ScorerRef.of(fn))
    startup = time.perf_counter() - start
    try:
        loop.score_calls(
            calls[: 4 * workers], list(range(4 * workers))
        )  # warm the workers' imports
        start = time.perf_counter()
        result = loop.score_calls(calls, list(range(len(calls))))
        elapsed = time.perf_counter() - start
    finally:
        loop.close()
    return startup, elapsed, result.counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--small", action="store_true", help="256 samples (smoke run)")
    parser.add_argument("--samples", type=int, default=None, help="samples (default 4096)")
    parser.add_argument("--workers", type=int, nargs="+", default=[2, 8], help="worker counts")
    args = parser.parse_args()
    n = args.samples or (256 if args.small else 4096)

    repeats = calibrate()
    calls = make_calls(n, repeats)
    sequential = time_sequential(calls)
    print(f"samples {n}, scorer ~1 ms ({repeats} normalisations per sample)")
    print(f"{'sequential for-loop':<24} {sequential:8.3f} s  {n / sequential:9.1f} samples/s")
    for workers in args.workers:
        startup, elapsed, counts = time_loop(burn_score, calls, workers)
        failures = sum(counts.values())
        print(
            f"{f'RewardLoop {workers} workers':<24} {elapsed:8.3f} s  {n / elapsed:9.1f} samples/s  "
            f"speed-up {sequential / elapsed:5.2f}x  (start-up {startup:.2f} s, failures {failures})"
        )
        ceiling = time_stdlib_pool(calls, workers)
        print(
            f"{f'  mp.Pool {workers} workers':<24} {ceiling:8.3f} s  {n / ceiling:9.1f} samples/s  "
            f"speed-up {sequential / ceiling:5.2f}x  (reference without timeouts)"
        )
    trivial = make_calls(n, None)
    for workers in args.workers:
        _, elapsed, _ = time_loop(trivial_score, trivial, workers)
        print(f"overhead per trivial sample, {workers} workers: {elapsed / n * 1e3:.3f} ms")


if __name__ == "__main__":
    main()
