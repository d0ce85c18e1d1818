"""The hidden states that predict each response token, from one decoder forward in a chosen layout.

The response token at column t ≥ P of a (B, T = P + R) sequence is predicted from the hidden state
at t − 1, so the R response tokens read the hidden states at columns P − 1 … T − 2 (verl's
``[:, -R - 1 : -1]``); the actor's log-probs and the critic's values both start from them. How the
forward sees the batch is an entry of :data:`FORWARD_LAYOUTS`:

* ``full``: every column as given (B, T);
* ``trimmed``: the columns some row needs (``stages.engines.trimming.real_span``);
* ``packed``: the rows' real tokens back to back (``stages.engines.packing``; verl's
  ``use_remove_padding``): one row and a variable-length attention kernel where one fits the
  model's device and dtype, no (N × N) mask; elsewhere narrow rows with a block-diagonal mask.

Every layout returns ((B, R', H) hidden states, (B, R') bool ``real`` or None) with R' ≤ R the
response columns it kept (the rest are padding in every row); where ``real`` is False (packed: no
real token there) callers write 0. In float32 the layouts agree within 1e-5.
"""

from __future__ import annotations

from collections.abc import Callable

from torch import Tensor, nn

from stages.engines.packing import packed_response_hidden
from stages.engines.trimming import real_span

ResponseHidden = tuple[Tensor, Tensor | None]


def full_response_hidden(
    decoder: nn.Module,
    input_ids: Tensor,
    attention_mask: Tensor,
    position_ids: Tensor,
    response_length: int,
) -> ResponseHidden:
    """One forward over all T columns; (B, R, H) and no ``real`` mask."""
    total = input_ids.shape[1]
    hidden = decoder(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids,
        use_cache=False,
    ).last_hidden_state  # (B, T, H)
    return hidden[:, total - response_length - 1 : total - 1], None


def trimmed_response_hidden(
    decoder: nn.Module,
    input_ids: Tensor,
    attention_mask: Tensor,
    position_ids: Tensor,
    response_length: int,
) -> ResponseHidden:
    """One forward over the columns ``[start, stop)`` some row needs; (B, R', H),
    R' = stop − P."""
    start, stop = real_span(attention_mask, response_length)
    kept = stop - (input_ids.shape[1] - response_length)
    return full_response_hidden(
        decoder,
        input_ids[:, start:stop],
        attention_mask[:, start:stop],
        position_ids[..., start:stop],
        kept,
    )


#: layout name → the function that runs the forward in it
FORWARD_LAYOUTS: dict[str, Callable[..., ResponseHidden]] = {
    "full": full_response_hidden,
    "trimmed": trimmed_response_hidden,
    "packed": packed_response_hidden,
}


def forward_layout(use_remove_padding: bool) -> str:
    """The layout a role's ``use_remove_padding`` asks for: ``packed`` or ``trimmed``."""
    return "packed" if use_remove_padding else "trimmed"


def response_hidden_states(
    decoder: nn.Module,
    input_ids: Tensor,
    attention_mask: Tensor,
    position_ids: Tensor,
    response_length: int,
    layout: str = "trimmed",
) -> ResponseHidden:
    """The :data:`FORWARD_LAYOUTS` entry ``layout`` on a (B, T) batch whose last
    ``response_length`` = R columns are the response; ValueError for R outside 1..T − 1 or an
    unknown layout."""
    total = input_ids.shape[1]
    if not 0 < response_length < total:
        raise ValueError(
            f"response_length must be in 1..{total - 1} for sequences of {total} tokens, "
            f"got {response_length}"
        )
    run = FORWARD_LAYOUTS.get(layout)
    if run is None:
        raise ValueError(f"unknown forward layout {layout!r}; known: {sorted(FORWARD_LAYOUTS)}")
    return run(decoder, input_ids, attention_mask, position_ids, response_length)


__all__ = [
    "FORWARD_LAYOUTS",
    "forward_layout",
    "full_response_hidden",
    "response_hidden_states",
    "trimmed_response_hidden",
]
