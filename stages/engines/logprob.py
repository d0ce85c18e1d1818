"""Per-token log-probabilities (and entropy) of the response tokens under a causal LM.

The response token at position t of the full sequence (t ≥ P) is predicted from the hidden state
at t − 1, so for a (B, T = P + R) sequence the R response tokens use the hidden states at
positions P − 1 … T − 2. With z = lm_head(h) / temperature (V,) for each such hidden state h:

    log p(y) = z_y − logsumexp(z),        entropy = logsumexp(z) − Σ_v softmax(z)_v · z_v

(in float32). Only the N response positions whose token is real (``attention_mask`` 1 there, and
for a packed forward the ``real`` mask of ``stages.engines.response_hidden``) are gathered, as one
flat (N, H) axis, and projected ``chunk_tokens`` tokens at a time: a chunk holds (chunk_tokens, V)
float32 logits, never (B, R, V) or (N, V). By default a chunk is ``CHUNK_LOGITS_BYTES`` of logits,
so its size follows the vocabulary (220 tokens at V = 151,936). With ``requires_grad`` and more than
``RECOMPUTE_ABOVE_BYTES`` of float32 logits over all N tokens, each chunk is recomputed in the
backward pass (activation checkpointing), so the autograd graph keeps no chunk's logits either. The other
response columns get 0; callers mask response padding with ``response_mask``.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from stages.engines.response_hidden import response_hidden_states
from stages.engines.trimming import pad_response_columns

#: float32 logits per vocabulary-projection chunk: chunk tokens = CHUNK_LOGITS_BYTES // (4 · V)
CHUNK_LOGITS_BYTES = 128 << 20
#: float32 logits of all N tokens up to this size are kept for backward; above it every chunk is
#: recomputed in backward (a second vocabulary projection) so the graph holds no chunk's logits
RECOMPUTE_ABOVE_BYTES = 64 << 20


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
    logits = lm_head(hidden) / temperature  # (C, V)
    logprobs, entropy = token_logprobs_and_entropy(logits, labels, calculate_entropy)
    return logprobs, (entropy if entropy is not None else torch.zeros_like(logprobs))


def chunk_tokens_for(vocab_size: int) -> int:
    """Tokens per chunk whose float32 logits fit ``CHUNK_LOGITS_BYTES`` (at least 1).

    >>> chunk_tokens_for(151_936)
    220
    """
    return max(1, CHUNK_LOGITS_BYTES // (4 * vocab_size))


def chunked_logprobs(
    hidden: Tensor,
    labels: Tensor,
    needed: Tensor,
    lm_head: nn.Module,
    *,
    temperature: float = 1.0,
    calculate_entropy: bool = False,
    chunk_tokens: int | None = None,
) -> tuple[Tensor, Tensor | None]:
    """log p(labels) (and entropy) at the ``needed`` positions, the vocabulary projection run
    ``chunk_tokens`` of them at a time (None: :func:`chunk_tokens_for` the vocabulary).

    Args:
        hidden: (B, R', H) the hidden states that predict the labels.
        labels: (B, R') int64 token ids.
        needed: (B, R') bool, the N positions to compute.
        lm_head: the output projection H → V (``out_features`` = V).

    Returns:
        ((B, R') float32 log-probs, (B, R') float32 entropy or None), 0 where ``needed`` is False.
    """
    vocab_size = lm_head.out_features  # kept under ZeRO-3, where the weight itself is partitioned
    per_chunk = chunk_tokens or chunk_tokens_for(vocab_size)
    flat_hidden, flat_labels = hidden[needed], labels[needed]  # (N, H), (N,)
    recompute = (
        torch.is_grad_enabled()
        and flat_hidden.requires_grad
        and len(flat_labels) * vocab_size * 4 > RECOMPUTE_ABOVE_BYTES
    )
    pieces = []
    for start in range(0, max(len(flat_labels), 1), per_chunk):  # one empty chunk keeps the graph
        args = (flat_hidden[start : start + per_chunk], flat_labels[start : start + per_chunk])
        if recompute:
            piece = checkpoint(
                _project_chunk, *args, lm_head, temperature, calculate_entropy, use_reentrant=False
            )
        else:
            piece = _project_chunk(*args, lm_head, temperature, calculate_entropy)
        pieces.append(piece)
    zeros = torch.zeros(needed.shape, dtype=torch.float32, device=hidden.device)
    logprobs = zeros.masked_scatter(needed, torch.cat([p[0] for p in pieces]))
    if not calculate_entropy:
        return logprobs, None
    return logprobs, zeros.masked_scatter(needed, torch.cat([p[1] for p in pieces]))


def response_logprobs(
    model: nn.Module,
    input_ids: Tensor,
    attention_mask: Tensor,
    position_ids: Tensor,
    response_length: int,
    *,
    temperature: float = 1.0,
    calculate_entropy: bool = False,
    chunk_tokens: int | None = None,
    layout: str = "trimmed",
) -> tuple[Tensor, Tensor | None]:
    """log π(response token | prefix) / temperature-scaled, for each response position.

    Args:
        model: a Hugging Face causal LM (``get_decoder()`` and ``get_output_embeddings()``).
        input_ids, attention_mask, position_ids: (B, T), prompt left-padded, response right-padded.
        response_length: R, the width of the response part (the last R columns).
        chunk_tokens: response tokens per vocabulary-projection chunk; None: by the vocabulary
            (:func:`chunk_tokens_for`).
        layout: how the decoder forward sees the batch, an entry of
            ``stages.engines.response_hidden.FORWARD_LAYOUTS`` (``full``, ``trimmed``: the columns
            some row needs, ``packed``: the rows' real tokens back to back).

    Returns:
        ((B, R) float32 log-probs, (B, R) float32 entropy or None). Response columns whose token is
        padding (``attention_mask`` 0), or that the layout did not compute (packed: no real token
        before it), get 0; callers mask response padding with ``response_mask``.
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0 to compute log-probs, got {temperature}")
    decoder, lm_head = model.get_decoder(), model.get_output_embeddings()
    hidden, real = response_hidden_states(
        decoder, input_ids, attention_mask, position_ids, response_length, layout
    )  # (B, R', H)
    prompt_length = input_ids.shape[1] - response_length
    columns = slice(prompt_length, prompt_length + hidden.shape[1])
    needed = attention_mask[:, columns].bool()  # (B, R') the response token is real
    if real is not None:
        needed = needed & real
    logprobs, entropy = chunked_logprobs(
        hidden,
        input_ids[:, columns],
        needed,
        lm_head,
        temperature=temperature,
        calculate_entropy=calculate_entropy,
        chunk_tokens=chunk_tokens,
    )
    return (
        pad_response_columns(logprobs, response_length),
        pad_response_columns(entropy, response_length),
    )


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
