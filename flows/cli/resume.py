"""``ppoflow resume RUN_DIR [key=value …]``: continue a run in place from its newest checkpoint.

The run's saved config (``RUN_DIR/config.json``) plus the overrides (e.g.
``trainer.total_training_steps=6`` for more steps) is trained again into RUN_DIR itself with
``trainer.resume_mode=auto``: the newest checkpoint under the run's ``trainer.default_local_dir``
is restored, the journals of the steps up to it stay, the steps after it are written again, and
the MLflow run it recorded continues (flows/train.py). The command runs in the working directory
the run started in (``run_info.json`` ``working_dir``), so the relative paths of its config (data,
model, checkpoints, artifact dir) mean what they meant; it says so when that is not the current
one. The last line printed is the run directory, as for ``ppoflow train``.

Refused with one line and exit status 2: a directory without ``config.json`` (not a run), an
override of ``trainer.resume_mode`` / ``trainer.resume_from_path`` (this command always takes the
newest checkpoint), a run without a checkpoint, and a newest checkpoint that another run wrote
(checkpoint folders can be shared between runs; the run directories are compared with symbolic
links resolved, so a run resumed through a link to its directory is the run itself). Exit status 1 for a failure while training.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from flows.cli.train import (
    VerboseOption,
    config_messages,
    fail_in_one_line,
    quiet_prefect,
    train_in_phases,
)
from stages.config import ConfigError

if TYPE_CHECKING:
    from flows.runs.store import RunStore
    from stages.config import PPORunConfig

#: keys ``ppoflow resume`` sets itself
RESUME_KEYS = ("trainer.resume_mode", "trainer.resume_from_path")


def open_resumable(run_dir: str) -> RunStore:
    """The run at ``run_dir``; ``ValueError`` when it is not a ppoflow run directory."""
    from flows.runs.store import CONFIG_FILE, RunStore  # late: the run store brings torch

    store = RunStore(run_dir)
    if not store.exists(CONFIG_FILE):
        raise ValueError(
            f"{store.root} is not a ppoflow run directory (no {CONFIG_FILE}); pass the directory "
            "that ppoflow train printed last"
        )
    return store


def started_in(store: RunStore) -> str | None:
    """The working directory the run started in (its run_info.json), when it still exists."""
    from flows.runs.store import RUN_INFO_FILE

    if not store.exists(RUN_INFO_FILE):
        return None
    working_dir = store.load_run_info().get("working_dir")
    return working_dir if working_dir and Path(working_dir).is_dir() else None


def resume_config(store: RunStore, overrides: Sequence[str]) -> tuple[PPORunConfig, int]:
    """(the run's config with ``overrides`` and ``trainer.resume_mode=auto``, the step of the
    checkpoint it resumes from). Relative paths are read from the current directory.

    Raises:
        ValueError: an override of :data:`RESUME_KEYS`; no checkpoint; the newest checkpoint
            was written by another run.
    """
    from flows.runs.branches import same_run
    from flows.runs.checkpoints import checkpoint_run, read_run_state, resume_checkpoint
    from flows.runs.store import CONFIG_FILE
    from stages.config import apply_overrides, validate_config

    for override in overrides:
        key = override.split("=", 1)[0].lstrip("+~")
        if key in RESUME_KEYS:
            raise ValueError(
                f"ppoflow resume takes the run's newest checkpoint itself; drop the override "
                f"{override!r} (ppoflow train CONFIG {key}=… resumes from another checkpoint)"
            )
    saved = validate_config(store.load_config(), f"{store.root}/{CONFIG_FILE}")
    cfg = apply_overrides(saved, [*overrides, "trainer.resume_mode=auto"])
    root = cfg.trainer.default_local_dir
    checkpoint, _ = resume_checkpoint(cfg.trainer, verify="fast")  # the training says what it skips
    if checkpoint is None:
        raise ValueError(
            f"{store.root} has no checkpoint to resume from: trainer.default_local_dir "
            f"{os.path.abspath(root)} holds no latest_checkpointed_iteration.txt (the run saves "
            f"one every trainer.save_freq={cfg.trainer.save_freq} steps)"
        )
    step = checkpoint.step
    writer = checkpoint_run(read_run_state(root, step, verify="fast"))["run_dir"]
    if writer is not None and not same_run(writer, store.root):  # links resolved
        raise ValueError(
            f"the newest checkpoint in {os.path.abspath(root)} (step {step}) was written by the "
            f"run {writer}, not {store.root}; resume that run, or give this one its own "
            "trainer.default_local_dir"
        )
    return cfg, step


@contextmanager
def working_directory(path: str | None) -> Iterator[None]:
    """Run the block in ``path`` (None: where we are), then come back."""
    before = os.getcwd()
    if path is not None:
        os.chdir(path)
    try:
        yield
    finally:
        os.chdir(before)


def resume_command(
    run_dir: Annotated[str, typer.Argument(help="The run directory to continue (in place).")],
    overrides: Annotated[
        list[str] | None,
        typer.Argument(help="key.path=value overrides of the run's config, values parsed as YAML"),
    ] = None,
    verbose: VerboseOption = False,
) -> None:
    """Continue a run in place from its newest checkpoint, in the same MLflow run; the last
    line printed is the run directory."""
    with quiet_prefect(verbose), config_messages():
        try:
            store = open_resumable(run_dir)
            origin = started_in(store)
            moved = origin is not None and os.path.realpath(origin) != os.path.realpath(".")
            with working_directory(origin):
                cfg, _ = resume_config(store, overrides or [])
                if moved:
                    typer.echo(f"working directory: {origin} (where the run started)")
                result = train_in_phases(cfg, store.root, f"resume {store.root}", verbose)
        except typer.Exit:  # a stop signal, already said
            raise
        except Exception as err:
            raise fail_in_one_line(err, verbose, usage_errors=(ValueError, ConfigError)) from None
    typer.echo(result.run_dir)


def register(app: typer.Typer) -> None:
    """Add the ``resume`` command to the ``ppoflow`` app."""
    app.command("resume")(resume_command)


__all__ = ["open_resumable", "register", "resume_command", "resume_config", "started_in"]
