"""Bad artifacts: ``ppoflow inspect`` of a damaged or missing artifact (directly, or as a stage
of a run), and a re-run that would reuse a damaged one.

An artifact is verified before it is described or loaded (docs/reliability.md), so each case is
one line naming the file and what is wrong with it; nothing of the run is rewritten. A stage of
a run is checked against its journal as ``rerun`` checks what it reuses: an artifact folder
swapped with another stage's, or replaced by another valid artifact, is refused, naming both.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

REWARD = "run/step_1/reward"


def swap_reward_and_advantage(step_dir: Path) -> None:
    """The step's reward and advantage artifact folders swapped (each still a valid artifact)."""
    os.rename(step_dir / "reward", step_dir / "swap")
    os.rename(step_dir / "advantage", step_dir / "reward")
    os.rename(step_dir / "swap", step_dir / "advantage")


def another_reward(path: Path) -> None:
    """The reward artifact replaced by a valid reward artifact of other content (as another
    step's would be)."""
    from dataproto.artifact import load_artifact, save_artifact

    data = load_artifact(path)
    data.batch["rm_scores"] = data.batch["rm_scores"] + 1
    save_artifact(data, path, stage="reward", overwrite=True)


# (test id, what the input is, file under the finished root, damage, arguments with {art} / {run},
# exit status, needles)
CASES = [
    ("flipped-tensor-byte", "`inspect ART`, a flipped byte in tensors.safetensors",
     f"{REWARD}/tensors.safetensors", "flip", ["inspect", "{art}"], 1,
     ["{art}/tensors.safetensors: blake3 digest ", " differs from manifest.json's ",
      "(the file was altered)"]),
    ("truncated-tensors", "`inspect ART`, a truncated tensors.safetensors",
     f"{REWARD}/tensors.safetensors", "truncate", ["inspect", "{art}"], 1,
     ["{art}/tensors.safetensors: "]),
    ("truncated-manifest", "`inspect ART`, a truncated manifest.json", f"{REWARD}/manifest.json",
     "truncate", ["inspect", "{art}"], 1, ["{art}/manifest.json: unreadable manifest ("]),
    ("manifest-not-ppoflow", "`inspect ART`, a manifest.json of another format",
     f"{REWARD}/manifest.json", lambda path: path.write_text("{}"), ["inspect", "{art}"], 1,
     ["{art}/manifest.json: format None, expected 'ppoflow-dataproto'"]),
    ("manifest-newer-version", "`inspect ART`, a manifest.json of a newer format version",
     f"{REWARD}/manifest.json",
     lambda path: path.write_text('{"format": "ppoflow-dataproto", "format_version": 99}'),
     ["inspect", "{art}"], 1,
     ["{art}/manifest.json: format version 99; this ppoflow reads versions 2-4 (re-create "
      "the artifact with this version)"]),
    ("missing-listed-file", "`inspect ART`, a file the manifest lists is gone",
     f"{REWARD}/non_tensor_001.json", "delete", ["inspect", "{art}"], 1,
     ["{art}/non_tensor_001.json: missing file (listed in manifest.json)"]),
    ("missing-manifest", "`inspect ART`, an artifact directory without manifest.json",
     f"{REWARD}/manifest.json", "delete", ["inspect", "{art}"], 1,
     ["{art} is not a run or artifact directory: expected a run directory (with config.json or "
      "step_<k>/journal.json, as `ppoflow train` writes) or an artifact directory (with "
      "manifest.json)"]),
    ("missing-artifact", "`inspect PATH`, no such path", REWARD, "delete", ["inspect", "{art}"], 1,
     ["{art} does not exist: expected a run directory"]),
    ("stage-artifact-deleted", "`inspect RUN --step 1 --stage reward`, the artifact deleted",
     REWARD, "delete", ["inspect", "{run}", "--step", "1", "--stage", "reward"], 1,
     ["{art}/manifest.json: missing manifest (not an artifact, or an interrupted write)"]),
    ("stage-manifest-truncated", "`inspect RUN --step 1 --stage reward`, its manifest truncated",
     f"{REWARD}/manifest.json", "truncate", ["inspect", "{run}", "--step", "1", "--stage", "reward"],
     1, ["{art}/manifest.json: unreadable manifest ("]),
    ("stage-artifact-swapped",
     "`inspect RUN --step 1 --stage reward`, the reward and advantage artifact folders swapped",
     "run/step_1", swap_reward_and_advantage,
     ["inspect", "{run}", "--step", "1", "--stage", "reward"], 1,
     ["{art}: holds an artifact of stage 'advantage' (fingerprint ", "but {run}/step_1/journal.json "
      "records it for stage 'reward' (the artifact folder was swapped or replaced); restore it"]),
    ("stage-artifact-replaced",
     "`inspect RUN --step 1 --stage reward`, the reward artifact replaced by another (valid) one",
     REWARD, another_reward, ["inspect", "{run}", "--step", "1", "--stage", "reward"], 1,
     ["{art}: holds fingerprint ", "but {run}/step_1/journal.json records ",
      "for stage 'reward' (the artifact folder was swapped with another step's or replaced)"]),
    ("artifact-with-run-options", "`inspect ART --step 1` (run options on an artifact)",
     f"{REWARD}/manifest.json", lambda path: None, ["inspect", "{art}", "--step", "1"], 2,
     ["{art} is an artifact directory; --step, --stage and --json apply to a run directory"]),
]  # fmt: skip


