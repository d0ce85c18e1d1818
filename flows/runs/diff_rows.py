"""How two artifacts of one stage differ, sample by sample (``ppoflow diff``, flows/runs/diff.py).

Each side is a stage's artifact of one run with its ``inverse``: ``inverse[i]`` is the artifact
row that holds generation row i (flows/runs/samples.py replays the balance stage's reorder to get
it; the identity for the step input and the rollout). Both sides are read through their own
inverse, so generation row i of one run is compared with generation row i of the other even when
the two runs' balance stages ordered their batches differently.

:func:`compare_artifacts` returns

- :class:`KeyDiff` per key that differs: tensor and non-tensor columns present on one side only,
  of another shape or dtype, or with rows whose values differ (NaN equals NaN; a tensor compares
  by value, a non-tensor cell with ``dataproto.equality.deep_equal``); ``meta_info`` entries whose
  values differ (``loose_equal``);
- the first differing generation row and the keys that differ in it;
- :class:`TokenKeyDiff` per token-level key (:data:`TOKEN_KEYS`: the log-probs, advantages,
  returns, values, token-level scores and rewards) that differs with the same (B, R) shape: the
  tokens compared (where both runs' ``response_mask`` is 1: tokens the model sampled in both),
  how many differ, and the :data:`TOP_TOKENS` largest |b − a|, each with its generation row,
  response position (a span of consecutive tokens of the row that hold the same two values,
  e.g. the one advantage an outcome estimator gives every token of a response) and, for a
  log-prob key, the ratio exp(b − a) (the probability ratio π_b / π_a of that token).

A stage recorded as skipped on one side has no artifact there (``data`` None): every key of the
other side is a key on one side only, and no row is compared.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import torch

from dataproto import DataProto
from dataproto import keys as K
from dataproto.equality import deep_equal, loose_equal

Layer = Literal["tensor", "non_tensor", "meta_info"]
#: the largest per-token differences shown per key
TOP_TOKENS = 5
#: token-level keys whose difference is a log-probability ratio
LOG_PROB_KEYS = (K.OLD_LOG_PROBS, K.REF_LOG_PROB, K.ROLLOUT_LOG_PROBS)
#: the (B, R) float keys whose largest per-token differences are shown
TOKEN_KEYS = (
    *LOG_PROB_KEYS,
    K.ADVANTAGES,
    K.RETURNS,
    K.VALUES,
    K.TOKEN_LEVEL_SCORES,
    K.TOKEN_LEVEL_REWARDS,
)


@dataclass
class Side:
    """One run's artifact of the stage (None: the run skipped the stage) and its inverse
    (``inverse[i]``: the artifact row of generation row i; None when rows are not compared)."""

    data: DataProto | None
    inverse: np.ndarray | None = None


@dataclass
class KeyDiff:
    """One key that differs: its layer, shape and dtype on each side (None: absent there), and
    the generation rows whose values differ (``rows`` None when the rows cannot be compared: a
    key on one side only, or of another shape)."""

    key: str
    layer: Layer
    shape_a: list[int] | None
    shape_b: list[int] | None
    dtype_a: str | None
    dtype_b: str | None
    rows: list[int] | None = None

    @property
    def first_row(self) -> int | None:
        return self.rows[0] if self.rows else None


@dataclass
class TokenDiff:
    """Consecutive tokens of a generation row where a token-level key holds the same two values:
    the row, the first and last response position, both values, |b − a| and, for a log-prob
    key, exp(b − a)."""

    row: int
    token: int
    last: int
    a: float
    b: float
    delta: float
    ratio: float | None = None


@dataclass
class TokenKeyDiff:
    """The per-token differences of one token-level key over the response mask."""

    key: str
    compared: int  # tokens where both runs' response_mask is 1
    differing: int  # of those, the tokens whose values differ
    top: list[TokenDiff] = field(default_factory=list)


@dataclass
class ArtifactDiff:
    """What :func:`compare_artifacts` found (module docstring)."""

    keys: list[KeyDiff]
    first_row: int | None
    row_keys: list[str]  # the keys that differ in ``first_row``
    tokens: list[TokenKeyDiff]
    rows: int | None  # the rows compared (None: not compared)


# --- one key -----------------------------------------------------------------------------------


def _dtype_name(value: Any) -> str:
    return str(value.dtype).removeprefix("torch.")


def _differing_tensor_rows(a: torch.Tensor, b: torch.Tensor) -> list[int]:
    """Rows (dim 0) of two same-shaped tensors whose values differ (by value; NaN equals NaN).

    >>> _differing_tensor_rows(torch.tensor([[1, 2], [3, 4]]), torch.tensor([[1.0, 2.0], [3.0, 5.0]]))
    [1]
    >>> nan = float("nan")
    >>> _differing_tensor_rows(torch.tensor([nan, 1.0]), torch.tensor([nan, 2.0]))
    [1]
    """
    if len(a) == 0:
        return []
    if a.is_floating_point() or b.is_floating_point():
        x, y = a.double(), b.double()
        same = (x == y) | (torch.isnan(x) & torch.isnan(y))
    else:
        same = a.long() == b.long()
    return torch.nonzero(~same.reshape(len(a), -1).all(1)).flatten().tolist()


def _differing_cells(a: np.ndarray, b: np.ndarray) -> list[int]:
    """Rows of two same-shaped non-tensor arrays whose cells differ (``deep_equal``)."""
    return [i for i in range(len(a)) if not deep_equal(a[i], b[i])]


def _in_generation_order(value: Any, inverse: np.ndarray) -> Any:
    if isinstance(value, torch.Tensor):
        return value[torch.as_tensor(inverse)]
    return value[inverse]


def _key_diff(key: str, layer: Layer, a: Any, b: Any, sa: Side, sb: Side) -> KeyDiff | None:
    """The difference of column ``key`` (a or b None: absent on that side), or None if equal."""
    found = KeyDiff(
        key,
        layer,
        None if a is None else list(a.shape),
        None if b is None else list(b.shape),
        None if a is None else _dtype_name(a),
        None if b is None else _dtype_name(b),
    )
    if a is None or b is None or found.shape_a != found.shape_b:
        return found
    if sa.inverse is None or sb.inverse is None:  # not row by row: the whole column
        return None if deep_equal(a, b) else found
    x, y = _in_generation_order(a, sa.inverse), _in_generation_order(b, sb.inverse)
    if layer == "tensor":
        found.rows = _differing_tensor_rows(x, y)
    else:
        found.rows = _differing_cells(x, y)
    if not found.rows and found.dtype_a == found.dtype_b:
        return None
    return found


def _columns(data: DataProto | None) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    if data is None:
        return {}, {}, {}
    tensors = dict(data.batch.items()) if data.batch is not None else {}
    return tensors, dict(data.non_tensor_batch or {}), dict(data.meta_info or {})


def _meta_diff(key: str, a: dict[str, Any], b: dict[str, Any]) -> KeyDiff | None:
    if key in a and key in b and loose_equal(a[key], b[key]):
        return None
    return KeyDiff(key, "meta_info", None, None, _kind(a, key), _kind(b, key))


def _kind(meta: dict[str, Any], key: str) -> str | None:
    """A meta_info value's type name (its "dtype" in the key table), None when absent."""
    return type(meta[key]).__name__ if key in meta else None


