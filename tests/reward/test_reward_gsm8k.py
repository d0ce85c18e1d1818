"""gsm8k extraction (strict / flexible) and scoring, verl 0.9.1 semantics (fact sheet §5)."""

from __future__ import annotations

import pytest

from stages.reward.scorers.gsm8k import compute_score, extract_solution

STRICT = [
    ("The answer is\n#### 72", "72"),
    ("#### -3", "-3"),
    ("#### 1,234", "1234"),
    ("#### 1,234.5", "1234.5"),
    ("#### $18", None),  # `$` sits between "#### " and the number: the pattern does not match
    ("no marker, just 42", None),
    ("#### 5 first, then #### 6", "6"),  # last match
    ("####7", None),  # the space is required
    ("#### 7" + "x" * 300, None),  # beyond the last 300 characters
    ("x" * 400 + "#### 9", "9"),
    ("#### 3" + "y" * 294, "3"),  # exactly inside the 300-character tail
    ("", None),
]
FLEXIBLE = [
    ("the answer is 42.", "42."),
    ("I got -5 and then 1,000", "1,000"),  # commas kept in flexible mode
    ("costs $5", "5"),
    ("no digits here", None),
    ("just a dot .", "."),  # only "." found: verl returns it (the first candidate)
    ("3 then . and .", "3"),  # trailing "." tokens are skipped
    ("#### 8", "8"),
    ("7" + "z" * 300, None),
]


@pytest.mark.parametrize(("text", "expected"), STRICT)
def test_strict_extraction(text, expected):
    assert extract_solution(text, method="strict") == expected


@pytest.mark.parametrize(("text", "expected"), FLEXIBLE)
def test_flexible_extraction(text, expected):
    assert extract_solution(text, method="flexible") == expected


def test_score_correct_wrong_and_missing():
    assert compute_score("so #### 1,000", "1000") == 1.0
    assert compute_score("#### 999", "1000") == 0.0
    assert compute_score("#### 999", "1000", format_score=0.1) == 0.1
    assert compute_score("no answer", "1000", format_score=0.1) == 0.0
    assert compute_score("#### 1000", "1000", score=2.0) == 2.0
    assert compute_score("answer 1000", "1000", method="flexible") == 1.0


def test_string_comparison_not_numeric():
    assert compute_score("#### 72.0", "72") == 0.0


def test_unknown_method_is_rejected():
    with pytest.raises(ValueError, match="'strict' or 'flexible'"):
        extract_solution("#### 1", method="loose")
