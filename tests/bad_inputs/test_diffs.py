"""``ppoflow diff`` of input it cannot compare: a path that is not a run directory, two unrelated
runs, a ``--step`` one run lacks, a ``--stage`` the step's journal does not record, a damaged
artifact of the stage that differs.

Each is one ``error:`` line naming the run (a or b), the step or the stage and what would be
right, exit status 2 (1 is diff's "the runs differ"), and nothing written: both runs are left
as they were.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

INPUT = Path("step_1") / "input"


def with_other_uids(run: Path) -> None:
    """The run's step 1 input re-written with other prompt uids (a training of another
    trainer.seed), its journal recording the new fingerprint."""
    from dataproto import keys as K
    from dataproto.artifact import load_artifact, save_artifact

    data = load_artifact(run / INPUT)
    data.non_tensor_batch[K.UID] = data.non_tensor_batch[K.UID] + "-other"
    ref = save_artifact(data, run / INPUT, stage="input", overwrite=True)
    journal = json.loads((run / "step_1" / "journal.json").read_text())
    journal["input_fingerprint"] = ref.fingerprint
    (run / "step_1" / "journal.json").write_text(json.dumps(journal))


def with_a_planted_token(run: Path) -> None:
    """One token of the step 1 rollout's responses changed, its journal updated."""
    from dataproto import keys as K
    from dataproto.artifact import load_artifact, read_manifest, save_artifact

    path = run / "step_1" / "rollout"
    manifest, data = read_manifest(path), load_artifact(path)
    responses = data.batch[K.RESPONSES].clone()
    responses[0, 0] += 1
    data.batch[K.RESPONSES] = responses
    ref = save_artifact(data, path, stage="rollout", extra=manifest["extra"], overwrite=True)
    journal = json.loads((run / "step_1" / "journal.json").read_text())
    for record in journal["stages"]:
        if record["stage"] == "rollout":
            record["fingerprint"] = ref.fingerprint
    (run / "step_1" / "journal.json").write_text(json.dumps(journal))


# (test id, what the input is, arguments with {run} / {other} / {dir} / {art}, make {other},
# needles)
CASES = [
    ("not-a-run", "`diff DIR RUN`, DIR not a run directory", ["diff", "{dir}", "{run}"], None,
     ["run a: {dir} is not a run directory: expected a run directory (config.json and "
      "step_<k>/journal.json, as ppoflow train and ppoflow rerun write it)"]),
    ("missing-run", "`diff RUN PATH`, no such path", ["diff", "{run}", "{dir}/nope"], None,
     ["run b: {dir}/nope does not exist: expected a run directory"]),
    ("artifact-not-run", "`diff RUN ART` (an artifact directory, not a run)",
     ["diff", "{run}", "{art}"], None,
     ["run b: {art} is an artifact directory (manifest.json), not a run directory; pass the run "
      "directory that holds its step_<k>/ folder"]),
    ("unrelated", "`diff RUN OTHER`, OTHER's step 1 prompts under other uids (another seed)",
     ["diff", "{run}", "{other}"], with_other_uids,
     ["runs a ({run}) and b ({other}) are unrelated: their step 1 inputs hold other prompts (uid "
      "differs in 8 of 8 rows) and neither is a re-run branch of the other",
      "two trainings of the same data and trainer.seed, a run and its re-run branches"]),
    ("missing-step", "`diff RUN COPY --step 2`, a step neither run has",
     ["diff", "{run}", "{other}", "--step", "2"], lambda run: None,
     ["--step 2: run a ({run}) has no step 2 (steps with a journal: 1); compare a step both runs "
      "have: 1"]),
    ("unknown-stage", "`diff RUN COPY --stage rolout`, a stage the journals do not record",
     ["diff", "{run}", "{other}", "--stage", "rolout"], lambda run: None,
     ["--stage rolout: step 1 of run a ({run}) records no stage 'rolout' (its journal records: "
      "input, rollout, ", "name a stage both runs' step 1 journals record"]),
]  # fmt: skip


@pytest.mark.parametrize(
    ("described", "args", "make", "needles"), [pytest.param(*c[1:], id=c[0]) for c in CASES]
)
def test_a_diff_that_cannot_compare_is_one_line(
    ppoflow, expect, fill, unchanged, console, finished, tmp_path, described, args, make, needles
):
    plain, other = tmp_path / "plain", tmp_path / "other"
    plain.mkdir()
    (plain / "notes.txt").write_text("not a run")
    if make is not None:
        shutil.copytree(finished.run, other)
        make(other)
    paths = {"run": finished.run, "other": other, "dir": plain, "art": finished.artifact("reward")}
    with unchanged(*finished.dirs, tmp_path):
        result = ppoflow(*fill(args, **paths))
    expect(result, 2, *fill(needles, **paths), input=described, console=console())
    assert result.stdout == ""


def test_a_damaged_artifact_of_the_stage_that_differs_is_named(
    ppoflow, expect, unchanged, damaged, console, finished, tmp_path
):
    other = Path(shutil.copytree(finished.run, tmp_path / "other"))
    with_a_planted_token(other)
    tensors = finished.artifact("rollout") / "tensors.safetensors"
    with damaged(tensors, "flip"), unchanged(*finished.dirs, other):
        result = ppoflow("diff", finished.run, other)
    expect(result, 2, f"{tensors}: blake3 digest ", "(the file was altered)", console=console(),
           input="`diff RUN COPY`, COPY's rollout differs and RUN's rollout tensors have a "
           "flipped byte")  # fmt: skip
