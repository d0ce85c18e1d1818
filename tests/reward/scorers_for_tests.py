"""Scorers with scripted misbehaviour, loaded by file path into the reward loop's workers.

``compute_score`` reads its instruction from ``solution_str``: ``sleep`` hangs, ``raise`` raises,
``nan`` / ``inf`` / ``str`` / ``nodict`` return invalid values, ``unpicklable`` an extra
that cannot travel back, ``die`` kills its process,
``dict:<x>`` returns ``{"score": x, "pred": <x>}``, an empty response scores 7.0 (to follow an
aborted row's score); anything else is parsed as the float score.
"""

from __future__ import annotations

import asyncio
import os
import time


def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    if solution_str == "sleep":
        time.sleep(3600)
    if solution_str == "raise":
        raise ValueError("scripted failure")
    if solution_str == "die":
        os._exit(3)
    special = {"nan": float("nan"), "inf": float("inf"), "str": "abc", "nodict": {"pred": "1"}}
    if solution_str in special:
        return special[solution_str]
    if solution_str == "":
        return 7.0
    if solution_str == "unpicklable":
        return {"score": 1.0, "handle": lambda: None}
    if solution_str.startswith("dict:"):
        value = solution_str.split(":", 1)[1]
        return {"score": float(value), "pred": value}
    return float(solution_str)


async def async_compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    if solution_str == "sleep":
        await asyncio.sleep(3600)
    if solution_str == "raise":
        raise ValueError("scripted failure")
    return float(solution_str)


def score_with_prompt(data_source, solution_str, ground_truth, extra_info=None, prompt_str=""):
    """1.0 when the response repeats the prompt, else 0.0 (checks the prompt is decoded)."""
    return float(solution_str == prompt_str)


def echo_ground_truth(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    """{"score": 1.0 if the response equals ground_truth, "ds": data_source, "extra": extra_info}."""
    return {"score": float(solution_str == ground_truth), "ds": data_source, "extra": extra_info}


NOT_A_FUNCTION = 3
