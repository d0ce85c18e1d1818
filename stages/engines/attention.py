"""``attn_implementation: sdpa`` for ppoflow's models: transformers' SDPA attention, with the K/V
heads of grouped-query attention handed to torch's CPU kernel as they are, and packed rows run by a
variable-length kernel without a mask where one fits the device and dtype.

**Grouped K/V heads on the CPU.** A grouped-query model (Qwen2, Llama 3, …: H query heads, H / g
key/value heads) shares each K/V head between g query heads. transformers' ``sdpa`` attention gives
torch's kernel that sharing (``enable_gqa=True``) only where it can keep the fast kernel with a mask
(XPU, MPS, or no mask); on the CPU it copies every K/V head g times first (``repeat_kv``), for every
layer at every step — the whole KV cache once per generated token. torch's CPU kernel takes the
shared heads with a mask and gives the same output (equal in the tests); bench/README.md has the
figures.

**Packed rows without a mask.** A packed forward (stages/engines/packing.py) puts S sequences back
to back in one row of N tokens, each with position ids 0, 1, …, L_s − 1. SDPA and eager attention
see them through a block-diagonal causal mask that transformers builds from the position ids:
(W × W) per packed row, so rows are kept as wide as the longest sequence. A variable-length kernel
reads the sequence boundaries instead, ``cu_seq_lens`` = (0, L_1, L_1 + L_2, …, N) (S + 1,) int32,
and computes for the token at flat index i of sequence s, with c = cu_seq_lens[s],

    out_i = Σ_{c ≤ j ≤ i} softmax_j(q_i · k_j · scale) v_j     (query i, key j in the same sequence)

on query (N, Hq, D), key / value (N, Hkv, D), so no (N × N) mask is held and no work is spent across
sequences. :data:`VARLEN_KERNELS` lists the kernels, each with what it needs (device type, query
dtype, package, CUDA capability) and a preference; :func:`varlen_kernel` picks the most preferred that fits. Where none fits
(the CPU) the packed rows and transformers' mask stay as they were.

:func:`sdpa_attention` therefore runs

* a :data:`VARLEN_KERNELS` entry when it gets no mask, as many keys as queries (no cache) and the
  boundaries: ``cu_seq_lens_q`` / ``max_length_q`` (transformers' varlen keyword arguments, which
  the packed forward hands to the model), else derived from ``position_ids`` (a new sequence where a
  position does not follow its left neighbour by one), else one sequence per row;
* otherwise transformers' ``sdpa_attention_forward``, except on the CPU with g > 1, where it calls
  ``torch.nn.functional.scaled_dot_product_attention`` with ``enable_gqa=True`` and the same causal
  rule (``is_causal`` only for a prefill without a mask; a prefill into a longer static cache reads
  only its own columns). Elsewhere (CUDA, no grouping, a position bias, a paged cache, attention
  weights asked for) it is transformers' function itself.

Its mask function :func:`sdpa_or_no_mask` is transformers' ``sdpa_mask``, except that it builds
nothing (None) where the attention will run a varlen kernel: no padding mask, no cache offset, no
sliding window or chunked layer, no extra mask function, a causal model, and a kernel for the
embeddings' device and dtype. Both are registered with transformers as :data:`PPOFLOW_SDPA`, and
:func:`transformers_attention` maps the config's ``sdpa`` to it when a model is loaded. Saved model
directories do not record it (``config.json`` holds no attention implementation), so they load
anywhere as usual.
"""

from __future__ import annotations

import functools
import importlib.util
import itertools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from stages.registry import Registry

#: the name :func:`sdpa_attention` is registered under with transformers
PPOFLOW_SDPA = "ppoflow_sdpa"
#: the config's attention implementation → the one the model is loaded with
LOADED_AS = {"sdpa": PPOFLOW_SDPA}

#: (query (N, Hq, D), key (N, Hkv, D), value (N, Hkv, D), cu_seq_lens (S + 1,) int32, max_length,
#: scale or None) → (N, Hq, D): causal attention inside each sequence of the flat token axis
VarlenFn = Callable[[Tensor, Tensor, Tensor, Tensor, int, float | None], Tensor]


@dataclass(frozen=True)
class VarlenKernel:
    """A variable-length attention kernel and what it needs to run.

    run: the kernel (:data:`VarlenFn`).
    devices: device types it runs on (``"cuda"``).
    dtypes: query dtypes it takes.
    package: a module it needs (``importlib.util.find_spec`` finds it, nothing is imported).
    preference: among the entries that fit, the highest is chosen.
    cuda_capability: the least CUDA compute capability (major, minor), or None.
    """

    run: VarlenFn
    devices: tuple[str, ...]
    dtypes: tuple[torch.dtype, ...]
    package: str
    preference: int
    cuda_capability: tuple[int, int] | None = None