@pytest.mark.parametrize(
    ("described", "target", "how", "args", "code", "needles"),
    [pytest.param(*c[1:], id=c[0]) for c in CASES],
)
def test_a_bad_artifact_is_named(
    ppoflow, expect, fill, unchanged, damaged, console, finished,
    described, target, how, args, code, needles,
):  # fmt: skip
    paths = {"art": finished.artifact("reward"), "run": finished.run}
    with damaged(finished.root / target, how), unchanged(*finished.dirs):
        result = ppoflow(*fill(args, **paths))
    expect(result, code, *fill(needles, **paths), input=described, console=console())


@pytest.mark.usefixtures("as_without_a_server")
@pytest.mark.parametrize(
    ("how", "needles"),
    [
        pytest.param("truncate", ["manifest.json: unreadable manifest ("], id="manifest"),
        pytest.param("flip", ["tensors.safetensors: blake3 digest "], id="tensors"),
    ],
)
def test_a_rerun_reusing_a_damaged_artifact_names_it(
    ppoflow, expect, unchanged, damaged, console, finished, tmp_path, how, needles
):
    name = "manifest.json" if how == "truncate" else "tensors.safetensors"
    branch = tmp_path / "branch"
    with damaged(finished.artifact("reward") / name, how), unchanged(*finished.dirs):
        result = ppoflow("rerun", finished.run, "--step", "1", "--from", "advantage",
                         "--to", "advantage", "--run-dir", branch)  # fmt: skip
    expect(result, 2, f"{finished.artifact('reward')}/", *needles, console=console(),
           input=f"`rerun RUN --from advantage`, the reused reward artifact's {name} damaged")  # fmt: skip
    journals = [json.loads(p.read_text()) for p in branch.glob("step_*/journal.json")]
    assert all(journal["status"] != "done" for journal in journals)  # no step looks finished
    assert not branch.exists()  # the reused records are checked before the branch is written


@pytest.mark.usefixtures("as_without_a_server")
def test_a_rerun_reusing_a_swapped_artifact_names_it(
    ppoflow, expect, unchanged, damaged, console, finished, tmp_path
):
    """What ``inspect --stage`` now refuses (above), ``rerun`` refused already: the reused
    artifact must hold the fingerprint its journal records."""
    branch = tmp_path / "branch"
    with damaged(finished.run / "step_1", swap_reward_and_advantage), unchanged(*finished.dirs):
        result = ppoflow("rerun", finished.run, "--step", "1", "--from", "advantage",
                         "--to", "advantage", "--run-dir", branch)  # fmt: skip
    expect(result, 2, f"{finished.artifact('reward')}: holds fingerprint ",
           f"but the journal of {finished.run} step 1 records ", "(the artifact was replaced)",
           console=console(), input="`rerun RUN --from advantage`, the reused reward artifact "
           "folder swapped with the advantage one")  # fmt: skip
    assert not branch.exists()
