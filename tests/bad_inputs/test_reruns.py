"""Re-runs that are refused or fail, and journals that name artifacts outside their run.

``ppoflow rerun`` only reads the run it branches from. What it can check from the parent alone
(the stage names, the step, the overrides, the step input, the reused artifacts, where the
journal's artifacts lie) it checks before writing anything; what fails after that (a stage that
needs a checkpoint that is not there) removes what the re-run wrote. Either way a failed re-run
leaves no branch directory (an existing ``--run-dir`` keeps only what it held), no note in the
branch index, and the parent as it was.

A journal names its artifacts inside its run directory (a re-run branch: also in the runs it
branched from); ``rerun`` and ``inspect --stage`` refuse one that names a path outside, naming
the journal and the path, instead of following it.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from flows.runs.branches import find_branches

JOURNAL = Path("step_1") / "journal.json"


def two_step_copy(finished, target: Path) -> Path:
    """A copy of the finished run whose step 2 is its step 1 again (same records and artifacts,
    the journal renumbered): a step whose re-run from a weight-reading stage needs the
    checkpoint saved after step 1."""
    shutil.copytree(finished.run, target)
    journal = json.loads((target / JOURNAL).read_text())
    journal["step"] = 2
    (target / "step_2").mkdir()
    (target / "step_2" / "journal.json").write_text(json.dumps(journal))
    return target


@pytest.mark.usefixtures("as_without_a_server", "prefect_harness")
@pytest.mark.parametrize("existing", [False, True], ids=["new-dir", "existing-empty-dir"])
def test_a_rerun_that_fails_after_its_checks_leaves_no_branch(
    ppoflow, expect, unchanged, console, finished, tmp_path, existing
):
    parent = two_step_copy(finished, tmp_path / "two-steps")
    branch, missing = tmp_path / "branch", tmp_path / "no-checkpoints"
    if existing:
        branch.mkdir()
    with unchanged(parent, *finished.dirs):
        result = ppoflow("rerun", parent, "--step", "2", "--from", "update_actor", "--refresh",
                         "--run-dir", branch, f"trainer.default_local_dir={missing}")  # fmt: skip
    expect(result, 1, "re-running a stage that uses the actor weights of step 2 needs the "
           f"checkpoint saved after step 1, but {missing}/global_step_1/actor does not exist",
           "Train with trainer.save_freq dividing 1", console=console(),
           input="`rerun RUN --step 2 --from update_actor --refresh "
                 "trainer.default_local_dir=EMPTY`, no checkpoint of step 1 there"
                 + (" (into an existing empty --run-dir)" if existing else ""))  # fmt: skip
    if existing:
        assert list(branch.iterdir()) == []  # the directory stays, as empty as it was
    else:
        assert not branch.exists()
    assert find_branches(str(parent)) == {}  # nor a note in the branch index


def outside_copy(finished, tmp_path: Path) -> Path:
    """A valid copy of the run's reward artifact outside the run directory."""
    return Path(shutil.copytree(finished.artifact("reward"), tmp_path / "elsewhere" / "reward"))


def naming(artifact: str):
    """A damage: the journal names ``artifact`` for the reward stage."""

    def edit(path: Path) -> None:
        journal = json.loads(path.read_text())
        for record in journal["stages"]:
            if record["stage"] == "reward":
                record["artifact"] = artifact
        path.write_text(json.dumps(journal))

    return edit


@pytest.mark.usefixtures("as_without_a_server")
@pytest.mark.parametrize(
    ("command", "relative"),
    [
        pytest.param("rerun", False, id="rerun-absolute"),
        pytest.param("inspect", False, id="inspect-absolute"),
        pytest.param("inspect", True, id="inspect-dot-dot"),
    ],
)
def test_a_journal_naming_an_artifact_outside_its_run_is_refused(
    ppoflow, expect, damaged, unchanged, console, finished, tmp_path, command, relative
):
    outside = outside_copy(finished, tmp_path)
    named = f"../../{outside.relative_to(tmp_path.parent)}" if relative else str(outside)
    out = tmp_path / "out"
    args = (
        ["rerun", finished.run, "--step", "1", "--from", "advantage", "--run-dir", out]
        if command == "rerun"
        else ["inspect", finished.run, "--step", "1", "--stage", "reward"]
    )
    described = (
        "`rerun RUN --step 1 --from advantage`, the journal naming an artifact outside RUN"
        if command == "rerun"
        else f"`inspect RUN --step 1 --stage reward`, the journal naming an artifact outside "
        f"RUN ({'a relative path with ..' if relative else 'an absolute path'})"
    )
    with damaged(finished.run / JOURNAL, naming(named)), unchanged(*finished.dirs):
        result = ppoflow(*args)
    expect(result, 2 if command == "rerun" else 1,
           f"{finished.run}/step_1/journal.json: stage 'reward' names the artifact {outside}, "
           "outside the run directory; a journal names artifacts in "
           f"{finished.run} (as ppoflow writes it)", "restore it", input=described,
           console=console())  # fmt: skip
    assert not out.exists()


