"""The token ledger of a rollout batch: rows, valid tokens, reward positions and the token-mean weight.

For B prompts, n samples per prompt, prompt width P and response width R, row i has a valid
response length L_i ∈ [0, R] (responses are right-padded). The ledger counts

- rows = B·n;
- valid response tokens Σ_i L_i;
- reward positions: one per row with L_i > 0, at column L_i − 1 (the last valid response token);
  a row with L_i = 0 is *aborted* and has no reward position (ppoflow writes nothing into padding,
  where verl's index L_i − 1 = −1 lands on the last column);
- total tokens Σ attention_mask = prompt tokens + Σ_i L_i (P·B·n prompt tokens when computed from
  parameters, i.e. prompts taken as full);
- the token-mean weight 1 / Σ loss-mask tokens: what each valid token weighs in a token-mean loss.
  With dp_size D ranks each rank divides its local sum by the global count and multiplies by D,
  and the DP gradient average divides by D again, so the weight per token stays 1 / Σ L_i.

From a batch, L_i is the response part of ``attention_mask`` (``attention_mask[:, -R:]``, as in
verl), or ``response_mask`` when there is no attention mask; the loss-mask tokens are
Σ ``response_mask`` when present (smaller than Σ L_i for multi-turn rows with tool tokens). When
``rm_scores`` is present the ledger also checks where its non-zero entries sit.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import torch

from dataproto.keys import ATTENTION_MASK, RESPONSE_MASK, RESPONSES, RM_SCORES


@dataclass(frozen=True)
class TokenLedger:
    """Token counts of one batch (module docstring for the definitions).

    Attributes:
        source: ``"parameters"`` or ``"batch"``.
        rows: number of rows (B·n).
        prompt_width, response_width: P and R (padded widths).
        prompt_tokens: valid prompt tokens (P·rows from parameters).
        valid_response_tokens: Σ L_i.
        loss_tokens: Σ response_mask (= Σ L_i from parameters): the token-mean denominator.
        total_tokens: prompt_tokens + valid_response_tokens (= Σ attention_mask).
        aborted_rows: rows with L_i = 0.
        reward_rows: rows with L_i > 0, i.e. the reward positions expected.
        prompts, samples_per_prompt: B and n when given.
        rm_nonzero: non-zero rm_scores entries (None without rm_scores).
        rm_at_last_token: of those, how many sit at (i, L_i − 1) with L_i > 0.
        rm_misplaced: (row, column) of every other non-zero entry.
        dp_size: DP world size for the per-rank note.
    """

    source: str
    rows: int
    prompt_width: int
    response_width: int
    prompt_tokens: int
    valid_response_tokens: int
    loss_tokens: int
    total_tokens: int
    aborted_rows: int
    reward_rows: int
    prompts: int | None = None
    samples_per_prompt: int | None = None
    rm_nonzero: int | None = None
    rm_at_last_token: int | None = None
    rm_misplaced: tuple[tuple[int, int], ...] | None = None
    dp_size: int = 1

    @property
    def token_mean_weight(self) -> float | None:
        """1 / loss_tokens, or None when there is no valid token (a token-mean loss is then NaN)."""
        return 1.0 / self.loss_tokens if self.loss_tokens else None

    def format(self) -> str:
        """Plain-text table of the ledger.

        >>> print(ledger_from_params(2, 2, 4, 4, [4, 2, 0, 1]).format())  # doctest: +NORMALIZE_WHITESPACE
        token ledger (from parameters: B=2 prompts × n=2 samples, P=4, R=4)
          rows (B·n)                            4
          valid response tokens (Σ L_i)         7 of 16 response slots
          prompt tokens                         16
          total tokens (Σ attention_mask)       23
          reward positions (rows with L_i > 0)  3, each at column L_i − 1
          aborted rows (L_i = 0)                1, no reward written
          token-mean weight (1 / Σ mask)        1/7 = 0.142857 per token
        """
        if self.source == "parameters":
            origin = f"B={self.prompts} prompts × n={self.samples_per_prompt} samples, "
        else:
            origin = ""
        title = f"token ledger (from {self.source}: {origin}P={self.prompt_width}, R={self.response_width})"
        slots = self.rows * self.response_width
        lines = [
            ("rows (B·n)", f"{self.rows}"),
            (
                "valid response tokens (Σ L_i)",
                f"{self.valid_response_tokens} of {slots} response slots",
            ),
        ]
        if self.loss_tokens != self.valid_response_tokens:
            lines.append(("loss-mask tokens (Σ response_mask)", f"{self.loss_tokens}"))
        lines += [
            ("prompt tokens", f"{self.prompt_tokens}"),
            ("total tokens (Σ attention_mask)", f"{self.total_tokens}"),
            ("reward positions (rows with L_i > 0)", f"{self.reward_rows}, each at column L_i − 1"),
            ("aborted rows (L_i = 0)", f"{self.aborted_rows}, no reward written"),
            ("token-mean weight (1 / Σ mask)", self._weight_text()),
        ]
        lines += self._dp_lines() + self._rm_lines()
        width = max(len(name) for name, _ in lines)
        return "\n".join([title] + [f"  {name.ljust(width)}  {value}" for name, value in lines])

    def _weight_text(self) -> str:
        if not self.loss_tokens:
            return "undefined: no valid token (a token-mean loss would be NaN)"
        return f"1/{self.loss_tokens} = {1 / self.loss_tokens:.6g} per token"

    def _dp_lines(self) -> list[tuple[str, str]]:
        if self.dp_size == 1 or not self.loss_tokens:
            return []
        per_rank = Fraction(self.dp_size, self.loss_tokens)
        return [
            (
                f"per-rank scale (dp_size={self.dp_size})",
                f"{per_rank} × local sum, then the DP gradient average ÷ {self.dp_size}",
            )
        ]

    def _rm_lines(self) -> list[tuple[str, str]]:
        if self.rm_nonzero is None:
            return []
        misplaced = self.rm_misplaced or ()
        shown = ", ".join(f"({r}, {c})" for r, c in misplaced[:8])
        more = f" … (+{len(misplaced) - 8})" if len(misplaced) > 8 else ""
        return [
            ("rm_scores non-zero entries", f"{self.rm_nonzero}"),
            ("  at the last valid token (L_i − 1)", f"{self.rm_at_last_token}"),
            (
                "  elsewhere (row, column)",
                f"{len(misplaced)}" + (f": {shown}{more}" if misplaced else ""),
            ),
        ]


def _check_count(name: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an integer ≥ {minimum}, got {value!r}")
    return value


def ledger_from_params(
    batch_size: int,
    n: int,
    prompt_len: int,
    response_len: int,
    lengths: list[int] | None = None,
    *,
    dp_size: int = 1,
) -> TokenLedger:
    """The ledger of B prompts × n samples with full prompts of P tokens and responses of width R.

    Args:
        batch_size, n, prompt_len, response_len: B, n, P, R.
        lengths: the B·n valid response lengths L_i (each in [0, R]); default all R.
        dp_size: DP world size, only for the per-rank note.

    Raises:
        ValueError: on a negative size, a lengths count ≠ B·n, or a length outside [0, R].

    >>> led = ledger_from_params(2, 2, 4, 4, [4, 2, 0, 1])
    >>> led.rows, led.valid_response_tokens, led.reward_rows, led.aborted_rows, led.total_tokens
    (4, 7, 3, 1, 23)
    """
    b = _check_count("batch_size (B)", batch_size, 0)
    n = _check_count("n (samples per prompt)", n, 1)
    p = _check_count("prompt_len (P)", prompt_len, 0)
    r = _check_count("response_len (R)", response_len, 0)
    _check_count("dp_size", dp_size, 1)
    rows = b * n
    lengths = [r] * rows if lengths is None else list(lengths)
    if len(lengths) != rows:
        raise ValueError(
            f"got {len(lengths)} lengths, expected B·n = {b}·{n} = {rows} (one per row)"
        )
    for i, length in enumerate(lengths):
        if isinstance(length, bool) or not isinstance(length, int) or not 0 <= length <= r:
            raise ValueError(f"length {length!r} of row {i} is outside [0, R] = [0, {r}]")
    valid = sum(lengths)
    aborted = sum(1 for length in lengths if length == 0)
    return TokenLedger(
        "parameters", rows, p, r, p * rows, valid, valid, p * rows + valid, aborted,
        rows - aborted, prompts=b, samples_per_prompt=n, dp_size=dp_size,
    )  # fmt: skip


def _tensor(data: Any, key: str) -> torch.Tensor | None:
    batch = data.batch
    return None if batch is None else batch.get(key, None)


def ledger_from_batch(data: Any, *, dp_size: int = 1) -> TokenLedger:
    """The ledger of a rollout batch (``responses`` plus ``attention_mask`` or ``response_mask``).

    Raises:
        KeyError: when ``responses`` or both masks are missing.
        ValueError: when a mask's width disagrees with ``responses``.
    """
    responses = _tensor(data, RESPONSES)
    attention = _tensor(data, ATTENTION_MASK)
    response_mask = _tensor(data, RESPONSE_MASK)
    if responses is None or (attention is None and response_mask is None):
        raise KeyError(
            "the token ledger needs batch keys 'responses' and 'attention_mask' (or "
            "'response_mask'); the batch has "
            f"{sorted(data.batch.keys()) if data.batch is not None else 'no tensors'}"
        )
    rows, r = int(responses.shape[0]), int(responses.shape[1])
    if attention is not None:
        if attention.shape[1] < r:
            raise ValueError(f"attention_mask width {attention.shape[1]} < responses width R={r}")
        lengths = attention[:, attention.shape[1] - r :].long().sum(-1)  # (B,) L_i
        prompt_tokens = int(attention[:, : attention.shape[1] - r].long().sum())
        p = int(attention.shape[1]) - r
    else:
        lengths, prompt_tokens, p = response_mask.long().sum(-1), 0, 0
    if response_mask is not None and response_mask.shape[1] != r:
        raise ValueError(f"response_mask width {response_mask.shape[1]} ≠ responses width R={r}")
    loss_tokens = (
        int(response_mask.long().sum()) if response_mask is not None else int(lengths.sum())
    )
    valid, aborted = int(lengths.sum()), int((lengths == 0).sum())
    rm_nonzero, rm_at_last, rm_misplaced = _rm_placement(_tensor(data, RM_SCORES), lengths)
    return TokenLedger(
        "batch", rows, p, r, prompt_tokens, valid, loss_tokens, prompt_tokens + valid, aborted,
        rows - aborted, rm_nonzero=rm_nonzero, rm_at_last_token=rm_at_last,
        rm_misplaced=rm_misplaced, dp_size=dp_size,
    )  # fmt: skip


def _rm_placement(
    rm_scores: torch.Tensor | None, lengths: torch.Tensor
) -> tuple[int | None, int | None, tuple[tuple[int, int], ...] | None]:
    """(non-zero count, count at (i, L_i − 1), other non-zero positions) of ``rm_scores`` (B, R).

    Args:
        rm_scores: (B, R) or None (then all three are None).
        lengths: (B,) valid response lengths L_i.
    """
    if rm_scores is None:
        return None, None, None
    if rm_scores.shape[0] != lengths.shape[0]:
        raise ValueError(f"rm_scores has {rm_scores.shape[0]} rows, responses {lengths.shape[0]}")
    rows_idx, cols_idx = torch.nonzero(rm_scores, as_tuple=True)  # (nnz,), (nnz,)
    at_last = (lengths[rows_idx] > 0) & (cols_idx == lengths[rows_idx] - 1)  # (nnz,)
    wrong = torch.stack([rows_idx[~at_last], cols_idx[~at_last]], dim=-1).tolist()
    return int(rows_idx.numel()), int(at_last.sum()), tuple((r, c) for r, c in wrong)
