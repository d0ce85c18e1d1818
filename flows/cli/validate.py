"""``ppoflow validate RUN (--step K | --model DIR) [key=value …]``: the validation scores.

Runs the run's validation set on its checkpoint of step K (a LoRA run's: its base model with the
checkpoint's adapters), or on a Hugging Face model directory, or on a PEFT adapter directory (the
run's base model with that adapter; ``flows/validate_run.py``), and prints ``val score: X`` — the mean reward over the validation
samples, the score ``ppoflow train`` prints after each validation — then every validation
metric (``val-core/<data source>/…``, ``val-aux/<data source>/…``), the names ``ppoflow train``
logs. Exit status: 0 on success; 2 for a bad argument or config (one line on stderr: not a run,
no such step — the line lists the steps that have a checkpoint —, an override that does not
validate); 1 for any other failure.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from flows.cli.train import VerboseOption, config_messages, fail_in_one_line
from stages.config import ConfigError

if TYPE_CHECKING:
    from flows.validate_run import RunValidation


def describe(run: RunValidation) -> str:
    """The lines the command prints (module docstring)."""
    what = f"step {run.step} of {run.run_dir}" if run.step is not None else run.run_dir
    decoding = "greedy" if run.greedy else "sampled"
    lines = [
        f"validation of {what} with {run.model}: {run.prompts} prompts × {run.samples} "
        f"({decoding})",
        f"val score: {run.result.mean_score:.6f}",
    ]
    width = max((len(name) for name in run.result.metrics), default=0)
    for name, value in sorted(run.result.metrics.items()):
        lines.append(f"  {name:<{width}}  {value:.6f}")
    return "\n".join(lines)


def validate_command(
    run_dir: Annotated[str, typer.Argument(help="The run directory (its config and checkpoints)")],
    overrides: Annotated[
        list[str] | None,
        typer.Argument(
            help="key.path=value overrides of the run's config (e.g. data.val_files=[…])"
        ),
    ] = None,
    step: Annotated[
        int | None, typer.Option("--step", help="Validate the run's checkpoint of step K")
    ] = None,
    model: Annotated[
        str | None,
        typer.Option(
            "--model",
            help="Validate this Hugging Face model directory instead, or this PEFT adapter "
            "directory (adapter_config.json) on the run's base model",
        ),
    ] = None,
    verbose: VerboseOption = False,
) -> None:
    """Score a checkpoint (or a model directory) on the run's validation set."""
    from transformers.utils import logging as hf_logging

    from flows.validate_run import validate_run

    hf_logging.disable_progress_bar()
    with config_messages():
        try:
            result = validate_run(run_dir, step, model, overrides or [])
        except Exception as err:
            raise fail_in_one_line(err, verbose, usage_errors=(ValueError, ConfigError)) from None
    typer.echo(describe(result))


def register(app: typer.Typer) -> None:
    """Add the ``validate`` command to the ``ppoflow`` app."""
    app.command("validate")(validate_command)


__all__ = ["describe", "register", "validate_command"]
