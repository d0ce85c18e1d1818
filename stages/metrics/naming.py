r"""One-to-one MLflow metric-name sanitizer (docs/differences.md, deliberate difference 4).

MLflow (``mlflow/utils/validation.py``, 3.x) accepts a metric name only if

1. every character matches ``[/\w.\- :]`` (Python ``\w``: Unicode letters and digits and ``_``;
   the colon is refused on Windows servers),
2. it is a normalized relative path: ``posixpath.normpath(name) == name``, not ``.``, not starting
   with ``..`` or ``/`` (so no empty, ``.`` or ``..`` segment, no leading, trailing or double
   slash), and
3. it has at most 250 characters.

verl's names break rule 1 (``val-core/gsm8k/acc/mean@4``). :func:`sanitize_metric_name` rewrites
each refused character as an escape token ``_<code>_`` and leaves every other character alone,
so ordinary names (``actor/pg_loss``, ``timing_s/gen``) are unchanged. The tokens
(``CHARACTER_CODES``)::

    @ _at_     ( _lp_     ) _rp_     % _pct_    + _plus_   = _eq_     , _comma_  # _hash_
    [ _lb_     ] _rb_     { _lc_     } _rc_     < _lt_     > _gt_     & _amp_    * _star_
    | _pipe_   ! _bang_   ? _qm_     ' _sq_     " _dq_     ; _semi_   ^ _caret_  ~ _tilde_
    \ _bs_     $ _dollar_ ` _grave_  any other refused character c: _u<hex code point of c>_

The code point is lower-case hex with at least 4 digits (a tab is ``_u0009_``; ``é`` is a
``\w`` letter and stays). Rule 2 adds three context-dependent escapes: ``/`` → ``_sl_`` when it is
the first or last character or is followed by another ``/``; ``.`` → ``_dot_`` inside a segment
that is exactly ``.`` or ``..``, and the first dot of a name starting with ``..``.

Injectivity: the escape character ``_`` is itself escaped as ``_us_`` exactly when, in the
output, it would otherwise start something that reads as a token (``a_at_b`` becomes
``a_us_at_b``, while ``a@b`` becomes ``a_at_b``). :func:`restore_metric_name` reads left to
right, decoding a token where one starts and copying every other character, so
``restore_metric_name(sanitize_metric_name(x)) == x`` for every name: two different names never
share a sanitized form.
"""

from __future__ import annotations

import re

#: MLflow's per-character rule for metric names on POSIX servers
ALLOWED_CHARACTER = re.compile(r"[/\w.\- :]")
#: MLflow's MAX_ENTITY_KEY_LENGTH for metric names
MAX_NAME_LENGTH = 250

CHARACTER_CODES = {
    "@": "at",
    "(": "lp",
    ")": "rp",
    "%": "pct",
    "+": "plus",
    "=": "eq",
    ",": "comma",
    "#": "hash",
    "[": "lb",
    "]": "rb",
    "{": "lc",
    "}": "rc",
    "<": "lt",
    ">": "gt",
    "&": "amp",
    "*": "star",
    "|": "pipe",
    "!": "bang",
    "?": "qm",
    "'": "sq",
    '"': "dq",
    ";": "semi",
    "^": "caret",
    "~": "tilde",
    "\\": "bs",
    "$": "dollar",
    "`": "grave",
    "/": "sl",
    ".": "dot",
    "_": "us",
}
_CHARACTER_OF_CODE = {code: char for char, code in CHARACTER_CODES.items()}
_TOKEN = re.compile(r"_([a-z0-9]+)_")
_CODE_POINT = re.compile(r"u([0-9a-f]{4,6})")


def _token_at(text: str, start: int) -> tuple[str, int] | None:
    """(decoded character, token length) if an escape token starts at ``start``, else None."""
    match = _TOKEN.match(text, start)
    if match is None:
        return None
    code = match.group(1)
    if code in _CHARACTER_OF_CODE:
        return _CHARACTER_OF_CODE[code], match.end() - start
    hex_digits = _CODE_POINT.fullmatch(code)
    if hex_digits is not None and int(hex_digits.group(1), 16) <= 0x10FFFF:
        return chr(int(hex_digits.group(1), 16)), match.end() - start
    return None


def _token(char: str) -> str:
    code = CHARACTER_CODES.get(char, f"u{ord(char):04x}")
    return f"_{code}_"


