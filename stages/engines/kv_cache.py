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
"""

from __future__ import annotations

from typing import Any

from torch import Tensor, nn
from transformers.cache_utils import Cache, DynamicCache, DynamicLayer


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


def reserved_cache(model: nn.Module, reserve: int) -> Cache | None:
    """A cache of :class:`ReservedLayer`s for ``model`` (``reserve`` = the tokens to generate),
    or None when the model's own dynamic cache is not plain ``DynamicLayer``s."""
    config = getattr(model, "config", None)
    if config is None:
        return None
    own = DynamicCache(config=config.get_text_config(decoder=True))
    if not own.layers or any(type(layer) is not DynamicLayer for layer in own.layers):
        return None
    return Cache(layers=[ReservedLayer(reserve) for _ in own.layers])