def _union(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    """Both dicts' keys: a's in order, then b's others."""
    return [*a, *(key for key in b if key not in a)]


# --- tokens ------------------------------------------------------------------------------------


def _token_diff(
    key: str, a: torch.Tensor, b: torch.Tensor, mask: torch.Tensor | None, top: int
) -> TokenKeyDiff:
    """The differences of one (B, R) key in generation order over ``mask`` ((B, R) bool; None:
    every token). Consecutive differing tokens of a row with the same two values are one entry
    (an outcome estimator gives every token of a response one advantage); the entries are
    ranked by |b − a|, ties in row and token order."""
    x, y = a.double(), b.double()
    delta = (y - x).abs()
    delta = torch.where(torch.isnan(x) & torch.isnan(y), torch.zeros_like(delta), delta)
    delta = torch.nan_to_num(delta, nan=math.inf)  # a NaN against a number ranks first
    where = torch.ones_like(delta, dtype=torch.bool) if mask is None else mask
    rows, tokens = torch.nonzero(where & (delta > 0), as_tuple=True)  # row-major order
    found = TokenKeyDiff(key, int(where.sum()), len(rows))
    if not len(rows):
        return found
    va, vb = x[rows, tokens], y[rows, tokens]
    same = lambda v: (v[1:] == v[:-1]) | (torch.isnan(v[1:]) & torch.isnan(v[:-1]))  # noqa: E731
    goes_on = (rows[1:] == rows[:-1]) & (tokens[1:] == tokens[:-1] + 1) & same(va) & same(vb)
    starts = torch.cat([torch.tensor([0]), torch.nonzero(~goes_on).flatten() + 1])
    ends = torch.cat([starts[1:] - 1, torch.tensor([len(rows) - 1])])
    order = torch.sort(-delta[rows[starts], tokens[starts]], stable=True).indices[:top]
    for first, last in zip(starts[order].tolist(), ends[order].tolist(), strict=True):
        a_value, b_value = float(va[first]), float(vb[first])
        change = b_value - a_value
        ratio = math.exp(change) if key in LOG_PROB_KEYS and math.isfinite(change) else None
        row, token = int(rows[first]), int(tokens[first])
        found.top.append(
            TokenDiff(
                row=row,
                token=token,
                last=int(tokens[last]),
                a=a_value,
                b=b_value,
                delta=float(delta[row, token]),
                ratio=ratio,
            )
        )
    return found


def _token_diffs(
    keys: Sequence[KeyDiff],
    tensors: tuple[dict[str, Any], dict[str, Any]],
    sides: tuple[Side, Side],
    mask: torch.Tensor | None,
    top: int,
) -> list[TokenKeyDiff]:
    out = []
    for diff in keys:
        if diff.key not in TOKEN_KEYS or diff.layer != "tensor" or diff.rows is None:
            continue
        if diff.shape_a is None or len(diff.shape_a) != 2:
            continue
        a, b = (_in_generation_order(t[diff.key], s.inverse) for t, s in zip(tensors, sides))
        use = mask if mask is not None and tuple(mask.shape) == tuple(a.shape) else None
        out.append(_token_diff(diff.key, a, b, use, top))
    return out


# --- the artifact ------------------------------------------------------------------------------


def compare_artifacts(
    a: Side, b: Side, mask: torch.Tensor | None = None, top: int = TOP_TOKENS
) -> ArtifactDiff:
    """How side ``b`` differs from side ``a`` (module docstring). ``mask``: (B, R) bool in
    generation order, the tokens the per-token differences are taken over."""
    (ta, na, ma), (tb, nb, mb) = _columns(a.data), _columns(b.data)
    keys = [_key_diff(k, "tensor", ta.get(k), tb.get(k), a, b) for k in _union(ta, tb)]
    keys += [_key_diff(k, "non_tensor", na.get(k), nb.get(k), a, b) for k in _union(na, nb)]
    keys += [_meta_diff(k, ma, mb) for k in _union(ma, mb)]
    found = [key for key in keys if key is not None]
    firsts = [key.first_row for key in found if key.first_row is not None]
    first = min(firsts) if firsts else None
    row_keys = [key.key for key in found if key.rows and first in key.rows]
    compared = a.data is not None and b.data is not None and a.inverse is not None
    return ArtifactDiff(
        keys=found,
        first_row=first,
        row_keys=row_keys,
        tokens=_token_diffs(found, (ta, tb), (a, b), mask, top) if compared else [],
        rows=len(a.inverse) if compared and a.inverse is not None else None,
    )


__all__ = [
    "LOG_PROB_KEYS",
    "TOKEN_KEYS",
    "TOP_TOKENS",
    "ArtifactDiff",
    "KeyDiff",
    "Side",
    "TokenDiff",
    "TokenKeyDiff",
    "compare_artifacts",
]
