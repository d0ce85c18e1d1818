"""``ppoflow config …``: print the resolved run config, or the commented defaults."""

from __future__ import annotations

import warnings
from typing import Annotated

import typer

from stages.config import (
    ConfigError,
    ConfigWarning,
    PPORunConfig,
    dump_config,
    load_config,
    render_default_yaml,
)

config_app = typer.Typer(
    name="config",
    help="Inspect run configs (YAML with verl's key names).",
    no_args_is_help=True,
)


@config_app.command("show")
def show(
    overrides: Annotated[
        list[str] | None,
        typer.Argument(
            help="key.path=value overrides, values parsed as YAML (e.g. trainer.total_epochs=2)"
        ),
    ] = None,
    config: Annotated[
        str | None,
        typer.Option(
            "--config",
            "-c",
            help="Config file, or a name in configs/ (grpo, demo-cpu); default: the defaults",
        ),
    ] = None,
) -> None:
    """Print the resolved config as YAML, with the derived flags and sizes as comments."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ConfigWarning)
        try:
            cfg = load_config(config, overrides or None)
        except ConfigError as err:
            typer.echo(str(err), err=True)
            raise typer.Exit(code=2) from None
    for warning in caught:
        typer.echo(f"warning: {warning.message}", err=True)
    typer.echo(render_derived_comment(cfg), nl=False)
    typer.echo(dump_config(cfg), nl=False)


@config_app.command("defaults")
def defaults() -> None:
    """Print every key with its default and description (the content of configs/ppo_trainer.yaml)."""
    typer.echo(render_default_yaml(), nl=False)


def render_derived_comment(cfg: PPORunConfig) -> str:
    """The derived flags and sizes as a YAML comment block (so the output still loads)."""
    lines = ["# derived (computed from the values below; not settable):"]
    for name, value in cfg.derived.model_dump().items():
        if name == "warnings":
            lines.extend(f"#   warning: {message}" for message in value)
        else:
            lines.append(f"#   {name}: {value}")
    return "\n".join(lines) + "\n"


def register(app: typer.Typer) -> None:
    """Add the ``config`` command group to the ``ppoflow`` app."""
    app.add_typer(config_app, name="config")


__all__ = ["config_app", "register", "render_derived_comment"]
