"""Loading the role models by path: the same code for the tiny demo model and a real one.

Actor and reference: ``AutoModelForCausalLM``. Critic: the same backbone with a scalar head,
``AutoModelForTokenClassification`` with one label, initialised from the actor's directory (the
head is new, randomly initialised) or from its own path. Hub ids work where the network allows;
``HF_HUB_OFFLINE=1`` keeps everything local.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn
from transformers import AutoModelForCausalLM, AutoModelForTokenClassification

from stages.engines.deepspeed_setup import DTYPES


def _dtype(name: str | torch.dtype) -> torch.dtype:
    if isinstance(name, torch.dtype):
        return name
    try:
        return DTYPES[name]
    except KeyError:
        raise ValueError(f"unknown model dtype {name!r}; known: {sorted(DTYPES)}") from None


def _check_local(path: str | Path) -> None:
    candidate = Path(path)
    looks_local = candidate.is_absolute() or str(path).startswith(".") or candidate.exists()
    if looks_local and not (candidate / "config.json").exists():
        raise FileNotFoundError(
            f"model directory {str(path)!r} has no config.json; write one with "
            "`ppoflow make-tiny-model DIR` or point model.path at a Hugging Face model directory"
        )


def load_causal_lm(
    path: str | Path,
    *,
    dtype: str = "float32",
    attn_implementation: str = "sdpa",
    gradient_checkpointing: bool = False,
    trust_remote_code: bool = False,
) -> nn.Module:
    """The actor or reference model from a Hugging Face directory or hub id."""
    _check_local(path)
    model = AutoModelForCausalLM.from_pretrained(
        path,
        dtype=_dtype(dtype),
        attn_implementation=attn_implementation,
        trust_remote_code=trust_remote_code,
    )
    if gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.config.use_cache = False
    return model


def load_value_model(
    path: str | Path,
    *,
    dtype: str = "float32",
    attn_implementation: str = "sdpa",
    gradient_checkpointing: bool = False,
    trust_remote_code: bool = False,
) -> nn.Module:
    """The critic: the backbone at ``path`` with a one-output token-classification head.

    From a causal-LM directory the backbone weights are loaded and the value head is initialised
    fresh (transformers reports it as newly initialised); from a saved critic it is restored.
    """
    _check_local(path)
    model = AutoModelForTokenClassification.from_pretrained(
        path,
        num_labels=1,
        dtype=_dtype(dtype),
        attn_implementation=attn_implementation,
        trust_remote_code=trust_remote_code,
    )
    if gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model
