"""A tiny random-init causal LM for the CPU demo and tests, and a loader for any causal LM.

`make_tiny_model` writes an ordinary Hugging Face model directory (config.json,
model.safetensors, generation_config.json, the tokenizer files): a Qwen2 decoder with
hidden 128, 2 layers, 4 query heads and 2 KV heads (head_dim 32: vLLM's CPU attention needs
head_dim >= 32), MLP 256, tied embeddings, vocab = the tiny byte-level tokenizer (261 ids),
initialised from a fixed seed. About 0.4 M parameters. Everything downstream loads it by path with
`load_tokenizer` / `load_causal_lm`, the same code as for a real model.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from stages.data.tokenizer import build_tiny_tokenizer
from stages.engines.models import load_causal_lm  # re-exported: one loader for every model

__all__ = ["MIN_HEAD_DIM", "load_causal_lm", "make_tiny_model", "tiny_model_config"]

MIN_HEAD_DIM = 32  # vLLM CPU attention: head_dim 16 fails at the first generate


def tiny_model_config(
    tokenizer: Any,
    *,
    hidden_size: int = 128,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    intermediate_size: int = 256,
    max_position_embeddings: int = 512,
    vocab_size: int | None = None,
) -> Any:
    """The `Qwen2Config` of the tiny model, its special ids taken from ``tokenizer``.

    ``vocab_size``: rows of the embedding and of the LM head; None = the tokenizer's ids. A larger
    one pads the vocabulary past the tokenizer, as real checkpoints do (Qwen2.5: 151,936 rows for
    151,665 ids), so a model of a real model's shape and cost can be built without its tokenizer;
    ids past the tokenizer's decode to nothing.
    """
    from transformers import Qwen2Config

    if vocab_size is not None and vocab_size < len(tokenizer):
        raise ValueError(
            f"vocab_size={vocab_size} must be at least the tokenizer's {len(tokenizer)} ids"
        )

    if hidden_size % num_heads or hidden_size // num_heads < MIN_HEAD_DIM:
        raise ValueError(
            f"hidden_size={hidden_size} / num_heads={num_heads} must be a whole head_dim >= "
            f"{MIN_HEAD_DIM} (vLLM's CPU attention rejects smaller heads)"
        )
    if num_heads % num_kv_heads:
        raise ValueError(f"num_heads={num_heads} must be a multiple of num_kv_heads={num_kv_heads}")
    return Qwen2Config(
        vocab_size=len(tokenizer) if vocab_size is None else vocab_size,
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )


def make_tiny_model(directory: str | Path, *, seed: int = 0, **config_overrides: Any) -> Path:
    """Write the tiny tokenizer + random-init Qwen2 causal LM to ``directory``; return its path.

    The weights depend only on ``seed`` and the config (same seed → identical safetensors).
    ``config_overrides`` go to `tiny_model_config` (hidden_size, num_layers, …).
    """
    from transformers import GenerationConfig, Qwen2ForCausalLM

    directory = Path(directory)
    tokenizer = build_tiny_tokenizer()
    config = tiny_model_config(tokenizer, **config_overrides)
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config).to(torch.float32)
    model.generation_config = GenerationConfig(
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
    )
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory
