"""``ppoflow export RUN --step K OUT`` or ``ppoflow export CHECKPOINT OUT --base MODEL``.

Writes the actor of a checkpoint as a plain Hugging Face model directory (``flows/export.py``):
``model.safetensors``, ``config.json``, ``generation_config.json``, the tokenizer files. A LoRA
run's checkpoint becomes a PEFT adapter directory (``adapter_config.json``,
``adapter_model.safetensors``, the tokenizer files), or with ``--merged`` the merged model as a
plain model directory; ``--merged`` on a full-training checkpoint is accepted and changes
nothing. It prints what it read and wrote; the last line printed is OUT. Exit status: 0 on success; 2 for a
bad argument (not a run or checkpoint, no such step, OUT not empty, …), one line on stderr; 1 for
any other failure.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from flows.cli.train import VerboseOption, fail_in_one_line


def _files(directory: Path) -> str:
    """``name (size)`` of each file of the exported directory, largest first."""
    files = sorted(directory.iterdir(), key=lambda p: -p.stat().st_size)
    return " · ".join(f"{p.name} ({_size(p.stat().st_size)})" for p in files)


def _size(nbytes: int) -> str:
    """``1.9 MB``-style sizes (powers of 1000).

    >>> _size(1_900_000), _size(512)
    ('1.9 MB', '512 B')
    """
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if nbytes >= scale:
            return f"{nbytes / scale:.1f} {unit}"
    return f"{nbytes} B"


def _what(found, merged: bool) -> str:
    """What was written: the model, the PEFT adapter directory or the merged model."""
    from flows.export import export_kind

    adapter = found.checkpoint.adapter or {}
    rank = adapter.get("rank") or f"of {adapter.get('adapter_path')}"
    return {
        "model": "a model directory" + (" (full training: nothing to merge)" if merged else ""),
        "adapter": f"a PEFT adapter directory (LoRA rank {rank})",
        "merged": f"the base model with its LoRA adapters (rank {rank}) merged",
    }[export_kind(found, merged)]


def export_command(
    source: Annotated[
        str,
        typer.Argument(
            help="A run directory (with --step), or a …/global_step_K checkpoint folder "
            "(with --base)"
        ),
    ],
    out: Annotated[str, typer.Argument(help="The new model directory (absent or empty)")],
    step: Annotated[
        int | None, typer.Option("--step", help="The checkpointed step K of the run to export")
    ] = None,
    base: Annotated[
        str | None,
        typer.Option(
            "--base",
            help="Model directory for the architecture, generation config and tokenizer; "
            "default the run's actor_rollout_ref.model.path (required for a checkpoint folder)",
        ),
    ] = None,
    dtype: Annotated[
        str | None,
        typer.Option(
            "--dtype",
            help="float32, bfloat16 or float16; default the run's actor_rollout_ref.model.dtype",
        ),
    ] = None,
    merged: Annotated[
        bool,
        typer.Option(
            "--merged",
            help="LoRA checkpoint: write the base model with the adapters merged into its "
            "weights (a plain model directory) instead of a PEFT adapter directory; a "
            "full-training checkpoint is exported as its model either way",
        ),
    ] = False,
    force: Annotated[bool, typer.Option("--force", help="Replace a non-empty OUT")] = False,
    verbose: VerboseOption = False,
) -> None:
    """Export a checkpoint's actor as a Hugging Face model directory (a LoRA checkpoint: a PEFT
    adapter directory, or with --merged the merged model); the last line printed is OUT."""
    from transformers.utils import logging as hf_logging

    from flows.export import export_model, export_source

    hf_logging.disable_progress_bar()
    try:
        found = export_source(source, step, base)
        written = export_model(found, out, dtype, force, merged)
    except Exception as err:
        raise fail_in_one_line(err, verbose, usage_errors=(ValueError,)) from None
    typer.echo(f"exported {found.describe()} as {dtype or found.dtype}, {_what(found, merged)}")
    typer.echo(f"  {_files(written)}")
    typer.echo(str(written))


def register(app: typer.Typer) -> None:
    """Add the ``export`` command to the ``ppoflow`` app."""
    app.command("export")(export_command)


__all__ = ["export_command", "register"]
