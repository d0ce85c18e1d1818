"""``ppoflow rerun RUN_DIR --step K --from STAGE [--to STAGE] [key=value …] [--run-dir NEW]
[--sweep KEY=V1,V2,… …]``.

Recomputes stages of one past step into a new run directory (flows/rerun.py), prints which
stages ran, were cached or reused, and the metric diff against the original; the last line
printed is the new run directory. Exit status: 0 on success; 2 for a bad config or argument; 1
for any other failure, with a one-line error on stderr. The run branched from is only read, and a
refused or failed re-run leaves no new run directory (flows/rerun.py). With ``--sweep`` one
branch per point of the grid, the table of metrics × branches (flows/rerun_sweep.py).
"""

from __future__ import annotations

from typing import Annotated

import typer

from flows.cli.train import VerboseOption, config_messages, fail_in_one_line, quiet_prefect
from stages.config import ConfigError

# flows.rerun (the engines, torch, Prefect) is imported by the command, not by the command line


def describe(result) -> str:
    """The stages' statuses, the engines built and the metric diff (a ``flows.rerun.RerunResult``),
    as printed by the command."""
    from flows.rerun_diff import format_diff

    lines = [f"re-run of step {result.step} of {result.parent_dir}"]
    for record in result.records:
        lines.append(f"  {record.stage:<14} {record.status:<8} {record.reason}")
    built = ", ".join(result.engines_built) or "none"
    lines.append(f"engines built: {built}")
    lines.append(format_diff(result.changes, result.unchanged))
    return "\n".join(lines)


def rerun_command(
    run_dir: Annotated[str, typer.Argument(help="The run directory to branch from (read only).")],
    step: Annotated[int, typer.Option("--step", help="The global step K to re-run.")],
    from_stage: Annotated[
        str,
        typer.Option(
            "--from", help="First stage to recompute (rollout … metrics; a wrong name lists them)."
        ),
    ],
    overrides: Annotated[
        list[str] | None,
        typer.Argument(help="key.path=value overrides of the run's config, values parsed as YAML"),
    ] = None,
    to_stage: Annotated[
        str | None, typer.Option("--to", help="Last stage to run (default: metrics, the end).")
    ] = None,
    new_run_dir: Annotated[
        str | None,
        typer.Option("--run-dir", help="New run directory; default <RUN_DIR>-rerun-step<K>-…"),
    ] = None,
    refresh: Annotated[
        bool, typer.Option("--refresh", help="Recompute even the stages whose cache still holds")
    ] = False,
    gen_round: Annotated[
        int | None,
        typer.Option(
            "--round",
            help="With dynamic sampling (algorithm.filter_groups): re-run this generation "
            "round's stages (rollout, reward) instead of the step's training stages",
        ),
    ] = None,
    sweeps: Annotated[
        list[str] | None,
        typer.Option(
            "--sweep",
            help="KEY=V1,V2,…: one branch per value (several --sweep: every combination) in "
            "a sweep directory (--run-dir); prints metrics × branches, the original first",
        ),
    ] = None,
    parallel: Annotated[
        int,
        typer.Option(
            "--parallel",
            help="With --sweep: run this many branches at once, each in a process of its own "
            "with a share of the torch threads, or its own CUDA devices (default 1: one after "
            "another in this process)",
        ),
    ] = 1,
    verbose: VerboseOption = False,
) -> None:
    """Recompute stages of a past step into a new run dir and diff its metrics; the last line
    printed is the new run directory (with --sweep: the sweep directory)."""
    if parallel != 1 and not sweeps:
        raise fail_in_one_line(
            ValueError(f"--parallel {parallel} runs the branches of a sweep at once; add --sweep"),
            verbose,
            usage_errors=(ValueError,),
        )
    if sweeps:
        sweep_command(
            run_dir,
            step,
            from_stage,
            sweeps,
            overrides,
            to_stage,
            new_run_dir,
            refresh,
            gen_round,
            verbose,
            parallel,
        )
        return
    from flows.rerun import rerun

    with quiet_prefect(verbose), config_messages():
        try:
            result = rerun(
                run_dir,
                step,
                from_stage,
                to_stage,
                overrides or [],
                new_run_dir,
                refresh,
                gen_round=gen_round,
            )
        except Exception as err:
            raise fail_in_one_line(err, verbose, usage_errors=(ValueError, ConfigError)) from None
    typer.echo(describe(result))
    typer.echo(result.run_dir)


def describe_sweep(result) -> str:
    """Each branch (its overrides, stage statuses and directory), then the metrics × branches
    table (a ``flows.rerun_sweep.SweepResult``), as printed by the command."""
    from flows.rerun_sweep import ORIGINAL, format_table, label

    at_once = f", {result.parallel} at a time" if result.parallel > 1 else ""
    lines = [
        f"sweep of step {result.step} of {result.parent_dir}: {len(result.branches)} branches"
        f"{at_once}"
    ]
    columns = {ORIGINAL: ORIGINAL}
    for i, (point, branch) in enumerate(zip(result.points, result.branches, strict=True)):
        ran = [r.stage for r in branch.records if r.status == "ran"]
        columns[label(point)] = f"b{i}"
        lines.append(
            f"  b{i}  {label(point)}: ran {', '.join(ran) or 'nothing'} → {branch.run_dir}"
        )
    lines.append(format_table(result.rows, columns))
    return "\n".join(lines)


def sweep_command(
    run_dir: str,
    step: int,
    from_stage: str,
    sweeps: list[str],
    overrides: list[str] | None,
    to_stage: str | None,
    sweep_dir: str | None,
    refresh: bool,
    gen_round: int | None,
    verbose: bool,
    parallel: int = 1,
) -> None:
    """``ppoflow rerun … --sweep``: the branches of the grid, the table, the sweep directory."""
    from flows.rerun_sweep import sweep

    with quiet_prefect(verbose), config_messages():
        try:
            if gen_round is not None:
                raise ValueError("--sweep re-runs a step's training stages; leave out --round")
            result = sweep(
                run_dir, step, from_stage, sweeps, to_stage, overrides or [], sweep_dir, refresh,
                parallel,
            )  # fmt: skip
        except Exception as err:
            raise fail_in_one_line(err, verbose, usage_errors=(ValueError, ConfigError)) from None
    typer.echo(describe_sweep(result))
    typer.echo(result.sweep_dir)


def register(app: typer.Typer) -> None:
    """Add the ``rerun`` command to the ``ppoflow`` app."""
    app.command("rerun")(rerun_command)


__all__ = ["describe", "describe_sweep", "register", "rerun_command", "sweep_command"]
