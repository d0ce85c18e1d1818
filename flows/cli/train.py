"""``ppoflow train CONFIG [key=value …] [--run-dir DIR]``: train, then print the run dir last.

Exit status: 0 on success; 2 for a bad config; 1 for any other failure, with a one-line error on
stderr (``--verbose`` shows the traceback instead).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import Annotated, Any

import typer

from flows.cli.config import config_messages
from flows.cli.error_lines import explain
from stages.config import ConfigError

QUIET_LOGGERS = {
    "prefect": logging.WARNING,
    "prefect.task_runs": logging.WARNING,
    "prefect.flow_runs": logging.CRITICAL,
}


#: ``--verbose`` of the commands that run flows (train, rerun)
VerboseOption = Annotated[
    bool,
    typer.Option(
        "--verbose", help="Print Prefect's per-task log lines, and a traceback on failure"
    ),
]


@contextmanager
def quiet_prefect(verbose: bool) -> Iterator[None]:
    """One line per step instead of Prefect's lines per task, unless ``verbose``; the per-run
    loggers' levels are restored afterwards ("prefect" stays quiet, since the temporary server's
    "Stopping …" line comes at interpreter exit, after the run dir).

    With a Prefect server configured (``PREFECT_API_URL``), the run loggers stay at INFO so the
    flow run's logs in the UI hold the progress lines; only the console drops their INFO lines.
    With Prefect's temporary server nobody reads those logs, so they are not made at all.
    """
    from prefect import flow  # noqa: F401  Prefect applies its logging config on this import

    saved = {name: logging.getLogger(name).level for name in QUIET_LOGGERS if name != "prefect"}
    console_filter = _RunLinesOffConsole()
    if not verbose:
        to_server = has_prefect_server()
        for name, level in QUIET_LOGGERS.items():
            keep = to_server and name != "prefect"  # INFO for the UI, not inherited WARNING
            logging.getLogger(name).setLevel(logging.INFO if keep else level)
        for handler in logging.getLogger().handlers:
            handler.addFilter(console_filter)
    try:
        yield
    finally:
        for name, level in saved.items():
            logging.getLogger(name).setLevel(level)
        for handler in logging.getLogger().handlers:
            handler.removeFilter(console_filter)


def has_prefect_server() -> bool:
    """True when Prefect is pointed at a server (``PREFECT_API_URL``, or the active profile)
    other than the temporary one this command started (flows/process/prefect_server.py)."""
    from flows.process.prefect_server import is_own_server

    url = os.environ.get("PREFECT_API_URL")  # read before Prefect's settings (cached at import)
    if url:
        return not is_own_server(url)
    from prefect.settings import get_current_settings

    return bool(get_current_settings().api.url)


class _RunLinesOffConsole(logging.Filter):
    """Drops from a console handler the flow / task run loggers' INFO records and their records
    that carry a traceback (Prefect's "Encountered exception during execution"): the failure
    reaches the terminal as the command's one ``error:`` line, and the traceback stays in the
    flow run's logs (the UI, with a server) and ``--verbose``."""

    def filter(self, record: logging.LogRecord) -> bool:
        is_run_line = record.name.startswith(("prefect.flow_runs", "prefect.task_runs"))
        return not (is_run_line and (record.levelno < logging.WARNING or record.exc_info))


def fail_in_one_line(
    err: Exception, verbose: bool, usage_errors: tuple[type[Exception], ...] = (ConfigError,)
) -> typer.Exit:
    """The one-line error (exit 2 for ``usage_errors`` — a bad config or argument — 1
    otherwise); re-raise if verbose."""
    if verbose:
        raise err
    if isinstance(err, ConfigError):  # every problem found in the one pass, one line each
        one = len(err.problems) == 1
        typer.echo(
            f"error: invalid config ({err.source}): {err.problems[0]}" if one else f"error: {err}",
            err=True,
        )
        return typer.Exit(code=2)
    explained = explain(err)  # flows/cli/error_lines.py
    if explained is not None:
        typer.echo(f"error: {explained}", err=True)
        return typer.Exit(code=1)
    typer.echo(f"error: {type(err).__name__}: {' '.join(str(err).split())}", err=True)
    return typer.Exit(code=2 if isinstance(err, usage_errors) else 1)


def train_command(
    config: Annotated[
        str, typer.Argument(help="Config file, or a name in configs/ (grpo, demo-cpu)")
    ],
    overrides: Annotated[
        list[str] | None,
        typer.Argument(help="key.path=value overrides, values parsed as YAML"),
    ] = None,
    run_dir: Annotated[
        str | None,
        typer.Option(
            "--run-dir",
            help="Run directory (local path or fsspec URL); default "
            "<ppoflow.artifact_dir>/<experiment_name>-<time>",
        ),
    ] = None,
    verbose: VerboseOption = False,
) -> None:
    """Train with PPO-family RL; the last line printed is the run directory."""
    from flows.step_flow import describe_source
    from flows.train import resolve_config

    with quiet_prefect(verbose), config_messages():
        try:
            cfg = resolve_config(config, overrides or [])  # a bad config fails before Prefect
            result = train_in_phases(cfg, run_dir, describe_source(config, overrides), verbose)
        except typer.Exit:  # a stop signal, already said
            raise
        except Exception as err:
            raise fail_in_one_line(err, verbose) from None
    typer.echo(result.run_dir)


def train_in_phases(cfg: Any, run_dir: str | None, source: str, verbose: bool) -> Any:
    """Run the train flow with the start-up output of flows/process/startup.py: a header line naming
    the build, ``source`` and the run directory; the phases; library output in
    ``<run_dir>/ppoflow.log`` until the first step, unless ``verbose``.

    With Prefect's temporary server started ahead (flows/process/prefect_server.py), the run is opened
    (model, data, engines, MLflow) before the flow run is created, while the server comes up, and
    the flow takes it over; with a configured server the flow run is created first, so an
    unreachable server fails before any model is built. While the flow runs, a temporary server
    that dies or stops answering stops the run with one line and ends the process
    (flows/process/server_guard.py).

    Unless ``verbose``, Prefect's log records (a failed task's "Finished in state Failed", a
    stop's "Crash detected!") go to the run's log file for the whole run, not the terminal, where
    the command's one line says what happened (flows/process/startup.py ``prefect_records_to``)."""
    from transformers.utils import logging as hf_logging

    from flows.process.prefect_server import own_server_settings, started_ahead
    from flows.process.server_guard import ServerGuard, exit_without_prefect, lost_line
    from flows.process.startup import log_file_for, prefect_records_to, startup_output
    from flows.process.stop_signals import exit_code, is_stop, stop_line, stop_on_signals
    from flows.train import train
    from flows.train_run import close_untaken_run, default_run_dir, open_run_ahead
    from flows.version import ppoflow_version
    from stages.engines.checkpoint import read_latest_step

    # transformers' progress bars (loading weights, writing a checkpoint's shards) would cut
    # into the command's own lines, at start-up and after it
    hf_logging.disable_progress_bar()
    run_dir = run_dir or default_run_dir(cfg)
    header = f"ppoflow {ppoflow_version()} · {source} · run dir {run_dir}"
    server = started_ahead()  # launched before the imports, still starting
    guard = ServerGuard(server)  # reads its bound now: a bad value fails before the run opens
    log_file = log_file_for(run_dir)
    with stop_on_signals(), ExitStack() as records:
        if not verbose:
            records.enter_context(prefect_records_to(log_file))
        try:
            with startup_output(header, log_file, capture=not verbose) as startup:
                try:
                    if server is not None:  # open the run meanwhile (the server's on another core)
                        open_run_ahead(cfg, run_dir, startup)
                    startup.begin("Prefect", prefect_doing())
                    if server is not None:
                        server.wait_ready()
                    with own_server_settings(), guard:
                        return train(cfg, [], run_dir)
                finally:
                    close_untaken_run(startup)  # the flow run never started
        except BaseException as err:
            lost = guard.settled()  # the server died or went silent: what the run stopped for
            if lost is None and not is_stop(err):
                raise
            kept = read_latest_step(cfg.trainer.default_local_dir)
            if is_stop(err):  # a stop signal came first (or during the loss): said as a stop
                line, code = stop_line(err, run_dir, kept), exit_code(err)
            else:
                line, code = f"error: {lost_line(guard, run_dir, kept)}", 1
            records.close()
            typer.echo(line, err=True)
            if lost is not None:  # Prefect's deliveries at exit would wait for the server
                exit_without_prefect(code)
            raise typer.Exit(code) from None


def prefect_doing() -> str:
    """What the Prefect phase waits for: the configured server, or the temporary one."""
    from flows.process.prefect_server import started_ahead

    server = started_ahead()
    if server is not None:
        return f"waiting for Prefect's temporary server on port {server.port}"
    if has_prefect_server():
        from prefect.settings import get_current_settings

        url = os.environ.get("PREFECT_API_URL") or get_current_settings().api.url
        return f"connecting to the Prefect server at {url}"
    return "starting Prefect's temporary server"


#: the examples ``ppoflow train --help`` ends with
TRAIN_EXAMPLES = (
    "Examples: ppoflow train demo-cpu · "
    "ppoflow train configs/demo-cpu.yaml actor_rollout_ref.rollout.n=8 "
    "trainer.total_training_steps=50 --run-dir runs/demo-n8 · every key with its default and "
    "meaning: ppoflow config defaults; a config resolved with overrides: "
    "ppoflow config show --config FILE key=value …"
)


def register(app: typer.Typer) -> None:
    """Add the ``train`` command to the ``ppoflow`` app."""
    app.command("train", epilog=TRAIN_EXAMPLES)(train_command)


__all__ = ["register", "train_command", "train_in_phases"]
