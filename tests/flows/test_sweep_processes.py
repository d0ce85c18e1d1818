"""A parallel sweep's placement of its branch processes, and a branch process that fails
(flows/sweep_processes.py, flows/sweep_branch.py); the sweep end to end is in
tests/flows/test_rerun.py."""

from __future__ import annotations

import pytest

from flows.sweep_processes import BranchFailed, BranchJob, Placement, placements, run_branches


def test_cpu_branches_share_the_threads_and_each_keeps_one():
    assert [p.threads for p in placements(2, "cpu", 1, 1, [], 2)] == [1, 1]
    assert [p.threads for p in placements(3, "cpu", 1, 1, [], 2)] == [1, 1, 1]
    assert all(p.env == {} for p in placements(2, "cpu", 8, 1, [], 2))  # devices: CUDA only


def test_cuda_branches_get_disjoint_slices_of_the_visible_devices():
    slots = placements(3, "cuda", 1, 1, ["4", "6", "7", "9"], 16)
    assert [p.env["CUDA_VISIBLE_DEVICES"] for p in slots] == ["4", "6", "7"]
    assert all(p.threads == 16 for p in slots)


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        ((0, "cpu", 1, 1, [], 2), "--parallel 0: give how many branches run at once, 1 or more"),
        (
            (3, "cuda", 2, 1, ["0", "1", "2", "3"], 2),
            "--parallel 3 needs 3 × 2 CUDA devices (trainer.n_gpus_per_node = 2 per branch), but "
            "this process sees 4; lower --parallel to 2",
        ),
        ((2, "cuda", 1, 2, ["0", "1"], 2), "but trainer.nnodes = 2; run a multi-node sweep"),
    ],
)
def test_what_does_not_fit_is_named(args, needle):
    with pytest.raises(ValueError, match="--parallel") as raised:
        placements(*args)
    assert needle in str(raised.value)


def test_a_failed_branch_is_named_and_no_later_branch_starts(tmp_path):
    """The branch process reports its error; the sweep raises it with the branch named, and
    the branch after it, waiting for the one slot, never starts."""
    rerun = {"step": 1, "from_stage": "advantage", "to_stage": None, "overrides": []}
    jobs = [
        BranchJob(i, f"point-{i}", {**rerun, "run_dir": str(tmp_path / "no-run"),
                                    "new_run_dir": str(tmp_path / f"branch-{i}")})
        for i in range(2)
    ]  # fmt: skip
    finished = []
    with pytest.raises(BranchFailed) as raised:
        run_branches(jobs, [Placement(1, {})], {}, lambda job, result: finished.append(job))
    assert str(raised.value).startswith("branch b0 (point-0): ")
    assert "no-run" in str(raised.value)
    assert finished == [] and not (tmp_path / "branch-0").exists()
    assert not (tmp_path / "branch-1").exists()
