"""Bad command-line arguments: an unknown command or option, a missing or malformed argument, a
step or stage that is not there, an output that is in the way.

Usage errors are click's (flows/cli/app.py prints them as one line with the command's usage, exit
status 2); the others are the commands' own lines. Each leaves the run it names as it was and
writes no output directory.
"""

from __future__ import annotations

import pytest

# (test id, what the input is, arguments after ``ppoflow``, exit status, needles)
USAGE = [
    ("unknown-option", "an option the command does not have", ["train", "demo-cpu", "--nope"],
     2, ["No such option: --nope", "usage: ppoflow train [OPTIONS]", "see ppoflow train --help"]),
    ("unknown-command", "a misspelt command", ["trian", "demo-cpu"], 2,
     ["No such command 'trian'. Did you mean 'train'?", "see ppoflow --help"]),
    ("unknown-subcommand", "a misspelt `config` subcommand", ["config", "shwo"], 2,
     ["No such command 'shwo'", "see ppoflow config --help"]),
    ("missing-argument", "a command without its required argument", ["train"], 2,
     ["Missing argument 'config'", "usage: ppoflow train"]),
    ("missing-option", "`rerun` without its required `--from`", ["rerun", "run", "--step", "1"], 2,
     ["Missing option '--from'", "usage: ppoflow rerun"]),
    ("step-not-an-integer", "`--step abc`", ["inspect", "run", "--step", "abc"], 2,
     ["Invalid value for '--step'", "integer"]),
    ("not-a-choice", "`--verify quick` (full or lazy)", ["inspect", "run", "--verify", "quick"], 2,
     ["Invalid value for '--verify'", "'quick' is not one of 'full', 'lazy'"]),
    ("below-the-minimum", "`make-demo-data --n-train 0`",
     ["make-demo-data", "out", "--n-train", "0"], 2,
     ["Invalid value for '--n-train'", "greater than or equal to 1"]),
    ("max-below-min", "`make-demo-data --answer-length 5 --max-answer-length 3`",
     ["make-demo-data", "out", "--answer-length", "5", "--max-answer-length", "3"], 2,
     ["Invalid value for '--max-answer-length'", "3 is shorter than --answer-length 5"]),
    ("ledger-lengths-item", "`ledger --lengths 1,x`",
     ["ledger", "-b", "2", "-n", "2", "--prompt-len", "3", "--response-len", "4",
      "--lengths", "1,x"], 2, ["--lengths item 1 is 'x', expected an integer"]),
    ("ledger-lengths-count", "`ledger --lengths` with fewer lengths than rows",
     ["ledger", "-b", "2", "-n", "2", "--prompt-len", "3", "--response-len", "4",
      "--lengths", "1,2"], 2, ["got 2 lengths, expected B·n = 2·2 = 4 (one per row)"]),
    ("runs-not-a-directory", "`runs DIR` with a DIR that does not exist", ["runs", "out"], 2,
     ["out is not a directory; pass the directory that holds the run directories"]),
]  # fmt: skip


@pytest.mark.parametrize(
    ("described", "args", "code", "needles"), [pytest.param(*c[1:], id=c[0]) for c in USAGE]
)
def test_a_usage_error_is_one_line(
    ppoflow, expect, console, tmp_path, monkeypatch, described, args, code, needles
):
    monkeypatch.chdir(tmp_path)  # 'run' and 'out' are names of nothing here
    result = ppoflow(*args)
    expect(result, code, *needles, input=described, console=console())
    assert list(tmp_path.iterdir()) == []  # nothing written


# (test id, what the input is, arguments with {run} / {ckpt} / {model} / {out}, exit status,
# needles); {run} is the finished one-step run, {out} a directory that does not exist
ON_A_RUN = [
    ("inspect-no-such-step", "`inspect RUN --step 99`", ["inspect", "{run}", "--step", "99"], 1,
     ["{run}: no step 99 (steps with a journal: 1)"]),
    ("inspect-stage-without-step", "`inspect RUN --stage reward` without `--step`",
     ["inspect", "{run}", "--stage", "reward"], 2, ["--stage reward needs --step K"]),
    ("inspect-no-such-stage", "`inspect RUN --step 1 --stage nope`",
     ["inspect", "{run}", "--step", "1", "--stage", "nope"], 1,
     ["step 1 has no stage 'nope' (recorded: rollout, "]),
    ("export-no-such-step", "`export RUN --step 99 OUT`", ["export", "{run}", "--step", "99", "{out}"],
     2, ["{run}: no checkpoint of step 99; steps with a checkpoint under {ckpt}: [1]"]),
    ("export-without-step", "`export RUN OUT` without `--step`", ["export", "{run}", "{out}"], 2,
     ["{run}: pass --step K; steps with a checkpoint under {ckpt}: [1]"]),
    ("export-bad-dtype", "`export … --dtype float8`",
     ["export", "{run}", "--step", "1", "{out}", "--dtype", "float8"], 2,
     ["--dtype 'float8' is not one of ['bfloat16', 'float16', 'float32']"]),
    ("export-step-disagrees", "`export CKPT/global_step_1 OUT --step 2`",
     ["export", "{ckpt}/global_step_1", "{out}", "--step", "2", "--base", "{model}"], 2,
     ["--step 2 disagrees with the checkpoint folder {ckpt}/global_step_1 (step 1)"]),
    ("validate-neither", "`validate RUN` with neither `--step` nor `--model`", ["validate", "{run}"],
     2, ["give either --step K", "or --model DIR", "not both and not neither"]),
    ("validate-both", "`validate RUN --step 1 --model DIR`",
     ["validate", "{run}", "--step", "1", "--model", "{model}"], 2, ["not both and not neither"]),
    ("validate-no-such-step", "`validate RUN --step 99`", ["validate", "{run}", "--step", "99"], 2,
     ["{run}: no checkpoint of step 99; steps with a checkpoint under {ckpt}: [1]"]),
    ("validate-bad-override", "`validate RUN --step 1 data.val_batch_size=abc`",
     ["validate", "{run}", "--step", "1", "data.val_batch_size=abc"], 2,
     ["invalid config (", "data.val_batch_size: got 'abc' (str); expected an integer"]),
    ("resume-resume-mode-override", "`resume RUN trainer.resume_mode=disable`",
     ["resume", "{run}", "trainer.resume_mode=disable"], 2,
     ["drop the override 'trainer.resume_mode=disable'"]),
    ("resume-bad-override", "`resume RUN trainer.nope=1`", ["resume", "{run}", "trainer.nope=1"], 2,
     ["invalid config (", "trainer.nope: unknown key"]),
]  # fmt: skip


