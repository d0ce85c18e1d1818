"""MATH boxed-answer extraction and Hendrycks string normalisation."""

from __future__ import annotations

import pytest

from stages.reward.scorers.math import (
    compute_score,
    is_equiv,
    last_boxed_only_string,
    normalize_answer,
    remove_boxed,
)

BOXED = [
    (r"so \boxed{5}.", r"\boxed{5}"),
    (r"so \boxed{\frac{1}{2}} done", r"\boxed{\frac{1}{2}}"),
    (r"\boxed{\sqrt{\frac{a}{b}}}", r"\boxed{\sqrt{\frac{a}{b}}}"),
    (r"\boxed{1} and later \boxed{2}", r"\boxed{2}"),
    (r"\fbox{3}", r"\fbox{3}"),
    (r"\fbox{1} then \boxed{2}", r"\boxed{2}"),
    (r"$\boxed 5$ end", r"\boxed 5"),
    ("no box at all", None),
    (r"\boxed{1", None),  # never closed
]


@pytest.mark.parametrize(("text", "expected"), BOXED)
def test_last_boxed(text, expected):
    assert last_boxed_only_string(text) == expected


@pytest.mark.parametrize(
    ("boxed", "content"),
    [
        (r"\boxed{\frac{1}{2}}", r"\frac{1}{2}"),
        (r"\fbox{3}", "3"),
        (r"\boxed 5", "5"),
        ("oops", None),
    ],
)
def test_remove_boxed(boxed, content):
    assert remove_boxed(boxed) == content


NORMALIZE = [
    (r"\left( 3, \dfrac{1}{2} \right)", r"(3,\frac{1}{2})"),
    ("0.5", r"\frac{1}{2}"),
    (".5", r"\frac{1}{2}"),
    ("1/2", r"\frac{1}{2}"),
    (r"\tfrac12", r"\frac{1}{2}"),
    (r"\frac1{2}", r"\frac{1}{2}"),
    (r"\sqrt3", r"\sqrt{3}"),
    (r"90^\circ", "90"),
    (r"90^{\circ}", "90"),
    (r"\$5", "5"),
    (r"10\%", "10"),
    ("5%", "5%"),  # a bare % stays, as in Hendrycks
    (r"5 \text{ cm}", "5"),
    ("x = 3", "3"),
    ("abc = 3", "abc=3"),  # the prefix is removed only when it is at most 2 characters
    ("a/b", "a/b"),
    ("1/2/3", "1/2/3"),
    (r"3\!000", "3000"),
    ("\n5", "5"),
    ("0.25", "0.25"),  # only 0.5 has a fraction equivalent
    ("", ""),
]


@pytest.mark.parametrize(("raw", "normal"), NORMALIZE)
def test_normalize(raw, normal):
    assert normalize_answer(raw) == normal


def test_compute_score():
    assert compute_score(r"The answer is $\boxed{\dfrac{1}{2}}$.", "0.5") == 1.0
    assert compute_score(r"\boxed{1/2}", r"\frac12") == 1.0
    assert (
        compute_score(r"\fbox{7}", "7") == 1.0
    )  # verl scores \fbox answers 0 (documented difference)
    assert compute_score(r"\boxed{1} then \boxed{2}", "1") == 0.0  # the last box counts
    assert compute_score(r"\boxed{0.25}", "1/4") == 0.0
    assert compute_score("7", "7") == 0.0  # no box, no score


def test_is_equiv_none():
    assert is_equiv(None, None)
    assert not is_equiv(None, "1")
