"""``ppoflow config …``: print the resolved run config, or the commented defaults."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Annotated

import typer

from flows.cli._group import OneLineUsageErrors
from stages.config import ConfigError, ConfigNotice, ConfigWarning

if TYPE_CHECKING:
    from stages.config import PPORunConfig

#: how config messages are led on stderr
MESSAGE_PREFIX = {ConfigNotice: "note", ConfigWarning: "warning"}


@contextmanager
def config_messages() -> Iterator[None]:
    """Print config notices and warnings as ``note: …`` / ``warning: …`` lines on stderr (each
    once), instead of Python's ``file:line: Category: …`` form; other warnings are untouched."""
    shown = warnings.showwarning
    seen: set[str] = set()

    def show(message, category, filename, lineno, file=None, line=None):
        prefix = next((p for c, p in MESSAGE_PREFIX.items() if issubclass(category, c)), None)
        if prefix is None:
            shown(message, category, filename, lineno, file, line)
        elif str(message) not in seen:
            seen.add(str(message))
            typer.echo(f"{prefix}: {message}", err=True)

    with warnings.catch_warnings():
        for category in MESSAGE_PREFIX:
            warnings.simplefilter("always", category)
        warnings.showwarning = show
        yield


def config_error(err: ConfigError) -> str:
    """What a command prints for a bad config: one ``error: invalid config (SOURCE): …`` line,
    or with several problems that count on the ``error:`` line and one ``  - …`` line each."""
    if len(err.problems) == 1:
        return f"error: invalid config ({err.source}): {err.problems[0]}"
    return f"error: {err}"


config_app = typer.Typer(
    cls=OneLineUsageErrors,
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
    layout: Annotated[
        bool,
        typer.Option(
            "--layout",
            help="Print where the engines run (processes × roles × devices) instead of the YAML, "
            "and whether this machine's backends can start it",
        ),
    ] = False,
) -> None:
    """Print the resolved config as YAML, with the derived flags and sizes as comments."""
    with config_messages():
        try:
            from stages.config import load_config  # the schema and its registries: late

            cfg = load_config(config, overrides or None)
        except ConfigError as err:
            typer.echo(config_error(err), err=True)
            raise typer.Exit(code=2) from None
    if layout:
        _show_layout(cfg)
        return
    typer.echo(render_derived_comment(cfg), nl=False)
    from stages.config import dump_config

    typer.echo(dump_config(cfg), nl=False)


def _show_layout(cfg) -> None:
    """The layout lines; then ``error:`` and exit 2 where ppoflow cannot start it (a backend
    refusing the config, or its package missing here)."""
    from flows.engines import check_backend
    from flows.layout import layout_lines

    typer.echo("\n".join(layout_lines(cfg)))
    try:
        check_backend(cfg)
    except (ValueError, NotImplementedError, ImportError) as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(code=2) from None


@config_app.command("verl-keys")
def verl_keys(
    overrides: Annotated[
        list[str] | None, typer.Argument(help="key.path=value overrides (Hydra's grammar)")
    ] = None,
    config: Annotated[
        str | None,
        typer.Option("--config", "-c", help="Config file (e.g. a verl trainer YAML), or a name"),
    ] = None,
    show_all: Annotated[
        bool, typer.Option("--all", help="Also list the keys that are ppoflow's own")
    ] = False,
) -> None:
    """List what became of each verl key of a config: mapped, no effect, dropped or refused."""
    try:
        from stages.config import explain_verl_keys

        rows = explain_verl_keys(config, overrides or None)
    except ConfigError as err:
        typer.echo(config_error(err), err=True)
        raise typer.Exit(code=2) from None
    shown = [row for row in rows if show_all or row["fate"] != "ppoflow key"]
    width = max((len(row["key"]) for row in shown), default=0)
    for row in shown:
        detail = f"→ {row['target']}" if row["target"] and row["target"] != row["key"] else ""
        detail = "; ".join(part for part in (detail, row["why"]) if part)
        typer.echo(f"{row['fate']:<22} {row['key']:<{width}}  {detail}".rstrip())
    counts: dict[str, int] = {}
    for row in rows:
        counts[row["fate"]] = counts.get(row["fate"], 0) + 1
    typer.echo(", ".join(f"{count} {fate}" for fate, count in counts.items()))


@config_app.command("defaults")
def defaults() -> None:
    """Print every key with its default and description (the content of configs/ppo_trainer.yaml)."""
    from stages.config import render_default_yaml

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


__all__ = ["config_app", "config_error", "config_messages", "register", "render_derived_comment"]
