"""The ``ppoflow`` command line. Each area registers its commands from its own module.

Every module ``flows/cli/<area>.py`` that defines ``register(app)`` is registered, in name order,
so a new command group is one new module. ``ppoflow --version`` prints the package version and
the checkout's commit (``flows.version``). A usage error (an unknown command or option, a missing
or malformed argument) is one ``error:`` line with the command's usage, exit status 2, like the
commands' own errors (``flows/cli/train.py`` ``fail_in_one_line``), not click's boxed panel.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Annotated, Any

import typer
from typer.core import TyperGroup

import flows.cli
from flows.version import version_line

try:  # typer ≥ 0.25 parses with its own copy of click, whose exceptions are the ones raised
    from typer import _click as click
except ImportError:  # pragma: no cover - older typer runs on click itself
    import click


def usage_line(err: click.UsageError) -> str:
    """The one line a usage error prints: click's message, the command's usage and its help.

    >>> from typer.core import TyperCommand
    >>> ctx = click.Context(TyperCommand(name="train"), info_name="ppoflow train")
    >>> usage_line(click.exceptions.UsageError("No such option: --nope", ctx))
    'error: No such option: --nope (usage: ppoflow train [OPTIONS]; see ppoflow train --help)'
    """
    message = " ".join(err.format_message().split())
    if err.ctx is None:
        return f"error: {message}"
    usage = " ".join(err.ctx.get_usage().removeprefix("Usage:").split())
    return f"error: {message} (usage: {usage}; see {err.ctx.command_path} --help)"


@contextmanager
def one_line_usage_errors() -> Iterator[None]:
    """Turn a click usage error raised in the block into :func:`usage_line` and exit 2."""
    try:
        yield
    except click.exceptions.NoArgsIsHelpError:  # a bare ``ppoflow`` / ``ppoflow config``: help
        raise
    except click.exceptions.UsageError as err:
        typer.echo(usage_line(err), err=True)
        raise typer.Exit(err.exit_code) from None


class OneLineUsageErrors(TyperGroup):
    """The ``ppoflow`` group: usage errors of the group and of every command below it (parsed
    in :meth:`invoke`) are printed by :func:`one_line_usage_errors`."""

    def make_context(self, info_name: str | None, args: list[str], *a: Any, **kw: Any) -> Any:
        with one_line_usage_errors():
            return super().make_context(info_name, args, *a, **kw)

    def invoke(self, ctx: click.Context) -> Any:
        with one_line_usage_errors():
            return super().invoke(ctx)


app = typer.Typer(
    cls=OneLineUsageErrors,
    name="ppoflow",
    help="PPO-family RL post-training for language models as a Prefect DAG of stage tasks.",
    no_args_is_help=True,
    add_completion=False,
)


def _print_version(value: bool) -> None:
    if value:
        typer.echo(version_line())
        raise typer.Exit()


@app.callback()
def main(
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_print_version, is_eager=True, help="Print the version and exit"
        ),
    ] = False,
) -> None:
    """PPO-family RL post-training for language models as a Prefect DAG of stage tasks."""


def command_modules() -> list[str]:
    """The public modules of ``flows.cli`` other than this one, in name order (those that
    define ``register(app)`` add commands; ``__main__`` runs the app, it adds none)."""
    return sorted(
        f"{__package__}.{info.name}"
        for info in pkgutil.iter_modules(flows.cli.__path__)
        if not info.name.startswith("_") and f"{__package__}.{info.name}" != __name__
    )


def check_command_line(args: list[str]) -> None:
    """Parse ``args`` (a command's name, then its arguments) as the command line will, without
    running the command, and check a ``config`` argument's file: a usage error or a config that
    is not there is one ``error:`` line and exit status 2 (:class:`SystemExit`). The ``ppoflow``
    executable calls it for a training command before it starts Prefect's server and the MLflow
    process (flows/cli/entry.py), so a typo answers at once."""
    from flows.cli.config import config_error
    from stages.config import ConfigError, resolve_config_path

    group = typer.main.get_command(app)
    name, *rest = args
    try:
        with one_line_usage_errors():
            root = click.Context(group, info_name=app.info.name)
            command = group.get_command(root, name)
            parsed = command.make_context(name, rest, parent=root)
        config = parsed.params.get("config")
        if isinstance(config, str):
            resolve_config_path(config)
    except typer.Exit as done:
        raise SystemExit(done.exit_code) from None
    except ConfigError as err:
        typer.echo(config_error(err), err=True)
        raise SystemExit(2) from None


for _name in command_modules():
    _module = importlib.import_module(_name)
    if hasattr(_module, "register"):
        _module.register(app)

if __name__ == "__main__":
    app()
