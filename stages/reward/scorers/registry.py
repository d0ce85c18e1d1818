"""Route a sample to its rule-based scorer by ``data_source`` (verl's ``default_compute_score``).

Built in: ``openai/gsm8k`` (strict ``####`` extraction), the three MATH names (last boxed answer,
Hendrycks normalisation) and the demo task of ``stages.data.demo_task`` (imported on first use).
verl's other built-in scorers (math_dapo, prime_math, code sandboxes, geo3k, searchR1) are not
shipped: their names raise ``NotImplementedError`` saying how to plug in a custom scorer. Any
other name raises ``KeyError`` listing the known ones.

Every entry has verl's signature ``scorer(data_source, solution_str, ground_truth, extra_info)``
and returns a float or a dict with ``score``.

Example:
    >>> default_compute_score("openai/gsm8k", "3 + 4 = 7 #### 7", "7")
    1.0
    >>> default_compute_score("lighteval/MATH", r"\\boxed{\\dfrac{1}{2}}", "1/2")
    1.0
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from stages.registry import Registry
from stages.reward.scorers import gsm8k
from stages.reward.scorers import math as math_scorer

RuleScorer = Callable[[str, str, Any, Any], "float | dict[str, Any]"]
SCORERS: Registry[RuleScorer] = Registry("reward data_source")

MATH_SOURCES = ("lighteval/MATH", "DigitalLearningGmbH/MATH-lighteval", "HuggingFaceH4/MATH-500")
DEMO_TASK_MODULE = "stages.data.demo_task"

#: verl 0.9.1 routes these names to scorers ppoflow does not ship.
NOT_SHIPPED: dict[str, tuple[str, ...]] = {
    "math_dapo": ("math_dapo", "math", "math_dapo_reasoning"),
    "prime_math": tuple(
        f"numina_{name}"
        for name in (
            "aops_forum",
            "synthetic_math",
            "amc_aime",
            "synthetic_amc",
            "cn_k12",
            "olympiads",
        )
    ),
    "sandbox_fusion / prime_code": ("codecontests", "apps", "codeforces", "taco"),
    "geo3k": ("hiyouga/geometry3k",),
    "search_r1 exact match": tuple(
        f"searchR1_{name}"
        for name in (
            "nq",
            "triviaqa",
            "popqa",
            "hotpotqa",
            "2wikimultihopqa",
            "musique",
            "bamboogle",
        )
    ),
}


@SCORERS.register("openai/gsm8k")
def _gsm8k(data_source: str, solution_str: str, ground_truth: Any, extra_info: Any = None) -> float:
    return gsm8k.compute_score(solution_str, ground_truth)


def _math(data_source: str, solution_str: str, ground_truth: Any, extra_info: Any = None) -> float:
    return math_scorer.compute_score(solution_str, ground_truth)


for _name in MATH_SOURCES:
    SCORERS.add(_name, _math)


def _not_shipped_family(data_source: str) -> str | None:
    if data_source.startswith("aime"):
        return "math_dapo"
    return next((fam for fam, names in NOT_SHIPPED.items() if data_source in names), None)


def _register_demo_task() -> None:
    """Add the demo task's scorer under its data_source (once; a missing module adds nothing)."""
    try:
        demo = importlib.import_module(DEMO_TASK_MODULE)
    except ModuleNotFoundError as exc:
        if exc.name != DEMO_TASK_MODULE:
            raise
        return
    SCORERS.add(demo.DATA_SOURCE, demo.compute_score)


def get_scorer(data_source: str) -> RuleScorer:
    """The scorer for ``data_source``.

    Raises:
        NotImplementedError: a verl data_source whose scorer ppoflow does not ship.
        KeyError: an unknown data_source; the message lists the known ones.
    """
    if data_source not in SCORERS:
        _register_demo_task()
    if data_source in SCORERS:
        return SCORERS.get(data_source)
    family = _not_shipped_family(data_source)
    if family is not None:
        raise NotImplementedError(
            f"data_source {data_source!r} uses verl's {family} scorer, which ppoflow does not ship; "
            f"write compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs) "
            f"in a Python file and set reward.custom_reward_function.path=<file> "
            f"and reward.custom_reward_function.name=<function>"
        )
    raise KeyError(
        f"no reward scorer for data_source {data_source!r}; known: {SCORERS.names()} "
        f"(or set reward.custom_reward_function.path/name to score it yourself)"
    )


def check_data_sources(data_sources: Any) -> None:
    """Raise before any scoring if one of ``data_sources`` has no scorer (see :func:`get_scorer`)."""
    for data_source in sorted({str(ds) for ds in data_sources}):
        get_scorer(data_source)


def default_compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: Any,
    extra_info: Any = None,
    **kwargs: Any,
) -> float | dict[str, Any]:
    """Score one sample with the scorer its ``data_source`` routes to (verl's signature).

    A dict result is returned as is; an int/float/bool becomes a float; any other result is
    converted with ``float(result[0])``, as in verl. Extra ``kwargs`` are accepted and ignored.
    """
    result = get_scorer(data_source)(data_source, solution_str, ground_truth, extra_info)
    if isinstance(result, dict):
        return result
    if isinstance(result, int | float | bool):
        return float(result)
    return float(result[0])
