"""The export of a LoRA actor checkpoint: a PEFT adapter directory, or the merged model.

A LoRA run's actor checkpoint (``stages/engines/checkpoint.py``) holds the adapter parameters
only — ``lm.base_model.model.<module>.lora_A.default.weight`` and the like, the PEFT model's
own names under the engine's ``lm.`` wrapper — and its ``ppoflow_checkpoint.json`` records the
``adapter``: its settings (``stages.engines.adapters.AdapterSettings.record``) and the base
model's fingerprint (``weights_fingerprint``: BLAKE3 of its ``config.json`` and weight files).
``flows/export.py`` reads those parameters as it reads a full checkpoint's (weights-only, ZeRO
0–3) after checking the step's manifest; this module turns them into a model:

- :func:`check_adapter_base` — before any weight is read, the base model the export builds on
  has the fingerprint the checkpoint records (one :class:`~flows.export_errors.ExportError` line
  otherwise);
- :func:`adapter_config` — the ``peft.LoraConfig`` the run trained: from the record's settings
  (``adapters.lora_config``), or, for a run that started from a PEFT adapter directory
  (``lora_adapter_path``), that directory's own ``adapter_config.json`` (its rank and targets);
- :func:`adapter_model` — a ``PeftModel`` on the base architecture built on the ``meta`` device
  (no base weight is read or allocated) with the checkpoint's adapters assigned, for
  ``PeftModel.save_pretrained``: ``adapter_config.json`` + ``adapter_model.safetensors``, which
  ``PeftModel.from_pretrained(base, DIR)`` loads;
- :func:`merged_model` — the base model loaded from its directory, the adapters put on and
  merged by PEFT (``merge_and_unload``: W + (α/r)·B·A in every adapted layer), a plain
  Hugging Face model.

The adapters are cast to the export dtype, and so is the base (the merged model's weights are
W + ΔW computed in that dtype: a ``float32`` export of a ``bfloat16`` run merges into the base
directory's own float32 weights).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from flows.export_errors import ExportError
from stages.engines.adapters import (
    ADAPTER_CONFIG,
    AdapterSettings,
    lora_config,
    weights_fingerprint,
)

if TYPE_CHECKING:
    from flows.export import ExportSource

TASK_TYPE = "CAUSAL_LM"


def check_adapter_base(source: ExportSource) -> None:
    """The base model ``source`` builds on is the one the checkpoint's adapters were trained on:
    the same fingerprint (``adapters.weights_fingerprint``), else one line naming both."""
    recorded = source.checkpoint.adapter["base_model"]
    found = weights_fingerprint(source.base_model)
    if found != recorded:
        raise ExportError(
            f"{source.base_model} is not the base model the LoRA adapters of "
            f"{source.checkpoint.directory} were trained on (its fingerprint is {found[:23]}…, "
            f"the checkpoint records {recorded[:23]}…); pass --base with the model directory "
            "the run trained on (its actor_rollout_ref.model.path)"
        )


def adapter_config(source: ExportSource) -> Any:
    """The ``peft.LoraConfig`` of the checkpoint's adapters (module docstring), naming the base
    model as ``base_model_name_or_path`` (absolute for a local directory)."""
    from peft import LoraConfig

    record = {k: v for k, v in source.checkpoint.adapter.items() if k != "base_model"}
    settings = AdapterSettings(
        **{k: tuple(v) if isinstance(v, list) else v for k, v in record.items()},
        keys="the checkpoint's adapter",
    )
    if settings.adapter_path:
        started = Path(source.path(settings.adapter_path)).expanduser()
        if not (started / ADAPTER_CONFIG).is_file():
            raise ExportError(
                f"the LoRA adapters of {source.checkpoint.directory} started from the adapter "
                f"directory {settings.adapter_path} (lora_adapter_path), whose {ADAPTER_CONFIG} "
                f"holds their rank and targets, but {started / ADAPTER_CONFIG} is missing; "
                "restore that directory"
            )
        config = LoraConfig.from_pretrained(str(started))
    else:
        config = lora_config(settings, TASK_TYPE)
    base = Path(source.base_model)
    config.base_model_name_or_path = str(base.absolute()) if base.is_dir() else source.base_model
    config.inference_mode = False
    return config


def _load_adapters(peft_model: Any, source: ExportSource, dtype: torch.dtype, assign: bool) -> None:
    """Put the checkpoint's adapter parameters, cast to ``dtype``, into ``peft_model``: exactly
    its adapter parameters (``.lora_`` names), else one line naming what does not fit."""
    weights = source.checkpoint.state_dict()
    expected = {name for name, _ in peft_model.named_parameters() if ".lora_" in name}
    missing, unexpected = sorted(expected - set(weights)), sorted(set(weights) - expected)
    if missing or unexpected:
        raise ExportError(
            f"the LoRA checkpoint {source.checkpoint.directory} does not fit its adapters on the "
            f"model at {source.base_model}: missing {missing[:3]}, unexpected {unexpected[:3]}; "
            "pass the model directory the run trained (--base)"
        )
    cast = {name: tensor.to(dtype) for name, tensor in weights.items()}
    peft_model.load_state_dict(cast, strict=False, assign=assign)


def adapter_model(source: ExportSource, dtype: torch.dtype) -> Any:
    """The ``PeftModel`` to save as an adapter directory: the base architecture on the ``meta``
    device (its weights are neither read nor allocated) with the checkpoint's adapters."""
    from peft import get_peft_model
    from transformers import AutoConfig, AutoModelForCausalLM

    config = adapter_config(source)
    base_config = AutoConfig.from_pretrained(
        source.base_model, trust_remote_code=source.trust_remote_code
    )
    with torch.device("meta"):
        base = AutoModelForCausalLM.from_config(
            base_config, dtype=dtype, trust_remote_code=source.trust_remote_code
        )
        peft_model = get_peft_model(base, config, autocast_adapter_dtype=False)
    _load_adapters(peft_model, source, dtype, assign=True)
    return peft_model


def save_adapter(peft_model: Any, directory: Path) -> None:
    """PEFT's own ``save_pretrained``: ``adapter_config.json`` and ``adapter_model.safetensors``
    (the adapters only; the base's embeddings are never saved: ppoflow does not resize them)."""
    peft_model.save_pretrained(str(directory), save_embedding_layers=False)


def merged_model(source: ExportSource, dtype: torch.dtype) -> Any:
    """The base model (weights read from its directory, in ``dtype``) with the checkpoint's
    adapters merged into its weights by PEFT's ``merge_and_unload``: a plain Hugging Face model
    (its generation config the base directory's)."""
    from peft import get_peft_model
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(
        source.base_model, dtype=dtype, trust_remote_code=source.trust_remote_code
    )
    peft_model = get_peft_model(base, adapter_config(source), autocast_adapter_dtype=False)
    _load_adapters(peft_model, source, dtype, assign=False)
    with torch.no_grad():
        return peft_model.merge_and_unload()


__all__ = ["adapter_config", "adapter_model", "check_adapter_base", "merged_model", "save_adapter"]
