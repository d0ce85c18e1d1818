"""Bad run directories: a directory that is not a run, and a run whose journal, config.json or
run_info.json is truncated or no longer validates.

``resume``, ``rerun``, ``inspect``, ``validate`` and ``export`` each refuse with one line naming
the directory or the file, and leave the run as they found it: no file of it is rewritten or
added (the damaged file stays as damaged), and a refused re-run writes no branch directory.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

# --- a directory that is not a run -------------------------------------------------------------

# (test id, what the input is, arguments with {dir} / {out}, exit status, needles)
NOT_A_RUN = [
    ("resume-not-a-run", "`resume DIR`, DIR not a run directory", ["resume", "{dir}"], 2,
     ["{dir} is not a ppoflow run directory (no config.json); pass the directory that ppoflow "
      "train printed last"]),
    ("rerun-not-a-run", "`rerun DIR …`, DIR not a run directory",
     ["rerun", "{dir}", "--step", "1", "--from", "reward", "--run-dir", "{out}"], 2,
     ["{dir} is not a ppoflow run directory (no config.json); pass the directory that ppoflow "
      "train printed last"]),
    ("inspect-not-a-run", "`inspect DIR`, DIR neither a run nor an artifact", ["inspect", "{dir}"],
     1, ["{dir} is not a run or artifact directory: expected a run directory (with config.json or "
         "step_<k>/journal.json, as `ppoflow train` writes) or an artifact directory"]),
    ("validate-not-a-run", "`validate DIR --step 1`, DIR not a run directory",
     ["validate", "{dir}", "--step", "1"], 2,
     ["{dir} is not a run directory: it has no config.json and step journals written by ppoflow "
      "train"]),
    ("export-not-a-run", "`export DIR --step 1 OUT`, DIR not a run or checkpoint",
     ["export", "{dir}", "--step", "1", "{out}"], 2,
     ["{dir} is neither a run directory (config.json) nor a checkpoint folder; expected a run "
      "directory or …/global_step_<K>"]),
]  # fmt: skip


@pytest.mark.usefixtures("as_without_a_server", "prefect_harness")
@pytest.mark.parametrize(
    ("described", "args", "code", "needles"), [pytest.param(*c[1:], id=c[0]) for c in NOT_A_RUN]
)
def test_a_directory_that_is_not_a_run_is_refused_and_left_alone(
    ppoflow, expect, fill, unchanged, console, tmp_path, described, args, code, needles
):
    plain, out = tmp_path / "plain", tmp_path / "out"
    plain.mkdir()
    (plain / "notes.txt").write_text("not a run")

    with unchanged(plain):  # above all: no config.json written into it
        result = ppoflow(*fill(args, dir=plain, out=out))
    expect(result, code, *fill(needles, dir=plain, out=out), input=described, console=console())
    assert not out.exists()


def test_resume_of_the_checkpoint_folder_instead_of_the_run(ppoflow, expect, unchanged, finished):
    with unchanged(*finished.dirs):
        result = ppoflow("resume", finished.checkpoints)
    expect(result, 2, f"{finished.checkpoints} is not a ppoflow run directory (no config.json)",
           input="`resume CKPT` (the checkpoint folder, not the run)")  # fmt: skip


# --- damaged files of a finished run ---------------------------------------------------------


def bad_value(path: Path) -> None:
    """config.json with a value the schema refuses (a hand edit)."""
    config = json.loads(path.read_text())
    config["trainer"]["total_training_steps"] = "ten"
    path.write_text(json.dumps(config))


JOURNAL, CONFIG, RUN_INFO = "run/step_1/journal.json", "run/config.json", "run/run_info.json"
TRUNCATED_JOURNAL = "step_1/journal.json: the journal for step 1 is not valid JSON ("
TRUNCATED_CONFIG = "run/config.json: the config.json is not valid JSON ("

# (test id, what the input is, file under the finished root, damage, command, exit, needles);
# the command's {run} is the finished run, {out} a directory that does not exist
DAMAGED = [
    ("inspect-truncated-journal", "`inspect RUN`, a truncated step journal", JOURNAL, "truncate",
     ["inspect", "{run}"], 1, [TRUNCATED_JOURNAL, "the file is truncated or damaged"]),
    ("inspect-step-truncated-journal", "`inspect RUN --step 1 --json`, a truncated journal",
     JOURNAL, "truncate", ["inspect", "{run}", "--step", "1", "--json"], 1, [TRUNCATED_JOURNAL]),
    ("rerun-truncated-journal", "`rerun RUN --step 1 …`, a truncated journal", JOURNAL,
     "truncate", ["rerun", "{run}", "--step", "1", "--from", "advantage", "--run-dir", "{out}"], 2,
     [TRUNCATED_JOURNAL]),
    ("resume-truncated-config", "`resume RUN`, a truncated config.json", CONFIG, "truncate",
     ["resume", "{run}"], 2, [TRUNCATED_CONFIG, "the file is truncated or damaged"]),
    ("inspect-truncated-config", "`inspect RUN`, a truncated config.json", CONFIG, "truncate",
     ["inspect", "{run}"], 1, [TRUNCATED_CONFIG]),
    ("export-truncated-config", "`export RUN --step 1 OUT`, a truncated config.json", CONFIG,
     "truncate", ["export", "{run}", "--step", "1", "{out}"], 2, [TRUNCATED_CONFIG]),
    ("validate-truncated-config", "`validate RUN --step 1`, a truncated config.json", CONFIG,
     "truncate", ["validate", "{run}", "--step", "1"], 2, [TRUNCATED_CONFIG]),
    ("rerun-truncated-config", "`rerun RUN …`, a truncated config.json", CONFIG, "truncate",
     ["rerun", "{run}", "--step", "1", "--from", "advantage", "--run-dir", "{out}"], 2,
     [TRUNCATED_CONFIG]),
    ("resume-invalid-config", "`resume RUN`, config.json edited to a value that does not validate",
     CONFIG, bad_value, ["resume", "{run}"], 2,
     ["error: invalid config ({run}/config.json): trainer.total_training_steps: got 'ten' (str); "
      "expected an integer"]),
    ("export-invalid-config", "`export RUN --step 1 OUT`, config.json that does not validate",
     CONFIG, bad_value, ["export", "{run}", "--step", "1", "{out}"], 2,
     ["invalid config ({run}/config.json): trainer.total_training_steps: got 'ten'"]),
    ("resume-truncated-run-info", "`resume RUN`, a truncated run_info.json", RUN_INFO, "truncate",
     ["resume", "{run}"], 2,
     ["run/run_info.json: the run_info.json is not valid JSON (", "truncated or damaged"]),
]  # fmt: skip


@pytest.mark.usefixtures("as_without_a_server")
@pytest.mark.parametrize(
    ("described", "target", "how", "args", "code", "needles"),
    [pytest.param(*c[1:], id=c[0]) for c in DAMAGED],
)
def test_a_damaged_run_file_is_named_and_the_run_left_as_it_is(
    ppoflow, expect, fill, unchanged, damaged, console, finished, tmp_path,
    described, target, how, args, code, needles,
):  # fmt: skip
    out = tmp_path / "out"

    with damaged(finished.root / target, how), unchanged(*finished.dirs):
        result = ppoflow(*fill(args, run=finished.run, out=out))
    expect(result, code, *fill(needles, run=finished.run, out=out), input=described,
           console=console())  # fmt: skip
    assert not out.exists()


def test_with_a_prefect_server_a_failed_rerun_prints_no_traceback(
    ppoflow, expect, damaged, console, finished, tmp_path
):
    with damaged(finished.root / JOURNAL, "truncate"):
        result = ppoflow("rerun", finished.run, "--step", "1", "--from", "advantage",
                         "--run-dir", tmp_path / "out")  # fmt: skip
    expect(result, 2, TRUNCATED_JOURNAL, console=console(),
           input="`rerun RUN …` with a Prefect server configured, a truncated journal")  # fmt: skip


# --- a failed start keeps the run's config.json -----------------------------------------------


@pytest.mark.usefixtures("prefect_harness")
def test_a_resume_with_a_missing_data_file_keeps_the_run(
    ppoflow, expect, unchanged, finished, tmp_path
):
    with unchanged(*finished.dirs):  # config.json is written only once the start succeeded
        result = ppoflow("resume", finished.run, f"data.train_files=[{tmp_path}/none.parquet]",
                         "trainer.total_training_steps=2")  # fmt: skip
    expect(result, 1, f"data file not found: '{tmp_path}/none.parquet'",
           input="`resume RUN data.train_files=[missing]`")  # fmt: skip


@pytest.mark.usefixtures("prefect_harness")
def test_training_into_a_finished_run_with_a_missing_data_file_keeps_the_run(
    ppoflow, expect, unchanged, demo, finished, tmp_path
):
    with unchanged(*finished.dirs):
        result = ppoflow(
            "train", "demo-cpu",
            *demo.overrides(finished.root, f"data.train_files=[{tmp_path}/none.parquet]"),
            "--run-dir", finished.run,
        )  # fmt: skip
    expect(result, 1, f"data file not found: '{tmp_path}/none.parquet'",
           input="`train … --run-dir RUN` into a finished run, a missing data file")  # fmt: skip


def without_tokenizer(finished, target: Path) -> Path:
    """A copy of the finished run whose config names a model directory that is gone."""
    shutil.copytree(finished.run, target)
    config = json.loads((target / "config.json").read_text())
    config["actor_rollout_ref"]["model"]["path"] = str(target / "gone")
    config["actor_rollout_ref"]["model"]["tokenizer_path"] = None
    (target / "config.json").write_text(json.dumps(config))
    return target


def test_html_of_a_run_whose_tokenizer_is_gone_writes_nothing(
    ppoflow, expect, unchanged, finished, tmp_path
):
    run = without_tokenizer(finished, tmp_path / "copy")
    out = tmp_path / "page.html"
    with unchanged(run):
        result = ppoflow("inspect", run, "--step", "1", "--html", out)
    expect(result, 1, "--html needs the run's tokenizer to show text: the run's tokenizer "
           f"{run / 'gone'} could not be loaded",
           input="`inspect RUN --step 1 --html OUT`, the run's tokenizer directory gone")  # fmt: skip
    assert not out.exists()


def test_html_without_a_step_is_a_usage_error(ppoflow, expect, finished, tmp_path):
    out = tmp_path / "page.html"
    result = ppoflow("inspect", finished.run, "--html", out)
    expect(result, 2, "--html writes one step of a run directory: give the run directory and "
           "--step K", input="`inspect RUN --html OUT` without --step")  # fmt: skip
    assert not out.exists()
