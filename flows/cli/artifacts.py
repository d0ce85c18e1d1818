"""Artifact commands: ``ppoflow inspect`` (an artifact or a run directory), ``ppoflow ledger``
and ``ppoflow make-sample-batch``."""

from __future__ import annotations

import json
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer

# the commands import what they run (dataproto, the run report: torch, tensordict, Prefect) inside
# their functions, so that importing the command line stays cheap (flows/cli/app.py)


class VerifyMode(StrEnum):
    full = "full"
    lazy = "lazy"


class SampleSort(StrEnum):
    score = "score"
    advantage = "advantage"


def _fail(message: str, code: int = 1) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(code)


def inspect(
    path: Annotated[
        str,
        typer.Argument(
            help="A run directory or one artifact directory (local path or fsspec URL)."
        ),
    ],
    step: Annotated[
        int | None, typer.Option("--step", help="Run directory: show this step's stages.")
    ] = None,
    stage: Annotated[
        str | None,
        typer.Option(
            "--stage", help="Run directory, with --step: this stage's record and artifact."
        ),
    ] = None,
    as_json: Annotated[
        bool,
        typer.Option(
            "--json",
            help="Run directory: print one JSON document (config; per step: stage status, "
            'artifact, fingerprint, timing, metrics). NaN/inf are written as {"float": "nan"}.',
        ),
    ] = False,
    verify: Annotated[
        VerifyMode,
        typer.Option(help="full: hash every file first; lazy: sizes, headers and small files."),
    ] = VerifyMode.full,
    samples: Annotated[
        int | None,
        typer.Option(
            "--samples",
            min=1,
            help="Run directory, with --step: show N of the step's samples, decoded, each with "
            "its own score, reward extras, advantage (mean over response_mask), uid and "
            "data_source, and an agent rollout's turns.",
        ),
    ] = None,
    sort: Annotated[
        SampleSort | None,
        typer.Option("--sort", help="With --samples: highest score or advantage first."),
    ] = None,
    where: Annotated[
        list[str] | None,
        typer.Option(
            "--where",
            help="With --samples: only samples whose column KEY (uid, data_source, a reward "
            "extra, …) has the string value VALUE, e.g. acc=1.0; repeat to require several.",
        ),
    ] = None,
    html_out: Annotated[
        str | None,
        typer.Option(
            "--html",
            help="Run directory, with --step: write the step's samples as one self-contained "
            "HTML page to this file (each token coloured by its advantage, ratio or log-prob; "
            "filters by score and group)",
        ),
    ] = None,
) -> None:
    """Describe a run directory (steps × stages: ran / cached / skipped, sizes, key metrics) or an
    artifact (manifest, schema, per-key statistics, token ledger); with --samples, a step's
    samples; with --html, a page of them."""
    from flows.runs import report as run_report
    from flows.runs.report import RunReportError

    try:
        kind = run_report.path_kind(path)
    except RunReportError as err:
        raise _fail(str(err)) from None
    if html_out is not None:
        if kind == "artifact" or step is None or stage is not None or samples is not None:
            raise _fail(
                "--html writes one step of a run directory: give the run directory and --step K "
                "(without --stage or --samples)",
                code=2,
            )
        inspect_html(path, step, html_out, verify)
        return
    if samples is not None or sort is not None or where:
        check_sample_options(path, kind, step, stage, samples)
        inspect_samples(path, step, samples, sort, where or [], as_json, verify)
        return
    if kind == "artifact":
        if step is not None or stage is not None or as_json:
            raise _fail(
                f"{path} is an artifact directory; --step, --stage and --json apply to a run "
                "directory (inspect the run, or drop those options)",
                code=2,
            )
        inspect_artifact(path, verify)
    else:
        inspect_run(path, step, stage, as_json, verify)


