"""Validate a run's checkpoint, or any model directory, on the run's validation set:
``ppoflow validate``.

``validate_run(run_dir, step=K)`` exports the actor checkpoint of step K (``flows/export.py``,
in the run's ``actor_rollout_ref.model.dtype``) into a temporary directory and validates that;
``validate_run(run_dir, model_dir=DIR)`` validates the Hugging Face model directory DIR (an
export, the base model, any causal LM with its tokenizer), LoRA keys of the run off. A PEFT
adapter directory (an ``adapter_config.json``: what ``ppoflow export`` writes of a LoRA
checkpoint, which is also what ``--step K`` of a LoRA run validates) is validated as the run's
base model (``actor_rollout_ref.model.path``) with that adapter on
(``actor_rollout_ref.model.lora_adapter_path``, its own rank, targets and variant); an adapter
trained on another base is one line. Either way the validation is the one
``ppoflow train`` runs (``flows.validate.validate``): the run's config (``config.json``, plus
``overrides``) gives ``data.val_files``, ``rollout.val_kwargs``, the reward and the actor's
engine settings; only the actor (``flows.engines.build_role``) and the reward engines are
built, no critic or reference policy. The step number K is passed to the validation as the
training passed it (it seeds ``data.validation_shuffle``), so with greedy ``val_kwargs``
(``do_sample: false``, the default) the metrics equal those the training logged at step K: the
exported weights are the engine's, bit for bit. Sampled validation draws from this process's
RNG, seeded with ``trainer.seed``, and differs from the training's.

Relative paths of the run's config, and of ``overrides``, are read from the directory the run
started in (run_info.json ``working_dir``; this one when the run records none), as the
training read them.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flows.export import ExportError, export_model, export_source, run_config
from flows.runs.index import working_dir
from flows.validate import ValidationResult
from stages.engines.adapters import ADAPTER_CONFIG, read_adapter_config, same_base

MODEL = "actor_rollout_ref.model"
MODEL_PATH = f"{MODEL}.path"
TOKENIZER_PATH = f"{MODEL}.tokenizer_path"
#: the run's LoRA keys turned off: a model directory is validated as it is
NO_ADAPTER = {
    f"{MODEL}.lora_rank": 0,
    f"{MODEL}.lora_adapter_path": None,
    f"{MODEL}.lora.rank": 0,
    f"{MODEL}.lora.adapter_path": None,
}


@dataclass
class RunValidation:
    """What ``validate_run`` validated and the result.

    ``model``: the checkpoint directory (``--step``) or the model directory (``--model``);
    ``prompts``: validation prompts; ``samples``: responses per prompt (``val_kwargs.n``);
    ``greedy``: whether ``val_kwargs`` decodes greedily.
    """

    run_dir: str
    step: int | None
    model: str
    prompts: int
    samples: int
    greedy: bool
    result: ValidationResult


def run_validation(cfg: Any, step: int) -> tuple[ValidationResult, int]:
    """(the validation of ``cfg``'s actor model at ``step``, the number of validation prompts):
    the actor and the reward engines built as the training builds them, closed afterwards."""
    from flows.engines import (
        build_reward,
        build_role,
        check_adapters,
        close_engines,
        seed_everything,
    )
    from flows.process.device import apply_device
    from flows.validate import validate
    from stages.agent.rollout import tool_schemas
    from stages.data import load_tokenizer
    from stages.data.from_config import load_split

    check_adapters(cfg)  # an adapter on another base: one line before any weight is read
    apply_device(cfg)
    seed_everything(cfg.trainer.seed)
    tokenizer = load_tokenizer(cfg.actor_rollout_ref.model.tokenizer_path)
    # routes checked: it scores
    val_set = load_split(cfg.data, tokenizer, "val", cfg.reward, tool_schemas(cfg))
    engines: dict[str, Any] = {}
    try:
        engines.update(build_reward(cfg, tokenizer))  # the scorer processes before any model
        engines["actor"] = build_role(cfg, "actor", cfg.trainer.total_training_steps or 1)
        return validate(cfg, engines, val_set, tokenizer, step), len(val_set)
    finally:
        close_engines(engines)


def is_adapter_dir(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a PEFT adapter directory (it holds an ``adapter_config.json``)."""
    return Path(path, ADAPTER_CONFIG).is_file()


def model_params(cfg: Any, directory: str) -> dict[str, Any]:
    """The config keys that make the run's actor the model in ``directory`` (module docstring):
    a model directory as it is (model and tokenizer, the LoRA keys off), or the run's base with
    the PEFT adapter in ``directory`` on (its rank, targets and variant its own).

    Raises:
        ExportError: the adapter is not a LoRA adapter, or was trained on another base model.
    """
    if not is_adapter_dir(directory):
        return {MODEL_PATH: directory, TOKENIZER_PATH: directory, **NO_ADAPTER}
    adapter = read_adapter_config(directory, "--model")
    base, trained_on = cfg.actor_rollout_ref.model.path, adapter.get("base_model_name_or_path")
    if adapter.get("peft_type") != "LORA":
        raise ExportError(
            f"--model {directory} holds a {adapter.get('peft_type')!r} adapter; ppoflow "
            "validates LoRA adapters (peft_type LORA) or model directories"
        )
    if trained_on and not same_base(str(trained_on), base):
        raise ExportError(
            f"--model {directory} is an adapter trained on base model {trained_on!r}, but the "
            f"run's {MODEL_PATH} = {base!r} is another model; validate it with a run of that base"
        )
    return {
        **NO_ADAPTER,
        f"{MODEL}.lora_adapter_path": directory,
        f"{MODEL}.lora.type": "dora" if adapter.get("use_dora") else "lora",
    }


def validate_run(
    run_dir: str | os.PathLike,
    step: int | None = None,
    model_dir: str | os.PathLike | None = None,
    overrides: Sequence[str] = (),
) -> RunValidation:
    """Validate step ``step``'s checkpoint, or ``model_dir``, with the run's validation set
    (module docstring). Exactly one of ``step`` and ``model_dir`` is given.

    Raises:
        ExportError: neither or both given, not a run directory, no checkpoint of ``step``
            (the error lists the steps that have one), ``model_dir`` is neither a model nor a
            PEFT adapter directory, or an adapter of another base model.
        ConfigError: an override does not validate.
    """
    if (step is None) == (model_dir is None):
        raise ExportError(
            "give either --step K (validate the run's checkpoint of step K) or --model DIR "
            "(validate a Hugging Face model directory), not both and not neither"
        )
    run_dir = os.path.abspath(run_dir)
    if model_dir is not None and not (
        is_adapter_dir(model_dir) or Path(model_dir, "config.json").is_file()
    ):
        state = "has no config.json" if Path(model_dir).exists() else "does not exist"
        raise ExportError(
            f"--model {model_dir} is not a model directory: it {state}; pass a Hugging Face "
            f"model directory, or a PEFT adapter directory (with {ADAPTER_CONFIG}); ppoflow "
            "export writes either from a checkpoint"
        )
    cfg = run_config(run_dir)
    model = os.path.abspath(model_dir) if model_dir is not None else None
    with (
        contextlib.chdir(working_dir(run_dir)),
        tempfile.TemporaryDirectory(prefix="ppoflow-validate-") as scratch,
    ):
        if model is None:
            source = export_source(run_dir, step)
            model = str(source.checkpoint.directory)
            params = model_params(cfg, str(export_model(source, Path(scratch) / "model")))
        else:
            params = model_params(cfg, model)
        from stages.config import apply_overrides

        cfg = apply_overrides(cfg, list(overrides), params)
        result, prompts = run_validation(cfg, step or 0)
    val_kwargs = cfg.actor_rollout_ref.rollout.val_kwargs
    return RunValidation(
        run_dir, step, model, prompts, val_kwargs.n, not val_kwargs.do_sample, result
    )


__all__ = ["RunValidation", "is_adapter_dir", "model_params", "run_validation", "validate_run"]
