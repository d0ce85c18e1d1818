"""The ``ppoflow`` command group's class: one-line usage errors, flags without a type in help.

Its own module so that every group (``ppoflow`` and its sub-groups such as ``ppoflow config``)
uses it without importing the command line (flows/cli/app.py imports every command module).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import typer
from typer.core import TyperGroup

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


def without_flag_types(params: list[Any]) -> list[Any]:
    """``params`` with each on/off flag's type column blanked: typer's help shows every option's
    type, so a flag reads ``--verbose <bool>`` though it takes no value; a flag shows no type, as
    click's own help does. Mutates and returns ``params`` (the help option is created once per
    command and cached, so blanking it once holds).

    >>> from types import SimpleNamespace as Param
    >>> flag, value = Param(is_flag=True, metavar=None), Param(is_flag=False, metavar=None)
    >>> [p.metavar for p in without_flag_types([flag, value])]
    ['', None]
    """
    for param in params:
        if getattr(param, "is_flag", False) and param.metavar is None:
            param.metavar = ""
    return params


class OneLineUsageErrors(TyperGroup):
    """The ``ppoflow`` group: usage errors of the group and of every command below it (parsed
    in :meth:`invoke`) are printed by :func:`one_line_usage_errors`; flags show no type in help
    (:func:`without_flag_types`)."""

    def get_params(self, ctx: click.Context) -> list[Any]:
        return without_flag_types(super().get_params(ctx))

    def get_command(self, ctx: click.Context, cmd_name: str) -> Any:
        command = super().get_command(ctx, cmd_name)
        if command is not None:
            without_flag_types(command.get_params(ctx))
        return command

    def make_context(self, info_name: str | None, args: list[str], *a: Any, **kw: Any) -> Any:
        with one_line_usage_errors():
            return super().make_context(info_name, args, *a, **kw)

    def invoke(self, ctx: click.Context) -> Any:
        with one_line_usage_errors():
            return super().invoke(ctx)