def inspect_artifact(path: str, verify: VerifyMode) -> None:
    """Print an artifact's manifest, schema, per-key statistics and token ledger."""
    from dataproto.artifact import ArtifactError
    from dataproto.report import describe_artifact
    from flows.runs.derived_keys import from_step_input

    try:
        from stages.ppo import PPO_STAGES

        complete = from_step_input(path, verify.value, PPO_STAGES)  # the rollout's derived keys
        typer.echo(describe_artifact(path, verify=verify.value, complete=complete))
    except ArtifactError as err:
        raise _fail(str(err)) from None


def inspect_run(
    path: str, step: int | None, stage: str | None, as_json: bool, verify: VerifyMode
) -> None:
    """Print the run overview, one step, one stage, or the JSON document (flows/runs/report.py)."""
    if stage is not None and step is None:
        raise _fail(f"--stage {stage} needs --step K (the step whose stage to show)", code=2)
    from flows.runs import report as run_report
    from flows.runs.store import RunStore

    store = RunStore(path)
    try:
        if as_json:
            document = run_report.run_json(store, step, stage)
            typer.echo(json.dumps(document, indent=1, allow_nan=False))
        elif stage is not None:
            typer.echo(run_report.stage_text(store, step, stage, verify=verify.value))
        elif step is not None:
            typer.echo(run_report.step_text(store, step))
        else:
            typer.echo(run_report.run_table(store))
    except ValueError as err:  # RunReportError, ArtifactError
        raise _fail(str(err)) from None


def check_sample_options(
    path: str, kind: str, step: int | None, stage: str | None, samples: int | None
) -> None:
    """Usage errors (exit status 2) of --samples / --sort / --where, before anything is read."""
    if kind == "artifact":
        raise _fail(
            f"{path} is an artifact directory; --samples, --sort and --where show a step of a "
            "run directory (inspect the run with --step K --samples N)",
            code=2,
        )
    if samples is None:
        raise _fail("--sort and --where choose among a step's samples; add --samples N", code=2)
    if step is None:
        raise _fail(f"--samples {samples} needs --step K (the step whose samples to show)", code=2)
    if stage is not None:
        raise _fail(
            f"--samples joins a step's stages; drop --stage {stage} (or --samples, to see the "
            "stage's artifact)",
            code=2,
        )


def inspect_samples(
    path: str,
    step: int,
    limit: int,
    sort: SampleSort | None,
    where: list[str],
    as_json: bool,
    verify: VerifyMode,
) -> None:
    """Print a step's samples as text or one JSON document (flows/runs/samples.py)."""
    from flows.runs import samples as step_samples
    from flows.runs import samples_render
    from flows.runs.store import RunStore

    try:
        conditions = step_samples.parse_where(where)
    except ValueError as err:
        raise _fail(str(err), code=2) from None
    store = RunStore(path)
    order = None if sort is None else sort.value
    try:
        found = step_samples.load_step_samples(store, step, verify=verify.value)
        shown, matched = step_samples.select_samples(found, conditions, order, limit)
    except ValueError as err:  # RunReportError, ArtifactError
        raise _fail(str(err)) from None
    decoder = step_samples.load_decoder(store)
    if as_json:
        document = samples_render.samples_json(found, shown, matched, conditions, order, decoder)
        typer.echo(json.dumps(document, indent=1, allow_nan=False))
    else:
        typer.echo(samples_render.samples_text(found, shown, matched, conditions, order, decoder))


def inspect_html(path: str, step: int, out: str, verify: VerifyMode) -> None:
    """Write step ``step``'s samples page to ``out`` (flows/runs/sample_page.py); prints the
    file. A run whose tokenizer cannot be loaded is an error: the page shows text."""
    from flows.runs import samples as step_samples
    from flows.runs.sample_page import render_page
    from flows.runs.store import RunStore

    store = RunStore(path)
    try:
        found = step_samples.load_step_samples(store, step, verify=verify.value)
    except ValueError as err:  # RunReportError, ArtifactError
        raise _fail(str(err)) from None
    decoder = step_samples.load_decoder(store)
    if decoder.tokenizer is None:
        raise _fail(f"--html needs the run's tokenizer to show text: {decoder.problem}")
    target = Path(out)
    if target.is_dir():
        raise _fail(
            f"--html {out} is a directory; name the page's file, e.g. {out}/step_{step}.html",
            code=2,
        )
    page = render_page(found, decoder)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(page, encoding="utf-8")
    typer.echo(str(target))


