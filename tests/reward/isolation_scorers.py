"""Scorers for the isolation tests, named by file path (``scorer_ref``), so this test process never
imports them: whatever they return reaches the driver only through the worker protocol.

``returns`` reads its instruction from ``solution_str`` and returns the value of ``RETURNS`` under
that name; anything else is parsed as the float score.
"""

from __future__ import annotations

import asyncio
import math
import sys
import time

#: modules a scorer worker must not hold (the trainer's, not scoring's)
HEAVY = ("torch", "deepspeed", "prefect", "mlflow", "transformers", "vllm", "ray", "pyarrow")


class Opaque:
    """A class only this file defines (the driver cannot unpickle an instance of it)."""


RETURNS = {
    "str": lambda: "1.0",
    "none": lambda: None,
    "nan": lambda: math.nan,
    "inf": lambda: math.inf,
    "-inf": lambda: -math.inf,
    "list": lambda: [1.0],
    "nodict": lambda: {"pred": "7"},
    "nan_score": lambda: {"score": math.nan},
    "str_score": lambda: {"score": "1"},
    "set_extra": lambda: {"score": 1.0, "seen": {1, 2}},
    "bytes_extra": lambda: {"score": 1.0, "raw": b"x"},
    "object_extra": lambda: {"score": 1.0, "obj": Opaque()},
    "nested_set_extra": lambda: {"score": 1.0, "info": {"a": [{"b": {3}}]}},
    "int_key_extra": lambda: {"score": 1.0, 3: "x"},
    "reserved_extra": lambda: {"score": 1.0, "uid": "mine"},
    "nested_extra": lambda: {"score": 0.5, "info": {"a": [1, (2, "x")], "b": None}},
}


def returns(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    if solution_str in RETURNS:
        return RETURNS[solution_str]()
    return float(solution_str)


def wrong_signature(solution):
    """Takes one positional argument: every call with verl's keywords raises TypeError."""
    return 1.0


def always_raises(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    raise ValueError(f"cannot score {solution_str!r}")


def raises_on_odd(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    if int(solution_str) % 2:
        raise ValueError(f"odd sample {solution_str}")
    return 1.0


def hangs_on_sleep(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    if solution_str == "sleep":
        time.sleep(3600)
    return float(solution_str)


async def async_blocks(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    """An async scorer that blocks its event loop (time.sleep) on "block"."""
    if solution_str == "block":
        time.sleep(3600)
    if solution_str == "await":
        await asyncio.sleep(3600)
    await asyncio.sleep(0)
    return float(solution_str)


def report_modules(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    """The heavy modules this worker holds, and whether a driver script was re-run in it."""
    main = sys.modules["__main__"]
    return {
        "score": 1.0,
        "heavy": sorted(name for name in HEAVY if name in sys.modules),
        "main_file": getattr(main, "__file__", None),
        "mp_main_file": getattr(sys.modules.get("__mp_main__"), "__file__", None),
    }


def report_builtin_modules(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    """Scores with the built-in router (demo task included), then reports like report_modules."""
    from stages.reward.scorers.registry import default_compute_score

    result = default_compute_score(data_source, solution_str, ground_truth, extra_info)
    score = result["score"] if isinstance(result, dict) else result
    return {**report_modules(data_source, solution_str, ground_truth), "score": score}
