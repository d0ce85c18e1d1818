"""Data commands: ``ppoflow make-tiny-model`` and ``ppoflow make-demo-data``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer


def make_tiny_model_cmd(
    directory: Annotated[Path, typer.Argument(help="Output directory (created if missing).")],
    seed: Annotated[int, typer.Option(help="Seed of the random initialisation.")] = 0,
    hidden_size: Annotated[
        int, typer.Option(help="Hidden size (a multiple of 4 heads of >= 32).", min=128)
    ] = 128,
    layers: Annotated[int, typer.Option(help="Decoder layers.", min=1)] = 2,
    intermediate_size: Annotated[int, typer.Option(help="MLP width.", min=1)] = 256,
) -> None:
    """Write a tiny random-init Qwen2 causal LM + byte-level tokenizer as a Hugging Face directory."""
    from stages.data.tiny_model import make_tiny_model

    path = make_tiny_model(
        directory,
        seed=seed,
        hidden_size=hidden_size,
        num_layers=layers,
        intermediate_size=intermediate_size,
    )
    typer.echo(f"wrote tiny model and tokenizer to {path}")


def make_demo_data_cmd(
    directory: Annotated[Path, typer.Argument(help="Output directory (created if missing).")],
    n_train: Annotated[int, typer.Option(help="Training prompts.", min=1)] = 1024,
    n_val: Annotated[int, typer.Option(help="Validation prompts.", min=1)] = 64,
    seed: Annotated[int, typer.Option(help="Seed of the generator.", min=0)] = 0,
    answer_length: Annotated[int, typer.Option(help="Letters per answer.", min=1)] = 1,
    max_answer_length: Annotated[
        int | None,
        typer.Option(
            help="Draw each answer's length from answer-length … this (varied prompt lengths).",
            min=1,
        ),
    ] = None,
) -> None:
    """Write the demo task (ppoflow/demo-copy) as train.parquet / val.parquet in verl's layout."""
    from stages.data.demo_task import make_demo_data

    if max_answer_length is not None and max_answer_length < answer_length:
        raise typer.BadParameter(
            f"{max_answer_length} is shorter than --answer-length {answer_length}; give a "
            "maximum >= the minimum",
            param_hint="'--max-answer-length'",
        )
    train, val = make_demo_data(
        directory,
        n_train=n_train,
        n_val=n_val,
        seed=seed,
        answer_length=answer_length,
        max_answer_length=max_answer_length,
    )
    typer.echo(
        f"wrote {n_train} training prompts to {train} and {n_val} validation prompts to {val}"
    )


def register(app: typer.Typer) -> None:
    """Add this module's commands to the `ppoflow` app."""
    app.command("make-tiny-model")(make_tiny_model_cmd)
    app.command("make-demo-data")(make_demo_data_cmd)
