"""A KV cache for HF ``generate`` that writes each new token in place instead of concatenating.

transformers' default cache for a full-attention model is a ``DynamicCache`` of
``DynamicLayer``s, which grow by ``torch.cat``: every generated token copies the whole cache of
every layer, so a response of R tokens after a prompt of P copies about R · (P + R / 2) token
slots per layer, where writing them once would be P + R. :class:`ReservedLayer` is that
``DynamicLayer`` with room reserved: its keys and values live in (B, H_kv, C, D) buffers with
C = what it holds + the tokens still to come, each update writes its tokens into the next
columns, and ``keys`` / ``values`` are the filled (B, H_kv, L, D) views, so attention reads the
same numbers. Anything that replaces ``keys`` (``batch_select_indices``, ``crop``,
``reorder_cache``) is kept as the layer's ``DynamicLayer`` behaviour; the next update moves the
result into a new buffer, once.

:func:`reserved_cache` builds such a cache only for a model whose own dynamic cache would be
plain ``DynamicLayer``s (no sliding-window or other special layers), so the attention pattern
is never changed; otherwise it answers None and ``generate`` uses its own.

:class:`SlotBuffers` serve ``stages.engines.hf_decode``'s static decode loop instead: fixed
(rows, H, C, D) buffers per layer, a transformers ``StaticLayer`` (:class:`SlotLayer`) over the
first b rows for each batch size b the decode shrinks to, and a copy that moves the rows still
decoding to the front. The addresses never change, so a step captured as a CUDA graph at b reads
and writes the same memory every time it is replayed.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch import Tensor, nn
from transformers.cache_utils import Cache, DynamicCache, DynamicLayer, StaticLayer


class ReservedLayer(DynamicLayer):
    """A ``DynamicLayer`` whose updates write into buffers with ``reserve`` columns to spare.

    reserve: the columns kept free beyond what an update brings (the tokens still to come);
        when an update does not fit, the buffer is made again with that much room.
    """

    def __init__(self, reserve: int) -> None:
        super().__init__()
        self.reserve = reserve
        self._buffers: tuple[Tensor, Tensor] | None = None
        self._views: tuple[Tensor, Tensor] | None = None  # what keys / values were set to

    def update(
        self, key_states: Tensor, value_states: Tensor, *args: Any, **kwargs: Any
    ) -> tuple[Tensor, Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        length, new = self.get_seq_length(), key_states.shape[-2]
        replaced = self._views is None or self.keys is not self._views[0]
        if replaced or length + new > self._buffers[0].shape[-2]:
            self._buffers = (
                self._rebuffer(self.keys, key_states, length + new + self.reserve),
                self._rebuffer(self.values, value_states, length + new + self.reserve),
            )
        keys, values = self._buffers
        keys[:, :, length : length + new] = key_states
        values[:, :, length : length + new] = value_states
        self.keys, self.values = keys[:, :, : length + new], values[:, :, : length + new]
        self._views = (self.keys, self.values)
        return self.keys, self.values

    @staticmethod
    def _rebuffer(held: Tensor, incoming: Tensor, columns: int) -> Tensor:
        """A (B, H, columns, D) buffer starting with the ``held`` (B, H, L, D) states."""
        batch, heads, _, dim = incoming.shape
        buffer = incoming.new_empty(batch, heads, columns, dim)
        if held.numel():
            buffer[:, :, : held.shape[-2]] = held
        return buffer


def has_plain_attention_layers(model: nn.Module) -> bool:
    """Whether ``model``'s own dynamic cache is plain ``DynamicLayer``s (full attention only: no
    sliding-window, linear-attention or other special layers)."""
    config = getattr(model, "config", None)
    if config is None:
        return False
    own = DynamicCache(config=config.get_text_config(decoder=True))
    return bool(own.layers) and all(type(layer) is DynamicLayer for layer in own.layers)


def reserved_cache(model: nn.Module, reserve: int) -> Cache | None:
    """A cache of :class:`ReservedLayer`s for ``model`` (``reserve`` = the tokens to generate),
    or None when the model's own dynamic cache is not plain ``DynamicLayer``s."""
    if not has_plain_attention_layers(model):
        return None
    layers = len(DynamicCache(config=model.config.get_text_config(decoder=True)).layers)
    return Cache(layers=[ReservedLayer(reserve) for _ in range(layers)])


class SlotLayer(StaticLayer):
    """transformers' ``StaticLayer`` over buffers it is given instead of ones it allocates.

    ``keys`` / ``values`` are (b, H, C, D) views of the first b rows of :class:`SlotBuffers`'
    (rows, H, C, D) buffers, and ``length`` the 0-d int64 count of written columns, shared by
    the views of one layer at every b. The update is ``StaticLayer``'s: the new column goes to
    index ``length`` of every row, and attention reads all C columns through the mask.
    """

    def __init__(self, keys: Tensor, values: Tensor, length: Tensor) -> None:
        super().__init__(max_cache_len=keys.shape[-2])
        self.keys, self.values, self.cumulative_length = keys, values, length
        self.dtype, self.device = keys.dtype, keys.device
        self.batch_size, self.num_heads = keys.shape[:2]
        self.k_head_dim, self.v_head_dim = keys.shape[-1], values.shape[-1]
        for tensor in (keys, values, length):  # fixed addresses: CUDA graphs read them in place
            torch._dynamo.mark_static_address(tensor)
        self.is_initialized = True


