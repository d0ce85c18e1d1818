"""The ``ppoflow`` command line. Each area registers its commands from its own module."""

from __future__ import annotations

import typer

from flows import cli_artifacts, cli_config, cli_data, cli_rerun, cli_train

app = typer.Typer(
    name="ppoflow",
    help="PPO-family RL post-training for language models as a Prefect DAG of stage tasks.",
    no_args_is_help=True,
    add_completion=False,
)
cli_artifacts.register(app)
cli_config.register(app)
cli_data.register(app)
cli_rerun.register(app)
cli_train.register(app)

if __name__ == "__main__":
    app()
