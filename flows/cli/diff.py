"""``ppoflow diff RUN_A RUN_B [--step K] [--stage S] [--json]``: where two runs part, down to
the sample (flows/runs/diff.py finds it, flows/runs/diff_render.py prints it).

The first step where any stage artifact differs (or step K), the first stage in run order whose
artifact fingerprint differs (or stage S), the keys that differ in it, the first differing row in
generation order with each run's prompt and response decoded by its own tokenizer, and the
largest per-token differences of the log-probs and advantages. A run whose tokenizer cannot be
loaded shows token ids, under one ``note:`` line saying why. ``--json`` prints the same as one
JSON document.

Exit status, as diff(1): 0 when the runs are identical at the compared steps (and stage), 1 when
they differ, 2 for input that cannot be compared: one ``error:`` line naming the run, step or
stage and what would be right (a path that is not a run directory, unrelated runs, a step one
run lacks, a stage the step's journal does not record, a damaged journal or artifact). Nothing
is written.
"""

from __future__ import annotations

import json
from typing import Annotated

import typer

# what the command runs (torch, the artifacts, the tokenizer) is imported inside it, so that
# importing the command line stays cheap (flows/cli/app.py)


def diff_command(
    run_a: Annotated[str, typer.Argument(help="A run directory (or a re-run branch).")],
    run_b: Annotated[str, typer.Argument(help="The run directory to compare it with.")],
    step: Annotated[
        int | None,
        typer.Option("--step", help="Compare this step (default: the first step that differs)."),
    ] = None,
    stage: Annotated[
        str | None,
        typer.Option(
            "--stage", help="Compare only this stage (as the step journals name it, or input)."
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON document.")] = False,
) -> None:
    """Where two runs part: the first stage whose artifact differs, its keys, the first
    differing sample (decoded) and the largest per-token differences. Exit status 0 identical,
    1 different, 2 bad input."""
    from flows.runs.diff import diff_runs
    from flows.runs.diff_render import diff_json, diff_text
    from flows.runs.samples import Decoder, load_decoder
    from flows.runs.store import RunStore

    try:
        found = diff_runs(run_a, run_b, step=step, stage=stage)
    except (ValueError, OSError) as err:  # DiffInputError, RunReportError, ArtifactError
        typer.echo(f"error: {' '.join(str(err).split())}", err=True)
        raise typer.Exit(2) from None
    decoders, notes = {"a": Decoder(None, None), "b": Decoder(None, None)}, []
    if found.finding is not None and found.finding.row is not None:
        for label, root in (("a", found.a), ("b", found.b)):
            decoders[label] = load_decoder(RunStore(root))
            note = decoders[label].note
            if note is not None:
                notes.append(f"note: run {label}: {note.removeprefix('note: ')}")
    if as_json:
        typer.echo(json.dumps(diff_json(found, decoders, notes), indent=1, allow_nan=False))
    else:
        typer.echo(diff_text(found, decoders, notes))
    raise typer.Exit(0 if found.identical else 1)


def register(app: typer.Typer) -> None:
    """Add the ``diff`` command to the ``ppoflow`` app."""
    app.command("diff")(diff_command)


__all__ = ["diff_command", "register"]
