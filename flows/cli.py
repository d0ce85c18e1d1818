"""The ``ppoflow`` command line. Each area registers its commands from its own module.

Every module ``flows/cli_<area>.py`` that defines ``register(app)`` is registered, in name order,
so a new command group is one new module. ``ppoflow --version`` prints the package version and
the checkout's commit (``flows.version``).
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import Annotated

import typer

import flows
from flows.version import version_line

app = typer.Typer(
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
    """The ``flows.cli_*`` modules, in name order."""
    return sorted(
        f"flows.{info.name}"
        for info in pkgutil.iter_modules(flows.__path__)
        if info.name.startswith("cli_")
    )


for _name in command_modules():
    _module = importlib.import_module(_name)
    if hasattr(_module, "register"):
        _module.register(app)

if __name__ == "__main__":
    app()
