"""FLOPs of a decoder-only transformer over a batch, and model FLOPs utilisation (MFU).

verl's estimate for dense decoders (its ``FlopsCounter``), so ``perf/mfu/*`` reads the same in
both. For L layers, hidden size H, MLP width I, vocabulary V, h query heads and k key/value heads
of width d (q = h·d, kv = k·d), over sequences of s_1 … s_n real tokens:

    weights  N = L · (3·H·I + H·(2·q + 2·kv)) + 2·V·H        (gated MLP, q/k/v/o, embedding + head)
    training F = 6 · N · Σ s_i  +  12 · L · h · d · Σ s_i²   (forward + backward; attention unhalved)
    forward  F / 3

The embedding and the LM head count as two matrices even when tied, and causal attention is not
halved — verl's conventions, kept so the figures compare. MFU = F · passes / (seconds · peak),
where peak is the device's dense bf16 FLOP/s (:data:`DEVICE_PEAK_FLOPS`, as verl's table has
them); a device without an entry, the CPU among them, has no MFU.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

#: dense bf16 FLOP/s of a device, by a part of its name (first match, in this order): verl's table
DEVICE_PEAK_FLOPS: tuple[tuple[str, float], ...] = (
    ("GB200", 2.5e15),
    ("B200", 2.25e15),
    ("MI300X", 1336e12),
    ("H100", 989e12),
    ("H800", 989e12),
    ("H200", 989e12),
    ("A100", 312e12),
    ("A800", 312e12),
    ("L40S", 362.05e12),
    ("L40", 181.05e12),
    ("A40", 149.7e12),
    ("L20", 119.5e12),
    ("H20", 148e12),
    ("910B", 354e12),
    ("Ascend910", 354e12),
)


def device_peak_flops(device_name: str) -> float | None:
    """Dense bf16 FLOP/s of the device called ``device_name``; None for one not in the table.

    Example:
        >>> device_peak_flops("NVIDIA H100 80GB HBM3"), device_peak_flops("NVIDIA H20")
        (989000000000000.0, 148000000000000.0)
        >>> device_peak_flops("cpu") is None
        True
    """
    return next((flops for part, flops in DEVICE_PEAK_FLOPS if part in device_name), None)


@dataclass(frozen=True)
class DecoderShape:
    """The sizes the estimate reads from a Hugging Face decoder config."""

    layers: int
    hidden: int
    mlp: int
    vocab: int
    heads: int
    kv_heads: int
    head_dim: int

    @classmethod
    def of(cls, config: Any) -> DecoderShape | None:
        """The shape of a dense decoder's config (Qwen2, Llama, Mistral, …); None for a config
        without these sizes or with experts (a mixture of experts is not estimated)."""
        names = ("num_hidden_layers", "hidden_size", "intermediate_size", "vocab_size")
        heads = getattr(config, "num_attention_heads", None)
        if heads is None or any(getattr(config, name, None) is None for name in names):
            return None
        if any(getattr(config, name, None) for name in ("num_experts", "num_local_experts")):
            return None
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
        return cls(
            layers=config.num_hidden_layers,
            hidden=config.hidden_size,
            mlp=config.intermediate_size,
            vocab=config.vocab_size,
            heads=heads,
            kv_heads=getattr(config, "num_key_value_heads", None) or heads,
            head_dim=head_dim,
        )

    @property
    def weights(self) -> int:
        """N of the module docstring."""
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        per_layer = 3 * self.hidden * self.mlp + self.hidden * (2 * q + 2 * kv)
        return self.layers * per_layer + 2 * self.vocab * self.hidden


def training_flops(shape: DecoderShape, seq_lens: Sequence[int]) -> float:
    """Forward + backward FLOPs over sequences of ``seq_lens`` real tokens (module docstring).

    Example:
        >>> shape = DecoderShape(layers=1, hidden=4, mlp=8, vocab=10, heads=2, kv_heads=1, head_dim=2)
        >>> shape.weights  # 3·4·8 + 4·(2·4 + 2·2) + 2·10·4
        224
        >>> training_flops(shape, [3, 1])  # 6·224·4 + 12·1·2·2·(9 + 1)
        5856.0
    """
    tokens = sum(seq_lens)
    squares = sum(s * s for s in seq_lens)
    attention = 12 * shape.layers * shape.heads * shape.head_dim * squares
    return float(6 * shape.weights * tokens + attention)


def model_flops_utilization(flops: float, seconds: float, peak_flops: float) -> float:
    """Achieved FLOP/s over the peak: ``flops / seconds / peak_flops``.

    Example:
        >>> model_flops_utilization(5e14, 2.0, 1e15)
        0.25
    """
    if seconds <= 0 or peak_flops <= 0:
        raise ValueError(f"seconds ({seconds}) and peak_flops ({peak_flops}) must be > 0")
    return flops / seconds / peak_flops
