"""A pass/fail reward on the demo task, for ``bench/dapo_signal.py --reward pass-fail``.

The score is the demo scorer's ``acc`` (1.0 when the response starts with the answer, else 0.0),
with its ``acc`` and ``pred`` kept as extras: the case DAPO's dynamic sampling is made for, where
a group whose samples all fail (or all pass) carries no learning signal.
"""

from __future__ import annotations

from typing import Any

from stages.data.demo_task import compute_score as demo_score


def compute_score(
    data_source: str, solution_str: str, ground_truth: str, extra_info: dict | None = None
) -> dict[str, Any]:
    """``{"score": acc, "acc": acc, "pred": pred}`` of the demo scorer's result.

    >>> from stages.data.demo_task import DATA_SOURCE
    >>> compute_score(DATA_SOURCE, "cccc", "c"), compute_score(DATA_SOURCE, "d", "c")["score"]
    ({'score': 1.0, 'acc': 1.0, 'pred': 'c'}, 0.0)
    """
    result = demo_score(data_source, solution_str, ground_truth, extra_info)
    return {"score": result["acc"], "acc": result["acc"], "pred": result["pred"]}
