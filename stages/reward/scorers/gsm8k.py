"""GSM8K answer extraction and scoring (verl 0.9.1 semantics).

Only the last 300 characters of the response are examined, so an answer early in a long
response is not found. Two extraction modes:

- ``strict``: the last ``#### <number>`` where the number matches ``-?[0-9.,]+``; commas are
  removed (``$`` is removed too, though the pattern cannot capture one, so ``#### $18`` does not
  match at all, as in verl).
- ``flexible``: the last number-like token (``-?[0-9.,]+``) that is not ``""`` or ``"."``; commas
  are kept. If every candidate is ``"."`` the first one is returned, as verl does.

The extracted string is compared with the ground truth as a string: equal gives ``score``
(1.0), a different answer gives ``format_score`` (0.0), no extraction gives 0.

Example:
    >>> extract_solution("so 3 + 4 = 7\\n#### 1,234")
    '1234'
    >>> extract_solution("the answer is 42.", method="flexible")
    '42.'
    >>> compute_score("#### 72", "72")
    1.0
"""

from __future__ import annotations

import re

CLIP_CHARS = 300
_STRICT = re.compile(r"#### (\-?[0-9\.\,]+)")
_NUMBER = re.compile(r"(\-?[0-9\.\,]+)")
_NOT_ANSWERS = ("", ".")


def extract_solution(solution_str: str, method: str = "strict") -> str | None:
    """The answer string in the last 300 characters of ``solution_str``, or None.

    Args:
        solution_str: the decoded response.
        method: ``"strict"`` (``#### <number>``) or ``"flexible"`` (last number-like token).
    """
    tail = solution_str[-CLIP_CHARS:]
    if method == "strict":
        found = _STRICT.findall(tail)
        return found[-1].replace(",", "").replace("$", "") if found else None
    if method == "flexible":
        found = _NUMBER.findall(tail)
        if not found:
            return None
        return next((c for c in reversed(found) if c not in _NOT_ANSWERS), found[0])
    raise ValueError(f"gsm8k extraction method must be 'strict' or 'flexible', got {method!r}")


def compute_score(
    solution_str: str,
    ground_truth: str,
    method: str = "strict",
    format_score: float = 0.0,
    score: float = 1.0,
) -> float:
    """``score`` if the extracted answer equals ``ground_truth`` (as strings), ``format_score``
    if an answer was extracted but differs, 0.0 if none was extracted."""
    answer = extract_solution(solution_str, method=method)
    if answer is None:
        return 0.0
    return score if answer == ground_truth else format_score
