r"""MATH answer extraction and Hendrycks-style string normalisation (verl's ``math_reward``).

The answer is the content of the LAST ``\boxed{...}`` (braces may nest), ``\boxed <text>`` (the
space form, up to the next ``$``) or ``\fbox{...}`` in the response. It is compared with the
ground truth after both go through :func:`normalize_answer` (Hendrycks et al., 2021, "Measuring
Mathematical Problem Solving With the MATH Dataset"): 1.0 when equal, else 0.0.

Difference from verl: verl finds ``\fbox{...}`` but its ``remove_boxed`` only accepts
``\boxed{``, so an ``\fbox`` answer always scores 0 there; here its content is compared.

Example:
    >>> last_boxed_only_string(r"first \boxed{1}, then \boxed{\frac{1}{2}}.")
    '\\boxed{\\frac{1}{2}}'
    >>> normalize_answer(r"\dfrac12")
    '\\frac{1}{2}'
    >>> compute_score(r"So $x = \boxed{0.5}$", r"\frac{1}{2}")
    1.0
"""

from __future__ import annotations

_BOXED_SPACE = "\\boxed "
_OPENERS = ("\\boxed{", "\\fbox{")


def last_boxed_only_string(text: str) -> str | None:
    r"""The last ``\boxed{...}`` / ``\boxed ...`` / ``\fbox{...}`` span of ``text``, or None.

    ``\boxed`` is looked for first: the space form wins whenever it appears anywhere, then the
    last ``\boxed``; ``\fbox`` only when there is no ``\boxed``. A box whose braces never close
    gives None.
    """
    if _BOXED_SPACE in text:
        return _BOXED_SPACE + text.split(_BOXED_SPACE)[-1].split("$")[0]
    start = text.rfind("\\boxed")
    if start < 0:
        start = text.rfind("\\fbox")
        if start < 0:
            return None
    depth = 0
    for i in range(start, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return text[start : i + 1]
    return None


def remove_boxed(boxed: str) -> str | None:
    r"""The content of a span from :func:`last_boxed_only_string` (None if it is not one)."""
    if boxed.startswith(_BOXED_SPACE):
        return boxed[len(_BOXED_SPACE) :]
    for opener in _OPENERS:
        if boxed.startswith(opener) and boxed.endswith("}"):
            return boxed[len(opener) : -1]
    return None


def _remove_right_units(text: str) -> str:
    # "\text{ " (with a space) only ever introduces units in MATH answers.
    parts = text.split("\\text{ ")
    return parts[0] if len(parts) == 2 else text


def _fix_sqrt(text: str) -> str:
    r"""``\sqrt3`` → ``\sqrt{3}`` (one-character radicands only)."""
    parts = text.split("\\sqrt")
    fixed = parts[0]
    for part in parts[1:]:
        if part and part[0] != "{":
            fixed += "\\sqrt{" + part[0] + "}" + part[1:]
        else:
            fixed += "\\sqrt" + part
    return fixed


def _fix_fracs(text: str) -> str:
    r"""``\frac12`` → ``\frac{1}{2}``, ``\frac1{2}`` → ``\frac{1}{2}``; unchanged if too short."""
    parts = text.split("\\frac")
    fixed = parts[0]
    for part in parts[1:]:
        fixed += "\\frac"
        if part and part[0] == "{":
            fixed += part
            continue
        if len(part) < 2:
            return text
        num, den, rest = part[0], part[1], part[2:]
        fixed += "{" + num + "}" + (den if den == "{" else "{" + den + "}") + rest
    return fixed


def _fix_a_slash_b(text: str) -> str:
    r"""``3/4`` → ``\frac{3}{4}`` when both sides are plain integers; otherwise unchanged."""
    parts = text.split("/")
    if len(parts) != 2:
        return text
    try:
        num, den = int(parts[0]), int(parts[1])
    except ValueError:
        return text
    if text != f"{num}/{den}":
        return text
    return "\\frac{" + str(num) + "}{" + str(den) + "}"


_DELETIONS = ("\n", "\\!")
_REPLACEMENTS = (
    ("\\\\", "\\"),
    ("tfrac", "frac"),
    ("dfrac", "frac"),
    ("\\left", ""),
    ("\\right", ""),
    ("^{\\circ}", ""),
    ("^\\circ", ""),
    ("\\$", ""),
)


def normalize_answer(text: str) -> str:
    r"""Hendrycks' ``strip_string``: a canonical string for comparing two answers.

    In order: drop newlines and ``\!``; ``\\`` → ``\``; ``tfrac``/``dfrac`` → ``frac``; drop
    ``\left``, ``\right``, degree marks, ``\$``, units after ``\text{ ``, ``\%`` (a bare ``%`` stays);
    ``" ."``/``"{."`` → ``" 0."``/``"{0."`` and a leading ``.`` gets a ``0``; a short ``x =``
    prefix (≤ 2 characters before the only ``=``) is removed; ``\sqrt3`` → ``\sqrt{3}``; spaces
    removed; ``\frac12`` → ``\frac{1}{2}``; exactly ``0.5`` → ``\frac{1}{2}``; ``a/b`` with
    integers → ``\frac{a}{b}``.

    >>> normalize_answer(r"\left( 3, \dfrac{1}{2} \right)")
    '(3,\\frac{1}{2})'
    >>> normalize_answer("k = .5")
    '\\frac{1}{2}'
    """
    for old in _DELETIONS:
        text = text.replace(old, "")
    for old, new in _REPLACEMENTS:
        text = text.replace(old, new)
    text = _remove_right_units(text)
    text = text.replace("\\%", "")
    text = text.replace(" .", " 0.").replace("{.", "{0.")
    if not text:
        return text
    if text[0] == ".":
        text = "0" + text
    sides = text.split("=")
    if len(sides) == 2 and len(sides[0]) <= 2:
        text = sides[1]
    text = _fix_sqrt(text)
    text = text.replace(" ", "")
    text = _fix_fracs(text)
    if text == "0.5":
        text = "\\frac{1}{2}"
    return _fix_a_slash_b(text)


def is_equiv(answer: str | None, ground_truth: str | None) -> bool:
    """Equal after normalisation (two Nones are equal; one None is not)."""
    if answer is None or ground_truth is None:
        return answer is None and ground_truth is None
    return normalize_answer(answer) == normalize_answer(ground_truth)


def compute_score(solution_str: str, ground_truth: str) -> float:
    r"""1.0 if the last boxed answer of ``solution_str`` is equivalent to ``ground_truth``, else 0.0."""
    boxed = last_boxed_only_string(solution_str)
    if boxed is None:
        return 0.0
    return 1.0 if is_equiv(remove_boxed(boxed), ground_truth) else 0.0