def parse_lengths(text: str) -> list[int]:
    """``"3,0,5"`` → ``[3, 0, 5]``; a bad item is a ValueError naming it."""
    out = []
    for i, item in enumerate(text.split(",")):
        try:
            out.append(int(item.strip()))
        except ValueError:
            raise ValueError(
                f"--lengths item {i} is {item.strip()!r}, expected an integer"
            ) from None
    return out


def ledger(
    batch: Annotated[int, typer.Option("--batch", "-b", help="B: prompts per step.")],
    n: Annotated[int, typer.Option("--n", "-n", help="n: samples per prompt (rollout.n).")],
    prompt_len: Annotated[int, typer.Option(help="P: prompt length in tokens.")],
    response_len: Annotated[int, typer.Option(help="R: response width in tokens.")],
    lengths: Annotated[
        str | None,
        typer.Option(
            help="Comma-separated valid response lengths L_i, B·n of them (default: all R)."
        ),
    ] = None,
    dp_size: Annotated[int, typer.Option(help="Data-parallel ranks, for the per-rank note.")] = 1,
) -> None:
    """Print the token ledger of a rollout batch: rows, valid tokens, reward positions, weights."""
    from dataproto.ledger import ledger_from_params

    try:
        parsed = None if lengths is None else parse_lengths(lengths)
        result = ledger_from_params(batch, n, prompt_len, response_len, parsed, dp_size=dp_size)
    except ValueError as err:
        raise _fail(str(err), code=2) from None
    typer.echo(result.format())


def make_sample_batch_command(
    path: Annotated[str, typer.Argument(help="Where to write the artifact (dir or fsspec URL).")],
    batch: Annotated[int, typer.Option("--batch", "-b", help="B: prompts.")] = 4,
    n: Annotated[int, typer.Option("--n", "-n", help="n: samples per prompt.")] = 2,
    prompt_len: Annotated[int, typer.Option(help="P: prompt width.")] = 16,
    response_len: Annotated[int, typer.Option(help="R: response width.")] = 32,
    seed: Annotated[int, typer.Option(help="Random seed.")] = 0,
    overwrite: Annotated[bool, typer.Option(help="Replace an existing artifact.")] = False,
) -> None:
    """Write a synthetic rollout batch artifact (left-padded prompts, right-padded responses,
    some aborted rows, rm_scores at L_i − 1, uid / data_source / reward_model columns)."""
    import fsspec

    from dataproto.artifact import save_artifact
    from dataproto.sample_batch import make_sample_batch

    fs, root = fsspec.core.url_to_fs(path)
    if not overwrite and fs.exists(root):  # the library's own line advises overwrite=True
        raise _fail(
            f"{path}: already exists; pass --overwrite to replace it, or choose another PATH"
        )
    try:
        data = make_sample_batch(batch, n, prompt_len, response_len, seed=seed)
        ref = save_artifact(
            data,
            path,
            stage="sample",
            config={"batch": batch, "n": n, "prompt_len": prompt_len, "response_len": response_len},
            extra={"seed": seed, "synthetic": True},
            overwrite=overwrite,
        )
    except ValueError as err:  # ArtifactError is a ValueError
        raise _fail(str(err)) from None
    typer.echo(f"wrote {ref.rows} rows ({ref.nbytes} bytes) to {ref.path}")
    typer.echo(f"fingerprint {ref.fingerprint}")
    typer.echo(f"next: ppoflow inspect {ref.path}")


def register(app: typer.Typer) -> None:
    """Add this module's commands to the `ppoflow` app."""
    app.command("inspect")(inspect)
    app.command("ledger")(ledger)
    app.command("make-sample-batch")(make_sample_batch_command)
