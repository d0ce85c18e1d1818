"""``attn_implementation: sdpa`` for ppoflow's models: transformers' SDPA attention, with the K/V
heads of grouped-query attention handed to torch's CPU kernel as they are.

A grouped-query model (Qwen2, Llama 3, …: H query heads, H / g key/value heads) shares each K/V
head between g query heads. transformers' ``sdpa`` attention gives torch's kernel that sharing
(``enable_gqa=True``) only where it can keep the fast kernel with a mask (XPU, MPS, or no mask);
on the CPU it copies every K/V head g times first (``repeat_kv``), for every layer at every step
— the whole KV cache once per generated token. torch's CPU kernel takes the shared heads with a
mask and gives the same output (equal in the tests). At the compute-bound size of
bench/vs_trl.py the copies were a sixth of a rollout's time (figures in bench/README.md).

:func:`sdpa_attention` is transformers' ``sdpa_attention_forward`` except on the CPU with g > 1,
where it calls ``torch.nn.functional.scaled_dot_product_attention`` with ``enable_gqa=True`` and
the same causal rule (``is_causal`` only for a prefill without a mask; a prefill into a longer
static cache reads only its own columns). Elsewhere (CUDA, no grouping, a position bias, a paged
cache, attention weights asked for) it is transformers' function itself.

It is registered with transformers as :data:`PPOFLOW_SDPA`, for the attention and for the masks
(transformers' ``sdpa_mask``), and :func:`transformers_attention` maps the config's ``sdpa`` to
it when a model is loaded. Saved model directories do not record it (``config.json`` holds no
attention implementation), so they load anywhere as usual.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

#: the name :func:`sdpa_attention` is registered under with transformers
PPOFLOW_SDPA = "ppoflow_sdpa"
#: the config's attention implementation → the one the model is loaded with
LOADED_AS = {"sdpa": PPOFLOW_SDPA}


def sdpa_attention(
    module: nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs: Any,
) -> tuple[Tensor, None]:
    """Attention output (B, Q, H, D) from query (B, H, Q, D) and key / value (B, H / g, K, D);
    see the module docstring for when it is transformers' own ``sdpa_attention_forward``."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    groups = getattr(module, "num_key_value_groups", 1)
    delegate = (
        query.device.type != "cpu"
        or groups <= 1
        or kwargs.get("position_bias") is not None
        or kwargs.get("cache") is not None
        or kwargs.get("output_attentions", False)
    )
    if delegate:
        return sdpa_attention_forward(
            module,
            query,
            key,
            value,
            attention_mask,
            dropout=dropout,
            scaling=scaling,
            is_causal=is_causal,
            **kwargs,
        )
    q_length = query.shape[2]
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    causal = q_length > 1 and attention_mask is None and causal
    if causal and key.shape[2] > q_length:  # prefill into a static cache: its own columns only
        key, value = key[:, :, :q_length], value[:, :, :q_length]
    output = torch.nn.functional.scaled_dot_product_attention(
        query,
        key,
        value,
        attn_mask=attention_mask,
        dropout_p=dropout,
        scale=scaling,
        is_causal=causal,
        enable_gqa=True,
    )
    return output.transpose(1, 2).contiguous(), None


def register() -> None:
    """Register :func:`sdpa_attention` and transformers' SDPA masks as :data:`PPOFLOW_SDPA`
    (again is harmless)."""
    from transformers import AttentionInterface, AttentionMaskInterface
    from transformers.masking_utils import sdpa_mask

    AttentionInterface.register(PPOFLOW_SDPA, sdpa_attention)
    AttentionMaskInterface.register(PPOFLOW_SDPA, sdpa_mask)


def transformers_attention(name: str) -> str:
    """The ``attn_implementation`` to load a model with for the config's ``name``: ``sdpa`` →
    :data:`PPOFLOW_SDPA` (registered first); any other name as it is."""
    loaded = LOADED_AS.get(name, name)
    if loaded == PPOFLOW_SDPA:
        register()
    return loaded
