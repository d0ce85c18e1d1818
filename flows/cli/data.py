"""Data commands: ``ppoflow make-tiny-model`` and ``ppoflow make-demo-data``."""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer


class DemoTask(StrEnum):
    """The demo tasks ``make-demo-data`` writes."""

    copy = "copy"
    agent = "agent"


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
    task: Annotated[
        DemoTask,
        typer.Option(
            help="copy: single-turn ppoflow/demo-copy; agent: multi-turn ppoflow/demo-lookup "
            "(a tool call per prompt; also writes tools.yaml, for configs/demo-agent-cpu.yaml).",
        ),
    ] = DemoTask.copy,
) -> None:
    """Write a demo task as train.parquet / val.parquet in verl's layout (--task agent: and the
    tool config tools.yaml)."""
    from stages.data.demo_task import make_demo_data

    if task is DemoTask.agent:
        _make_agent_demo_data(directory, n_train, n_val, seed, answer_length, max_answer_length)
        return
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


def _make_agent_demo_data(
    directory: Path,
    n_train: int,
    n_val: int,
    seed: int,
    answer_length: int,
    max_answer_length: int | None,
) -> None:
    from stages.data.demo_agent_task import make_agent_demo_data

    if answer_length != 1 or max_answer_length is not None:
        raise typer.BadParameter(
            "the agent task's answers are one letter; drop --answer-length / --max-answer-length",
            param_hint="'--task agent'",
        )
    train, val, tools = make_agent_demo_data(directory, n_train=n_train, n_val=n_val, seed=seed)
    typer.echo(
        f"wrote {n_train} training prompts to {train}, {n_val} validation prompts to {val} "
        f"and the tool config to {tools}"
    )


def register(app: typer.Typer) -> None:
    """Add this module's commands to the `ppoflow` app."""
    app.command("make-tiny-model")(make_tiny_model_cmd)
    app.command("make-demo-data")(make_demo_data_cmd)
