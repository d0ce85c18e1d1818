"""Validate a run's checkpoint, or any model directory, on the run's validation set:
``ppoflow validate``.

``validate_run(run_dir, step=K)`` exports the actor checkpoint of step K (``flows/export.py``,
in the run's ``actor_rollout_ref.model.dtype``) into a temporary directory and validates that;
``validate_run(run_dir, model_dir=DIR)`` validates the Hugging Face model directory DIR (an
export, the base model, any causal LM with its tokenizer). Either way the validation is the one
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

MODEL_PATH = "actor_rollout_ref.model.path"
TOKENIZER_PATH = "actor_rollout_ref.model.tokenizer_path"


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
    from flows.engines import build_reward, build_role, close_engines, seed_everything
    from flows.process.device import apply_device
    from flows.validate import validate
    from stages.agent.rollout import tool_schemas
    from stages.data import load_tokenizer
    from stages.data.from_config import load_split

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
            (the error lists the steps that have one), ``model_dir`` is not a directory.
        ConfigError: an override does not validate.
    """
    if (step is None) == (model_dir is None):
        raise ExportError(
            "give either --step K (validate the run's checkpoint of step K) or --model DIR "
            "(validate a Hugging Face model directory), not both and not neither"
        )
    run_dir = os.path.abspath(run_dir)
    if model_dir is not None and not Path(model_dir, "config.json").is_file():
        state = "has no config.json" if Path(model_dir).exists() else "does not exist"
        raise ExportError(
            f"--model {model_dir} is not a model directory: it {state}; pass a Hugging Face "
            "model directory (ppoflow export writes one from a checkpoint)"
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
            params = {MODEL_PATH: str(export_model(source, Path(scratch) / "model"))}
        else:
            params = {MODEL_PATH: model, TOKENIZER_PATH: model}
        from stages.config import apply_overrides

        cfg = apply_overrides(cfg, list(overrides), params)
        result, prompts = run_validation(cfg, step or 0)
    val_kwargs = cfg.actor_rollout_ref.rollout.val_kwargs
    return RunValidation(
        run_dir, step, model, prompts, val_kwargs.n, not val_kwargs.do_sample, result
    )


__all__ = ["RunValidation", "run_validation", "validate_run"]