def torch_varlen(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    cu_seq_lens: Tensor,
    max_length: int,
    scale: float | None,
) -> Tensor:
    """:data:`VarlenFn` by ``torch.nn.attention.varlen.varlen_attn`` (FlashAttention-2 kernels
    built into torch: CUDA, fp16 / bf16, head dim ≤ 256), causal as ``window_size=(-1, 0)``."""
    from torch.nn.attention.varlen import varlen_attn

    return varlen_attn(
        query, key, value, cu_seq_lens, cu_seq_lens, max_length, max_length,
        scale=scale, window_size=(-1, 0), enable_gqa=query.shape[1] != key.shape[1],
    )  # fmt: skip


@functools.cache
def _compiled_flex_attention() -> Callable[..., Tensor]:
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention)


def flex_varlen(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    cu_seq_lens: Tensor,
    max_length: int,
    scale: float | None,
    *,
    compile: bool = True,
) -> Tensor:
    """:data:`VarlenFn` by ``flex_attention`` with a block mask from the boundaries: key j is read by
    query i when both lie in one sequence and j ≤ i. ``compile``: torch.compile'd (Triton kernels
    on CUDA); eager flex_attention holds the (N × N) scores and has no backward on the CPU."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    tokens = query.shape[0]
    positions = torch.arange(tokens, device=query.device)
    # (N,) the sequence each token is in
    sequence = torch.searchsorted(cu_seq_lens[1:].long(), positions, right=True)

    def causal_in_sequence(batch: Tensor, head: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        return (sequence[q_idx] == sequence[kv_idx]) & (kv_idx <= q_idx)

    block_mask = create_block_mask(
        causal_in_sequence, None, None, tokens, tokens, device=query.device, _compile=compile
    )
    attend = _compiled_flex_attention() if compile else flex_attention
    output = attend(
        query.transpose(0, 1)[None],
        key.transpose(0, 1)[None],
        value.transpose(0, 1)[None],
        block_mask=block_mask,
        scale=scale,
        enable_gqa=query.shape[1] != key.shape[1],
    )  # (1, Hq, N, D)
    return output[0].transpose(0, 1)


def varlen_reference(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    cu_seq_lens: Tensor,
    max_length: int,
    scale: float | None,
) -> Tensor:
    """:data:`VarlenFn` one sequence at a time with causal SDPA: any device and dtype, the oracle
    of the tests and the fallback of a mask-free call no kernel fits."""
    bounds = cu_seq_lens.tolist()
    pieces = [
        torch.nn.functional.scaled_dot_product_attention(
            query[start:stop].transpose(0, 1), key[start:stop].transpose(0, 1),
            value[start:stop].transpose(0, 1), is_causal=True, scale=scale, enable_gqa=True,
        ).transpose(0, 1)  # (L, Hq, D)
        for start, stop in itertools.pairwise(bounds)
    ]  # fmt: skip
    return torch.cat(pieces) if pieces else query.new_zeros(query.shape)


#: the varlen kernels; :func:`varlen_kernel` takes the most preferred one that fits
VARLEN_KERNELS: Registry[VarlenKernel] = Registry("varlen attention kernel")
VARLEN_KERNELS.add(
    "varlen_attn",
    VarlenKernel(
        run=torch_varlen,
        devices=("cuda",),
        dtypes=(torch.float16, torch.bfloat16),
        package="torch.nn.attention.varlen",
        preference=2,
        cuda_capability=(8, 0),
    ),
)
VARLEN_KERNELS.add(
    "flex_attention",
    VarlenKernel(
        run=flex_varlen,
        devices=("cuda",),
        dtypes=(torch.float32, torch.float16, torch.bfloat16),
        package="triton",
        preference=1,
    ),
)


@functools.cache
def _has_package(name: str) -> bool:
    return importlib.util.find_spec(name) is not None


def _fits(kernel: VarlenKernel, device: torch.device, dtype: torch.dtype) -> bool:
    if device.type not in kernel.devices or dtype not in kernel.dtypes:
        return False
    if not _has_package(kernel.package):
        return False
    needed = kernel.cuda_capability
    return needed is None or torch.cuda.get_device_capability(device) >= needed


def varlen_kernel(device: torch.device | str, dtype: torch.dtype) -> VarlenKernel | None:
    """The :data:`VARLEN_KERNELS` entry of highest preference that runs on ``device`` with
    ``dtype``; None where
    none does (the CPU: packed rows keep transformers' mask).

    >>> varlen_kernel("cpu", torch.float32) is None
    True
    """
    device = torch.device(device)
    fitting = [VARLEN_KERNELS.get(name) for name in VARLEN_KERNELS]
    fitting = [kernel for kernel in fitting if _fits(kernel, device, dtype)]
    return max(fitting, key=lambda kernel: kernel.preference, default=None)


def _boundaries(rows: int, width: int, device: torch.device, kwargs: dict) -> tuple[Tensor, int]:
    """(cu_seq_lens (S + 1,) int32, max_length) of the (rows · width) flat tokens: the handed-in
    ``cu_seq_lens_q`` / ``max_length_q``, else from the position ids, else one sequence per row."""
    handed = kwargs.get("cu_seq_lens_q")
    if handed is not None:
        return handed.to(device=device, dtype=torch.int32), int(kwargs["max_length_q"])
    positions = kwargs.get("position_ids")
    if positions is None or positions.dim() != 2:
        cu = torch.arange(0, rows * width + 1, width, device=device, dtype=torch.int32)
        return cu, width
    flat = positions.to(device).expand(rows, width).reshape(-1)  # (rows · width,)
    starts = torch.ones_like(flat, dtype=torch.bool)
    starts[1:] = flat[1:] != flat[:-1] + 1
    starts[::width] = True  # every row starts a sequence
    total = torch.tensor([flat.numel()], device=device)
    cu = torch.cat([starts.nonzero().flatten(), total]).to(torch.int32)
    return cu, int(cu.diff().max())


def varlen_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    scaling: float | None,
    kwargs: dict,
) -> Tensor:
    """Output (B, W, Hq, D) of query (B, Hq, W, D), key / value (B, Hkv, W, D) by the
    :data:`VARLEN_KERNELS` entry for the query (:func:`varlen_reference` where none fits),
    the B · W tokens flattened into one axis of sequences (:func:`_boundaries`)."""
    rows, heads, width, head_dim = query.shape
    cu_seq_lens, max_length = _boundaries(rows, width, query.device, kwargs)
    kernel = varlen_kernel(query.device, query.dtype)
    run = kernel.run if kernel is not None else varlen_reference

    def flat(states: Tensor) -> Tensor:  # (B, h, W, D) → (B · W, h, D)
        return states.transpose(1, 2).reshape(rows * width, states.shape[1], head_dim)

    output = run(flat(query), flat(key), flat(value), cu_seq_lens, max_length, scaling)
    return output.reshape(rows, width, heads, head_dim)


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
    see the module docstring for when it is a varlen kernel or transformers' own
    ``sdpa_attention_forward``."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    whole_sequences = attention_mask is None and causal and query.shape[2] == key.shape[2]
    handed = kwargs.get("cu_seq_lens_q") is not None
    if whole_sequences and (handed or varlen_kernel(query.device, query.dtype) is not None):
        if dropout > 0:
            raise ValueError(
                f"packed attention without a mask takes no attention dropout, got {dropout}; "
                "set the model's attention_dropout to 0 or use_remove_padding=false"
            )
        return varlen_attention(query, key, value, scaling, kwargs), None
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


def sdpa_or_no_mask(**kwargs: Any) -> Tensor | None:
    """transformers' ``sdpa_mask(**kwargs)``, or None where :func:`sdpa_attention` will run a
    varlen kernel (see the module docstring): nothing (N × N) is built for a packed row."""
    from transformers.masking_utils import sdpa_mask

    config = kwargs.get("config")
    mask_free = (
        kwargs.get("attention_mask") is None
        and kwargs["q_length"] == kwargs["kv_length"]
        and kwargs.get("kv_offset", 0) == 0
        and kwargs.get("local_size") is None
        and not kwargs.get("use_vmap", False)
        and getattr(config, "is_causal", True)
        and "dtype" in kwargs
        and varlen_kernel(kwargs["device"], kwargs["dtype"]) is not None
    )
    return None if mask_free else sdpa_mask(**kwargs)


def register() -> None:
    """Register :func:`sdpa_attention` and :func:`sdpa_or_no_mask` as :data:`PPOFLOW_SDPA`
    (again is harmless)."""
    from transformers import AttentionInterface, AttentionMaskInterface

    AttentionInterface.register(PPOFLOW_SDPA, sdpa_attention)
    AttentionMaskInterface.register(PPOFLOW_SDPA, sdpa_or_no_mask)


def transformers_attention(name: str) -> str:
    """The ``attn_implementation`` to load a model with for the config's ``name``: ``sdpa`` →
    :data:`PPOFLOW_SDPA` (registered first); any other name as it is."""
    loaded = LOADED_AS.get(name, name)
    if loaded == PPOFLOW_SDPA:
        register()
    return loaded