@pytest.mark.parametrize(
    ("described", "args", "code", "needles"), [pytest.param(*c[1:], id=c[0]) for c in ON_A_RUN]
)
def test_a_bad_argument_about_a_run_is_one_line(
    ppoflow, expect, fill, unchanged, console, finished, demo, tmp_path,
    described, args, code, needles,
):  # fmt: skip
    out = tmp_path / "out"
    paths = {"run": finished.run, "ckpt": finished.checkpoints, "model": demo.model, "out": out}
    with unchanged(*finished.dirs):
        result = ppoflow(*fill(args, **paths))
    expect(result, code, *fill(needles, **paths), input=described, console=console())
    assert not out.exists()


def test_export_into_a_directory_that_is_not_empty(ppoflow, expect, unchanged, finished, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "mine.txt").write_text("keep me")
    with unchanged(*finished.dirs, out):
        result = ppoflow("export", finished.run, "--step", "1", out)
    expect(result, 2, f"{out} is not empty; choose a new directory or pass --force",
           input="`export RUN --step 1 OUT` with files in OUT")  # fmt: skip


def test_make_sample_batch_onto_an_artifact(ppoflow, expect, unchanged, finished):
    target = finished.artifact("reward")
    with unchanged(*finished.dirs):
        result = ppoflow("make-sample-batch", target)
    expect(result, 1, f"{target}: already exists; pass --overwrite to replace it",
           input="`make-sample-batch PATH` onto an existing artifact")  # fmt: skip


# (test id, what the input is, arguments, needles); rerun runs a Prefect flow
RERUN = [
    ("rerun-no-such-step", "`rerun RUN --step 99 --from reward`",
     ["--step", "99", "--from", "reward"], ["{run} has no step 99; its steps are [1]"]),
    ("rerun-no-such-stage", "`rerun RUN --step 1 --from nope`", ["--step", "1", "--from", "nope"],
     ["--from 'nope' is not a stage; stages are ['rollout'"]),
    ("rerun-to-before-from", "`rerun … --from advantage --to reward`",
     ["--step", "1", "--from", "advantage", "--to", "reward"],
     ["--to 'reward' comes before --from 'advantage'; stages run in the order"]),
    ("rerun-into-a-run", "`rerun RUN … --run-dir RUN` (the new directory already holds a run)",
     ["--step", "1", "--from", "advantage", "--run-dir", "{run}"],
     ["{run} already holds a run; choose another --run-dir"]),
    ("rerun-into-the-parent", "`rerun RUN … --run-dir RUN/branch` (inside the run it reads)",
     ["--step", "1", "--from", "advantage", "--run-dir", "{run}/branch"],
     ["{run}/branch lies inside the run {run} (or a run it branched from), which a re-run only "
      "reads; choose a --run-dir outside it"]),
    ("rerun-bad-override", "`rerun RUN … algorithm.adv_estimator=nope`",
     ["--step", "1", "--from", "advantage", "algorithm.adv_estimator=nope"],
     ["invalid config (", "algorithm.adv_estimator: got 'nope'; allowed:"]),
]  # fmt: skip


@pytest.mark.usefixtures("as_without_a_server")
@pytest.mark.parametrize(
    ("described", "args", "needles"), [pytest.param(*c[1:], id=c[0]) for c in RERUN]
)
def test_a_bad_rerun_argument_is_one_line_and_writes_no_branch(
    ppoflow, expect, fill, unchanged, console, finished, tmp_path, described, args, needles
):
    branch = tmp_path / "branch"
    args = fill(args, run=finished.run)
    if "--run-dir" not in args:
        args += ["--run-dir", str(branch)]
    with unchanged(*finished.dirs):
        result = ppoflow("rerun", finished.run, *args)
    expect(result, 2, *fill(needles, run=finished.run), input=described, console=console())
    assert not branch.exists()