class SlotBuffers:
    """Key / value buffers of a decode whose batch shrinks: per layer (rows, H, C, D), C columns.

    ``cache(b)`` is a ``Cache`` of :class:`SlotLayer`s over the first b rows, one object per b
    (a compiled step then sees the same cache, at the same addresses, each time it runs at b);
    ``compact(keep)`` moves rows ``keep`` to the front so the next ``cache(len(keep))`` holds
    them. The buffers start at zero and only ever hold states a model wrote, so the columns the
    mask hides are finite (a NaN there would leak through attention's 0 weight).

    Example:
        >>> buffers = SlotBuffers([(1, 2, 2)], rows=4, capacity=3, dtype=torch.float32, device="cpu")
        >>> buffers.keys[0][:, 0, 0, 0] = torch.tensor([10.0, 11.0, 12.0, 13.0])
        >>> buffers.set_length(1)
        >>> buffers.compact(torch.tensor([3, 1]))
        >>> buffers.cache(2).layers[0].keys[:, 0, 0, 0], int(buffers.cache(2).get_seq_length())
        (tensor([13., 11.]), 1)
    """

    def __init__(
        self,
        shapes: list[tuple[int, int, int]],
        rows: int,
        capacity: int,
        dtype: torch.dtype,
        device: torch.device | str,
    ) -> None:
        """shapes: per layer (H, D_key, D_value); rows: the largest batch; capacity: C."""
        self.shapes, self.rows, self.capacity, self.dtype = shapes, rows, capacity, dtype
        self.device = torch.device(device)
        zeros = functools.partial(torch.zeros, dtype=dtype, device=self.device)
        self.keys = [zeros(rows, heads, capacity, dk) for heads, dk, _ in shapes]
        self.values = [zeros(rows, heads, capacity, dv) for heads, _, dv in shapes]
        self.lengths = [torch.zeros((), dtype=torch.int64, device=self.device) for _ in shapes]
        self._caches: dict[int, Cache] = {}

    def fits(
        self, shapes: list[tuple[int, int, int]], rows: int, capacity: int, dtype: torch.dtype
    ) -> bool:
        """Whether a decode of ``rows`` rows and ``capacity`` columns can use these buffers."""
        return (shapes, capacity, dtype) == (self.shapes, self.capacity, self.dtype) and (
            rows <= self.rows
        )

    def cache(self, rows: int) -> Cache:
        if rows not in self._caches:
            self._caches[rows] = Cache(
                layers=[
                    SlotLayer(keys[:rows], values[:rows], length)
                    for keys, values, length in zip(self.keys, self.values, self.lengths)
                ]
            )
        return self._caches[rows]

    def set_length(self, columns: int) -> None:
        """Columns 0 … columns - 1 hold states; the next update writes column ``columns``."""
        for length in self.lengths:
            length.fill_(columns)

    def fill(self, prefill: Cache, row_of: Tensor, offset: int) -> None:
        """Rows 0 … B - 1 take the prefill's (U, H, P', D) states of rows ``row_of`` (B,), at
        columns ``offset`` … ``offset`` + P' - 1; the next update writes the column after."""
        columns = offset + prefill.layers[0].keys.shape[-2]
        for keys, values, layer in zip(self.keys, self.values, prefill.layers, strict=True):
            keys[: len(row_of), :, offset:columns] = layer.keys.index_select(0, row_of)
            values[: len(row_of), :, offset:columns] = layer.values.index_select(0, row_of)
        self.set_length(columns)

    def compact(self, keep: Tensor) -> None:
        """Rows ``keep`` (b',) of the current batch become rows 0 … b' - 1 (written columns only)."""
        written = int(self.lengths[0])  # the steps advanced the counters themselves
        for buffer in (*self.keys, *self.values):
            buffer[: len(keep), :, :written] = buffer[keep, :, :written]


def slot_shapes(cache: Cache) -> list[tuple[int, int, int]] | None:
    """Per layer (H, D_key, D_value) of a filled dynamic ``cache``; None unless every layer is a
    plain ``DynamicLayer`` (sliding-window or other special layers keep their own cache)."""
    if not cache.layers or any(type(layer) is not DynamicLayer for layer in cache.layers):
        return None
    return [
        (layer.keys.shape[1], layer.keys.shape[-1], layer.values.shape[-1])
        for layer in cache.layers
    ]