def _path_escapes(name: str) -> set[int]:
    """Indices of ``/`` and ``.`` that must be escaped for MLflow's normalized-path rule."""
    escaped = {
        i
        for i, char in enumerate(name)
        if char == "/" and (i == 0 or i == len(name) - 1 or name[i + 1] == "/")
    }
    start = 0
    for segment in name.split("/"):
        if segment in (".", ".."):
            escaped.update(range(start, start + len(segment)))
        start += len(segment) + 1
    if name.startswith(".."):
        escaped.add(0)
    return escaped


def sanitize_metric_name(name: str) -> str:
    """The MLflow-safe, reversible form of ``name`` (mapping in the module docstring).

    Raises ``ValueError`` for an empty name, or when the result exceeds MLflow's 250 characters.

    Example:
        >>> sanitize_metric_name("val-core/gsm8k/acc/best@4/mean")
        'val-core/gsm8k/acc/best_at_4/mean'
        >>> sanitize_metric_name("actor/pg_loss"), sanitize_metric_name("a_at_b"), sanitize_metric_name("f(x)%")
        ('actor/pg_loss', 'a_us_at_b', 'f_lp_x_rp__pct_')
    """
    if not name:
        raise ValueError("metric name must be non-empty, got ''")
    path_escapes = _path_escapes(name)
    tail = ""  # the sanitized form of name[i + 1:], built right to left
    for i in range(len(name) - 1, -1, -1):
        char = name[i]
        if i in path_escapes or not ALLOWED_CHARACTER.fullmatch(char):
            piece = _token(char)
        elif char == "_" and _token_at("_" + tail, 0) is not None:
            piece = _token("_")
        else:
            piece = char
        tail = piece + tail
    if len(tail) > MAX_NAME_LENGTH:
        raise ValueError(
            f"metric name {name!r} sanitizes to {len(tail)} characters, over MLflow's limit of "
            f"{MAX_NAME_LENGTH}; shorten the name"
        )
    return tail


def restore_metric_name(sanitized: str) -> str:
    """Inverse of :func:`sanitize_metric_name`: decode every escape token, left to right.

    Example:
        >>> restore_metric_name("val-core/gsm8k/acc/best_at_4/mean")
        'val-core/gsm8k/acc/best@4/mean'
        >>> restore_metric_name("a_us_at_b")
        'a_at_b'
    """
    pieces, i = [], 0
    while i < len(sanitized):
        token = _token_at(sanitized, i) if sanitized[i] == "_" else None
        if token is None:
            pieces.append(sanitized[i])
            i += 1
        else:
            pieces.append(token[0])
            i += token[1]
    return "".join(pieces)


def sanitize_metrics(metrics: dict[str, float]) -> dict[str, float]:
    """The same metrics under sanitized names (one-to-one, so no two keys merge).

    Example:
        >>> sanitize_metrics({"val-aux/ds/reward/std@4": 0.5, "actor/pg_loss": 1.0})
        {'val-aux/ds/reward/std_at_4': 0.5, 'actor/pg_loss': 1.0}
    """
    return {sanitize_metric_name(name): value for name, value in metrics.items()}


def renamed_metrics(names: list[str]) -> dict[str, str]:
    """sanitized → original for the names the sanitizer changes (to log next to the run).

    Example:
        >>> renamed_metrics(["actor/pg_loss", "val-core/ds/acc/mean@4"])
        {'val-core/ds/acc/mean_at_4': 'val-core/ds/acc/mean@4'}
    """
    return {sanitized: name for name in names if (sanitized := sanitize_metric_name(name)) != name}


def escape_markdown_table() -> str:
    """The character → token mapping as a Markdown table, for ``docs/metrics.md``.

    Example:
        >>> escape_markdown_table().splitlines()[2]
        '| `@` | `_at_` | always |'
    """
    context = {
        "/": "first or last character, or followed by another `/`",
        ".": "inside a segment that is exactly `.` or `..`, or the first dot of a name starting with `..`",
        "_": "when the output would otherwise read as a token here (`a_at_b` → `a_us_at_b`)",
    }
    lines = ["| character | token | when |", "|---|---|---|"]
    for char, code in CHARACTER_CODES.items():
        shown = "`` ` ``" if char == "`" else f"`{char}`".replace("|", "\\|")
        lines.append(f"| {shown} | `_{code}_` | {context.get(char, 'always')} |")
    lines.append(
        "| any other character MLflow refuses | `_u<hex>_` (code point, ≥ 4 lower-case hex digits) | always |"
    )
    return "\n".join(lines)
