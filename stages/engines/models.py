"""Loading the role models by path: the same code for the tiny demo model and a real one.

Actor and reference: ``AutoModelForCausalLM``. Critic: the same backbone with a scalar head,
``AutoModelForTokenClassification`` with one label, initialised from the actor's directory (the
head is new, randomly initialised) or from its own path. Hub ids work where the network allows;
``HF_HUB_OFFLINE=1`` keeps everything local. ``attn_implementation: sdpa`` loads ppoflow's SDPA
attention (stages/engines/attention.py: the same output, grouped K/V heads not copied on CPU).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from torch import nn
from transformers import AutoModelForCausalLM, AutoModelForTokenClassification

from stages.engines.attention import transformers_attention
from stages.engines.deepspeed_setup import DTYPES


def _dtype(name: str | torch.dtype) -> torch.dtype:
    if isinstance(name, torch.dtype):
        return name
    try:
        return DTYPES[name]
    except KeyError:
        raise ValueError(f"unknown model dtype {name!r}; known: {sorted(DTYPES)}") from None


def check_model_path(path: str | Path, needs: tuple[str, ...] = ("config.json",)) -> None:
    """Fail clearly on a local model directory that is not there.

    A path is taken as local when it is absolute, starts with ``.``, exists, or has more than
    one ``/`` (a hub id is ``name`` or ``namespace/name``); such a path must hold one of the
    ``needs`` files (config.json for a model).
    """
    text = str(path)
    candidate = Path(text)
    looks_local = (
        candidate.is_absolute() or text.startswith(".") or candidate.exists() or text.count("/") > 1
    )
    if looks_local and not candidate.exists():
        raise FileNotFoundError(
            f"model directory {text!r} does not exist (so it has no {' or '.join(needs)}); "
            "write one with `ppoflow make-tiny-model DIR` or point model.path at a Hugging Face "
            "model directory"
        )
    if looks_local and not any((candidate / name).exists() for name in needs):
        raise FileNotFoundError(
            f"model directory {text!r} has no {' or '.join(needs)}; write one with "
            "`ppoflow make-tiny-model DIR` or point model.path at a Hugging Face model directory"
        )


def _from_pretrained(load: Callable[..., nn.Module], path: str | Path, **kwargs: Any) -> nn.Module:
    """``load(path, **kwargs)``; a weights file safetensors cannot read is an error naming the
    directory and its weight files (safetensors' own message names neither). It is an
    ``OSError``: a damaged file, not a bad setting (the command line's exit status 1)."""
    try:
        return load(path, **kwargs)
    except SafetensorError as err:
        files = sorted(p.name for p in Path(str(path)).glob("*.safetensors")) or ["?"]
        raise OSError(
            f"model directory {str(path)!r}: cannot read its weights ({', '.join(files)}: "
            f"{' '.join(str(err).split())}); the file is truncated or damaged: restore it, or "
            "write the model directory again"
        ) from None


def load_causal_lm(
    path: str | Path,
    *,
    dtype: str = "float32",
    attn_implementation: str = "sdpa",
    gradient_checkpointing: bool = False,
    trust_remote_code: bool = False,
) -> nn.Module:
    """The actor or reference model from a Hugging Face directory or hub id."""
    check_model_path(path)
    model = _from_pretrained(
        AutoModelForCausalLM.from_pretrained,
        path,
        dtype=_dtype(dtype),
        attn_implementation=transformers_attention(attn_implementation),
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
    check_model_path(path)
    model = _from_pretrained(
        AutoModelForTokenClassification.from_pretrained,
        path,
        num_labels=1,
        dtype=_dtype(dtype),
        attn_implementation=transformers_attention(attn_implementation),
        trust_remote_code=trust_remote_code,
    )
    if gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model
