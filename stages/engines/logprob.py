"""Per-token log-probabilities (and entropy) of the response tokens under a causal LM.

The response token at position t of the full sequence (t ≥ P) is predicted from the hidden state
at t − 1, so for a (B, T = P + R) sequence the R response tokens use the hidden states at
positions P − 1 … T − 2. The vocabulary projection, the temperature scaling and the log-softmax are
done ``chunk_tokens`` response positions at a time, so no float32 (B, T, V) logits tensor is ever
held at once; with ``requires_grad`` each chunk larger than ``RECOMPUTE_ABOVE_BYTES`` is
recomputed in the backward pass (activation checkpointing), so the autograd graph does not keep
large chunks' logits either.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from stages.engines.response_hidden import response_hidden_states
from stages.engines.trimming import pad_response_columns

#: response positions per vocabulary-projection chunk (chunk logits are chunk·B·V floats)
DEFAULT_CHUNK_TOKENS = 256
#: a chunk whose float32 logits are smaller than this keeps them for backward instead of
#: recomputing them (recompute costs a second vocabulary projection; small logits are cheap to keep)
RECOMPUTE_ABOVE_BYTES = 64 << 20


def _logits_bytes(hidden_chunk: Tensor, lm_head: nn.Module) -> int:
    """Bytes of the float32 (B, C, V) logits of one chunk."""
    return hidden_chunk.shape[0] * hidden_chunk.shape[1] * lm_head.weight.shape[0] * 4


def token_logprobs_and_entropy(
    logits: Tensor, labels: Tensor, calculate_entropy: bool
) -> tuple[Tensor, Tensor | None]:
    """log p(labels) and the entropy of softmax(logits), computed in float32.

    Args:
        logits: (..., V) already divided by the temperature.
        labels: (...) int64 token ids.

    Returns:
        ((...) log-probs, (...) entropy or None). Entropy = logsumexp(z) − Σ softmax(z)·z.

    Example:
        >>> lp, ent = token_logprobs_and_entropy(torch.zeros(1, 4), torch.tensor([2]), True)
        >>> round(lp.item(), 4), round(ent.item(), 4)
        (-1.3863, 1.3863)
    """
    logits = logits.float()
    log_norm = torch.logsumexp(logits, dim=-1)
    logprobs = logits.gather(-1, labels.unsqueeze(-1)).squeeze(-1) - log_norm
    if not calculate_entropy:
        return logprobs, None
    probs = torch.softmax(logits, dim=-1)
    entropy = log_norm - (probs * logits).sum(-1)
    return logprobs, entropy


def _project_chunk(
    hidden: Tensor, labels: Tensor, lm_head: nn.Module, temperature: float, calculate_entropy: bool
) -> tuple[Tensor, Tensor]:
    logits = lm_head(hidden) / temperature  # (B, C, V)
    logprobs, entropy = token_logprobs_and_entropy(logits, labels, calculate_entropy)
    return logprobs, (entropy if entropy is not None else torch.zeros_like(logprobs))


def response_logprobs(
    model: nn.Module,
    input_ids: Tensor,
    attention_mask: Tensor,
    position_ids: Tensor,
    response_length: int,
    *,
    temperature: float = 1.0,
    calculate_entropy: bool = False,
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
    layout: str = "trimmed",
) -> tuple[Tensor, Tensor | None]:
    """log π(response token | prefix) / temperature-scaled, for each response position.

    Args:
        model: a Hugging Face causal LM (``get_decoder()`` and ``get_output_embeddings()``).
        input_ids, attention_mask, position_ids: (B, T), prompt left-padded, response right-padded.
        response_length: R, the width of the response part (the last R columns).
        layout: how the decoder forward sees the batch, an entry of
            ``stages.engines.response_hidden.FORWARD_LAYOUTS`` (``full``, ``trimmed``: the columns
            some row needs, ``packed``: the rows' real tokens back to back).

    Returns:
        ((B, R) float32 log-probs, (B, R) float32 entropy or None). Response columns the layout
        did not compute (padding in every row; packed: after a row's last real token) get 0; the
        others are computed like any other position, and callers mask response padding with
        ``response_mask``.
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0 to compute log-probs, got {temperature}")
    decoder, lm_head = model.get_decoder(), model.get_output_embeddings()
    hidden, real = response_hidden_states(
        decoder, input_ids, attention_mask, position_ids, response_length, layout
    )  # (B, R', H)
    prompt_length = input_ids.shape[1] - response_length
    labels = input_ids[:, prompt_length : prompt_length + hidden.shape[1]]  # (B, R')
    pieces = []
    for start in range(0, hidden.shape[1], chunk_tokens):
        args = (hidden[:, start : start + chunk_tokens], labels[:, start : start + chunk_tokens])
        if (
            torch.is_grad_enabled()
            and hidden.requires_grad
            and _logits_bytes(args[0], lm_head) > RECOMPUTE_ABOVE_BYTES
        ):
            piece = checkpoint(
                _project_chunk, *args, lm_head, temperature, calculate_entropy, use_reentrant=False
            )
        else:
            piece = _project_chunk(*args, lm_head, temperature, calculate_entropy)
        pieces.append(piece)
    logprobs = _real_only(torch.cat([p[0] for p in pieces], dim=1), real)
    entropy = (
        _real_only(torch.cat([p[1] for p in pieces], dim=1), real) if calculate_entropy else None
    )
    return (
        pad_response_columns(logprobs, response_length),
        pad_response_columns(entropy, response_length),
    )


def _real_only(values: Tensor, real: Tensor | None) -> Tensor:
    """(B, R') values with 0 where ``real`` is False (no mask: all kept)."""
    return values if real is None else values.where(real, 0.0)


class ResponseLogProbModel(nn.Module):
    """A causal LM whose ``forward`` returns the response log-probs (and entropy).

    DeepSpeed engines wrap this module, so every forward pass goes through ``engine(...)`` — ZeRO-3
    gathers and releases parameters around the engine's own forward. ``lm`` is the plain Hugging
    Face model (generation, export); ``layout`` is how its forwards see a batch
    (``stages.engines.response_hidden.FORWARD_LAYOUTS``: ``packed`` under the role's
    ``use_remove_padding``, else ``trimmed``).
    """

    def __init__(self, lm: nn.Module, layout: str = "trimmed") -> None:
        super().__init__()
        self.lm = lm
        self.layout = layout

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor,
        position_ids: Tensor,
        response_length: int,
        temperature: float = 1.0,
        calculate_entropy: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        return response_logprobs(
            self.lm,
            input_ids,
            attention_mask,
            position_ids,
            response_length,
            temperature=temperature,
            calculate_entropy=calculate_entropy,
            layout=self.layout,
        )