SWEEP_CASES = [
    ("sweep-key-unknown", "`rerun RUN --step 1 --from advantage --sweep algorithm.adv_estimater=grpo,rloo`",
     ["algorithm.adv_estimater=grpo,rloo"],
     2, ["invalid config (branch algorithm.adv_estimater=grpo): algorithm.adv_estimater: "
         "unknown key"]),
    ("sweep-value-invalid", "`rerun … --sweep algorithm.adv_estimator=grpo,nope`: a value that fails validation",
     ["algorithm.adv_estimator=grpo,nope"],
     2, ["invalid config (branch algorithm.adv_estimator=nope)", "algorithm.adv_estimator: got 'nope'"]),
    ("sweep-before-from", "`rerun … --from advantage --sweep actor_rollout_ref.rollout.temperature=0.5,1`: a stage before --from",
     ["actor_rollout_ref.rollout.temperature=0.5,1"],
     2, ["--sweep actor_rollout_ref.rollout.temperature is read by the rollout stage(s), before "
         "--from advantage", "pass --from rollout"]),
    ("sweep-not-a-grid", "`rerun … --sweep algorithm.adv_estimator`: no values",
     ["algorithm.adv_estimator"], 2, ["--sweep 'algorithm.adv_estimator' is not KEY=V1,V2,…"]),
]  # fmt: skip


@pytest.mark.parametrize(
    ("described", "sweeps", "code", "needles"),
    [pytest.param(*case[1:], id=case[0]) for case in SWEEP_CASES],
)
def test_a_bad_sweep_is_refused_before_any_branch_runs(
    ppoflow, expect, unchanged, finished, tmp_path, described, sweeps, code, needles
):
    out = tmp_path / "sweep"
    args = [flag for sweep in sweeps for flag in ("--sweep", sweep)]
    with unchanged(*finished.dirs):
        result = ppoflow(
            "rerun", finished.run, "--step", "1", "--from", "advantage", *args, "--run-dir", out
        )
    expect(result, code, *needles, input=described)
    assert not out.exists()


PARALLEL_CASES = [
    ("parallel-zero", "`rerun … --sweep algorithm.adv_estimator=grpo,rloo --parallel 0`",
     ["--sweep", "algorithm.adv_estimator=grpo,rloo", "--parallel", "0"],
     ["--parallel 0: give how many branches run at once, 1 or more"]),
    ("parallel-without-sweep", "`rerun RUN --step 1 --from advantage --parallel 2`: no --sweep",
     ["--parallel", "2"],
     ["--parallel 2 runs the branches of a sweep at once; add --sweep"]),
    ("parallel-on-ray", "`rerun … ppoflow.workers.backend=ray --sweep … --parallel 2`: Ray actors",
     ["ppoflow.workers.backend=ray", "--sweep", "algorithm.adv_estimator=grpo,rloo",
      "--parallel", "2"],
     ["--parallel 2 runs each branch's engines in a process of its own, but "
      "ppoflow.workers.backend = ray places them as actors of a cluster", "--parallel 1"]),
    ("parallel-too-few-devices", "`rerun … trainer.device=cuda --sweep … --parallel 2` on a "
     "machine without 2 CUDA devices",
     ["trainer.device=cuda", "--sweep", "algorithm.adv_estimator=grpo,rloo", "--parallel", "2"],
     ["--parallel 2 needs 2 × 1 CUDA devices (trainer.n_gpus_per_node = 1 per branch), but "
      "this process sees"]),
]  # fmt: skip


@pytest.mark.parametrize(
    ("described", "args", "needles"),
    [
        pytest.param(
            *case[1:],
            id=case[0],
            marks=pytest.mark.skipif(
                case[0] == "parallel-too-few-devices" and torch.cuda.device_count() >= 2,
                reason="this machine has the 2 CUDA devices the case lacks",
            ),
        )
        for case in PARALLEL_CASES
    ],
)
def test_a_parallel_sweep_the_engines_do_not_allow_is_refused_before_any_branch_runs(
    ppoflow, expect, unchanged, finished, tmp_path, described, args, needles
):
    out = tmp_path / "sweep"
    with unchanged(*finished.dirs):
        result = ppoflow(
            "rerun", finished.run, "--step", "1", "--from", "advantage", *args, "--run-dir", out
        )
    expect(result, 2, *needles, input=described)
    assert not out.exists()
