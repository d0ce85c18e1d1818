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
from typing import Annotated

import typer

import flows.cli
from flows.cli._group import OneLineUsageErrors, click, one_line_usage_errors
from flows.version import version_line

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
