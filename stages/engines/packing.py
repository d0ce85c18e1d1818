"""Packed forwards (verl's ``use_remove_padding``): a micro-batch's real tokens back to back, no padding.

A (B, T = P + R) batch in verl's layout holds each row's real tokens in one contiguous run of
columns (the prompt left-padded, the response right-padded). Packing copies those runs into rows
of a (N, W) tensor, several sequences per packed row, each with its own position ids 0, 1, …, L − 1.
Transformers reads the packed layout from the position ids when ``attention_mask`` is None: a
position that does not follow its left neighbour by one starts a new sequence, and attention stays
inside each sequence (a block-diagonal causal mask for SDPA / eager; the varlen kernel for
flash-attention, which reads it only from a single packed row).

How the runs are laid out is the attention implementation's entry in :data:`PACKED_LAYOUTS`:

* ``varlen`` (ppoflow's ``sdpa`` where a ``stages.engines.attention.VARLEN_KERNELS`` entry fits the
  model's device and dtype, e.g. CUDA): one row of all N real tokens, and the sequence boundaries
  ``cu_seq_lens`` = (0, L_1, L_1 + L_2, …, N) (S + 1,) int32 handed to the forward as
  transformers' ``cu_seq_lens_q`` / ``cu_seq_lens_k`` / ``max_length_q`` / ``max_length_k``; no
  mask is built;
* ``one_row`` (flash-attention's varlen path, W = N), which reads the boundaries itself;
* otherwise packed rows as wide as the longest run, filled first-fit by decreasing length (SDPA
  and eager build a W × W mask per packed row, so rows are kept narrow): ppoflow's ``sdpa`` where
  no varlen kernel fits (the CPU), ``eager``.

A packed row's unused tail holds pad id 0 at position 0, each such slot a one-token sequence of
its own, whose output nothing reads.

The hidden state that predicts response column j of row i (verl's ``[:, P - 1 : T - 1]``) is read
back from the packed output by index, so log-probs, values and their gradients are those of the
padded forward up to the rounding of differently shaped kernels (≤ 1e-5 in float32 in the tests).
Response columns past a row's last real token get no predictor (``real`` is False there); callers
write 0 there and mask response padding with ``response_mask``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from stages.engines.attention import PPOFLOW_SDPA, varlen_kernel


@dataclass(frozen=True)
class PackedLayout:
    """How the real tokens of a micro-batch are laid out for one attention implementation.

    one_row: every sequence in a single packed row (a kernel that reads sequence boundaries only
        from a (1, N) row); otherwise packed rows as wide as the longest sequence.
    varlen: one row whose sequence boundaries are handed to the forward, no mask built, where a
        ``VARLEN_KERNELS`` entry runs on the model's device and dtype; elsewhere :data:`ROWS`.
    """

    one_row: bool
    varlen: bool = False


#: packed rows as wide as the longest sequence, a mask per row (SDPA / eager)
ROWS = PackedLayout(one_row=False)

#: attention implementation (``model.config._attn_implementation``) → its packed layout
PACKED_LAYOUTS: dict[str, PackedLayout] = {
    "sdpa": ROWS,
    PPOFLOW_SDPA: PackedLayout(one_row=True, varlen=True),  # what the config's sdpa loads
    "eager": ROWS,
    "flash_attention_2": PackedLayout(one_row=True),
}


def packed_layout(model: nn.Module) -> PackedLayout:
    """The :data:`PACKED_LAYOUTS` entry of ``model``'s attention implementation, :data:`ROWS` for a
    ``varlen`` entry no varlen kernel fits (the device and dtype of ``model``'s weights);
    ValueError naming the implementation and the known ones when there is none."""
    name = getattr(getattr(model, "config", None), "_attn_implementation", None)
    layout = PACKED_LAYOUTS.get(name)
    if layout is None:
        raise ValueError(
            f"packed forwards (use_remove_padding=true) do not support attn_implementation "
            f"{name!r}; use one of {sorted(PACKED_LAYOUTS)} or set use_remove_padding=false"
        )
    weight = next(model.parameters())
    if layout.varlen and varlen_kernel(weight.device, weight.dtype) is None:
        return ROWS
    return layout


@dataclass(frozen=True)
class PackedBatch:
    """A micro-batch's real tokens, packed.

    input_ids, position_ids: (N, W) the packed rows; each sequence counts its positions from 0.
    predictors: (B, R') flat index into the (N · W) packed positions of the hidden state that
        predicts response column j of row i (R' = the widest response run, ≥ 1); 0 where
        ``real`` is False.
    real: (B, R') bool, row i has a real token at response column j with a real token before it.
    cu_seq_lens: (S + 1,) int32 where each of the S sequences (pad slots included) starts in the
        flat (N · W) positions, then N · W.
    max_length: the longest sequence, L_max.
    """

    input_ids: Tensor
    position_ids: Tensor
    predictors: Tensor
    real: Tensor
    cu_seq_lens: Tensor
    max_length: int

    def boundaries(self) -> dict[str, Tensor | int]:
        """The sequence boundaries as transformers' varlen keyword arguments."""
        return {
            "cu_seq_lens_q": self.cu_seq_lens,
            "cu_seq_lens_k": self.cu_seq_lens,
            "max_length_q": self.max_length,
            "max_length_k": self.max_length,
        }

    def gather(self, hidden: Tensor) -> Tensor:
        """(N, W, H) packed hidden states → (B, R', H) those that predict the response tokens."""
        return hidden.reshape(-1, hidden.shape[-1])[self.predictors]


def _runs(attention_mask: Tensor, position_ids: Tensor) -> tuple[Tensor, Tensor]:
    """(start, length) of each row's real tokens: (B,) int64 each. ValueError when a row's real
    tokens are not one contiguous run or their position ids do not count 0, 1, …"""
    if position_ids.dim() != 2:
        raise ValueError(
            f"packed forwards need (B, T) position ids, got shape {tuple(position_ids.shape)} "
            "(multi-axis position ids are not supported); set use_remove_padding=false"
        )
    mask = attention_mask.bool()
    lengths = mask.sum(dim=1)  # (B,)
    columns = torch.arange(mask.shape[1], device=mask.device)
    starts = torch.where(mask, columns, mask.shape[1]).amin(dim=1)  # (B,) T for an empty row
    stops = torch.where(mask, columns + 1, 0).amax(dim=1)  # (B,)
    if bool(((stops - starts.clamp(max=stops)) != lengths).any()):
        raise ValueError(
            "packed forwards need each row's real tokens in one run (prompt left-padded, response "
            "right-padded); an attention_mask row has a gap; set use_remove_padding=false"
        )
    offsets = columns[None, :] - starts[:, None]  # (B, T) position within the run
    if bool(((position_ids - offsets) != 0)[mask].any()):
        raise ValueError(
            "packed forwards need position ids 0, 1, … over each row's real tokens "
            "(clip(cumsum(attention_mask) - 1, 0)); set use_remove_padding=false"
        )
    return starts.where(lengths > 0, 0), lengths


def _first_fit(lengths: list[int], width: int) -> list[tuple[int, int]]:
    """(packed row, offset) of each sequence: first-fit by decreasing length into rows of
    ``width`` slots (every length ≤ width).

    >>> _first_fit([3, 1, 2, 2], 4)
    [(0, 0), (0, 3), (1, 0), (1, 2)]
    """
    placement = [(0, 0)] * len(lengths)
    fill: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        row = next((r for r, used in enumerate(fill) if used + lengths[i] <= width), len(fill))
        if row == len(fill):
            fill.append(0)
        placement[i] = (row, fill[row])
        fill[row] += lengths[i]
    return placement


def pack_rows(
    input_ids: Tensor,
    attention_mask: Tensor,
    position_ids: Tensor,
    response_length: int,
    layout: PackedLayout,
) -> PackedBatch:
    """Pack the real tokens of a (B, T) batch (prompt left-padded, response right-padded, the last
    ``response_length`` = R columns the response) as ``layout`` says. See the module docstring."""
    starts, lengths = _runs(attention_mask, position_ids)
    sizes = lengths.tolist()
    total = max(sum(sizes), 1)
    width = total if layout.one_row else max(max(sizes, default=1), 1)
    placement = _first_fit(sizes, width)
    rows = max((row for row, _ in placement), default=0) + 1
    base = torch.tensor([row * width + off for row, off in placement], device=input_ids.device)

    owner = torch.repeat_interleave(torch.arange(len(sizes), device=input_ids.device), lengths)
    within = (
        torch.arange(len(owner), device=input_ids.device) - (lengths.cumsum(0) - lengths)[owner]
    )
    source = owner * input_ids.shape[1] + starts[owner] + within  # flat (B · T) columns
    packed_ids = input_ids.new_zeros(rows * width)
    packed_ids[base[owner] + within] = input_ids.reshape(-1)[source]
    packed_positions = position_ids.new_zeros(rows * width)
    packed_positions[base[owner] + within] = within.to(position_ids.dtype)

    prompt_length = input_ids.shape[1] - response_length
    response_runs = (starts + lengths - prompt_length).clamp(min=0)  # (B,) real response columns
    kept = max(int(response_runs.max()) if len(sizes) else 0, 1)
    column = torch.arange(kept, device=input_ids.device)
    local = prompt_length - 1 + column[None, :] - starts[:, None]  # (B, R') predictor in the run
    real = (column[None, :] < response_runs[:, None]) & (local >= 0)
    predictors = torch.where(real, base[:, None] + local, 0)
    starts = (
        (packed_positions == 0).nonzero().flatten()
    )  # every sequence and pad slot counts from 0
    ends = torch.tensor([rows * width], device=input_ids.device)
    return PackedBatch(
        input_ids=packed_ids.view(rows, width),
        position_ids=packed_positions.view(rows, width),
        predictors=predictors,
        real=real,
        cu_seq_lens=torch.cat([starts, ends]).to(torch.int32),
        max_length=max(max(sizes, default=0), 1),
    )


def packed_response_hidden(
    decoder: nn.Module,
    input_ids: Tensor,
    attention_mask: Tensor,
    position_ids: Tensor,
    response_length: int,
) -> tuple[Tensor, Tensor]:
    """((B, R', H) hidden states that predict each response column, (B, R') bool ``real``) from one
    packed forward of ``decoder`` (a Hugging Face base model; the layout from its config and
    weights), the sequence boundaries handed to it for a ``varlen`` layout."""
    layout = packed_layout(decoder)
    packed = pack_rows(input_ids, attention_mask, position_ids, response_length, layout)
    hidden = decoder(
        input_ids=packed.input_ids,
        attention_mask=None,
        position_ids=packed.position_ids,
        use_cache=False,
        **(packed.boundaries() if layout.varlen else {}),
    ).last_hidden_state  # (N, W, H)
    return packed.gather(hidden), packed.real


__all__ = [
    "PACKED_LAYOUTS",
    "ROWS",
    "PackedBatch",
    "PackedLayout",
    "pack_rows",
    "packed_layout",
    "packed_response_hidden",
]
