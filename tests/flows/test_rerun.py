"""``ppoflow rerun`` end to end on the tiny model: a 2-step GRPO run (checkpoint every step) is
branched from step 2 with another estimator, identically, and without the checkpoint it needs.

A model call is detected by replacing the worker methods (rollout, log-probs, update) with ones
that record the call; the re-run must not build or call what it reuses.
"""

from __future__ import annotations

import json
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from typer.testing import CliRunner

from flows.cli.app import app
from flows.rerun import rerun
from flows.runs.branches import index_dir, run_key
from flows.runs.store import RunStore
from flows.train import train
from stages.engines import roles

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("prefect_harness")]

REPO = Path(__file__).resolve().parents[2]
UPSTREAM_OF_ADVANTAGE = ["rollout", "balance", "reward", "old_log_prob"]
MODEL_METHODS = {
    roles.ActorWorker: ["generate_sequences", "compute_log_prob", "update_actor"],
    roles.RefWorker: ["compute_ref_log_prob"],
}


@pytest.fixture(scope="module")
def parent_run(tmp_path_factory, make_demo_inputs, tiny_run_overrides) -> dict:
    """2 GRPO steps, a checkpoint after each; the run dir, checkpoints and MLflow in tmp.

    The untrained model scores 0 on the demo task everywhere, which makes every estimator's
    advantages 0; a custom scorer with spread-out scores makes the estimators differ.
    """
    root = make_demo_inputs(tmp_path_factory.mktemp("rerun"))
    (root / "spread_score.py").write_text(
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kw):\n"
        "    return float(sum(map(ord, solution_str)) % 5) / 4\n"
    )
    result = train(
        REPO / "configs" / "demo-cpu.yaml",
        tiny_run_overrides(
            root,
            root,
            2,
            "trainer.val_before_train=false",
            "trainer.test_freq=0",
            "trainer.save_freq=1",
            f"custom_reward_function.path={root}/spread_score.py",  # verl's legacy spelling
        ),
        str(root / "run"),
    )
    return {"root": root, "run_dir": result.run_dir}


@pytest.fixture
def model_calls(monkeypatch) -> list[str]:
    """Every worker model method called from now on (the call still happens)."""
    calls: list[str] = []
    for cls, methods in MODEL_METHODS.items():
        for name in methods:
            original = getattr(cls, name)

            def recorded(self, *args, _name=f"{cls.__name__}.{name}", _fn=original, **kwargs):
                calls.append(_name)
                return _fn(self, *args, **kwargs)

            monkeypatch.setattr(cls, name, recorded)
    return calls


def snapshot(run_dir: str | Path) -> dict[str, tuple[int, int, int]]:
    """Every file and folder of a run dir, the dir itself and its cache records included →
    (size, mtime, ctime), to prove that nothing in it was written, added, removed, renamed or
    linked (a folder's mtime changes when an entry is added, removed or renamed in it)."""
    root = Path(run_dir)
    stats = {".": root.stat()}
    stats.update({str(p.relative_to(root)): p.stat() for p in root.rglob("*")})
    return {name: (st.st_size, st.st_mtime_ns, st.st_ctime_ns) for name, st in stats.items()}


@contextmanager
def read_only(*roots: Path) -> Iterator[None]:
    """``chmod -R a-w`` on ``roots`` for the block, then their modes back. (The tests run as
    root, whom permission bits do not stop: what proves the roots were only read is their
    :func:`snapshot`, taken inside the block.)"""
    modes = {p: p.stat().st_mode for root in roots for p in [root, *root.rglob("*")]}
    for path, mode in modes.items():
        path.chmod(stat.S_IMODE(mode) & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))
    try:
        yield
    finally:
        for path, mode in modes.items():
            path.chmod(stat.S_IMODE(mode))


def test_rerun_from_advantage_with_another_estimator(parent_run, tmp_path, model_calls):
    before = snapshot(parent_run["run_dir"])
    result = rerun(
        parent_run["run_dir"],
        2,
        "advantage",
        overrides=["algorithm.adv_estimator=rloo"],
        new_run_dir=str(tmp_path / "branch"),
    )
    parent = RunStore(parent_run["run_dir"]).read_journal(2)
    branch = RunStore(result.run_dir).read_journal(2)
    for stage in UPSTREAM_OF_ADVANTAGE:
        original, reused = parent.record(stage), branch.record(stage)
        assert reused.status == "cached" and reused.reason.startswith("reused from")
        assert reused.fingerprint == original.fingerprint and reused.artifact == original.artifact
    for stage in ("advantage", "update_actor"):
        assert branch.record(stage).status == "ran"
        assert branch.record(stage).cache_key != parent.record(stage).cache_key
        assert branch.record(stage).artifact.startswith(result.run_dir)
    assert branch.record("advantage").fingerprint != parent.record("advantage").fingerprint
    assert model_calls == ["ActorWorker.update_actor"]  # no rollout, no log-prob pass
    changed = {change.name for change in result.changes}
    assert "critic/advantages/mean" in changed or "critic/advantages/max" in changed
    assert "actor/pg_loss" in changed
    assert "critic/score/mean" not in changed  # the same responses and rewards
    assert snapshot(parent_run["run_dir"]) == before  # the original run is never modified
    assert RunStore(parent_run["run_dir"]).branches()[result.run_dir] == 2  # only noted
    assert not (Path(parent_run["run_dir"]) / "branches").exists()  # noted outside the parent
    info = json.loads((tmp_path / "branch" / "rerun.json").read_text())
    assert info["parent_run_dir"] == parent_run["run_dir"] and info["from"] == "advantage"


def test_identical_rerun_is_all_cache_hits(parent_run, tmp_path, model_calls):
    result = rerun(parent_run["run_dir"], 2, "rollout", new_run_dir=str(tmp_path / "same"))
    statuses = {r.stage: (r.status, r.reason) for r in result.records}
    ran = {stage: status for stage, (status, _) in statuses.items() if status != "skipped"}
    assert ran and set(ran.values()) == {"cached"}, statuses
    assert all(reason == "cache hit" for status, reason in statuses.values() if status == "cached")
    assert model_calls == [] and result.engines_built == []
    assert result.changes == []  # every non-wall-time metric equal to the original's


def test_to_stops_after_the_named_stage(parent_run, tmp_path, model_calls):
    result = rerun(
        parent_run["run_dir"],
        1,
        "advantage",
        "advantage",
        ["algorithm.norm_adv_by_std_in_grpo=false"],
        str(tmp_path / "adv-only"),
    )
    stages = [r.stage for r in result.records if r.status != "skipped"]
    assert stages[-1] == "advantage" and "update_actor" not in stages
    assert model_calls == [] and result.engines_built == []
    assert "critic/advantages/max" in {c.name for c in result.changes}  # data metrics recomputed


def test_a_missing_checkpoint_is_named(parent_run, tmp_path):
    elsewhere = tmp_path / "no-checkpoints"
    runner = CliRunner()
    outcome = runner.invoke(
        app,
        [
            "rerun",
            parent_run["run_dir"],
            "--step",
            "2",
            "--from",
            "update_actor",
            "--refresh",  # its cache entry still holds: without --refresh it would be a hit
            "--run-dir",
            str(tmp_path / "fails"),
            f"trainer.default_local_dir={elsewhere}",
        ],
    )
    assert outcome.exit_code == 1
    assert "global_step_1" in outcome.output and "trainer.save_freq" in outcome.output
    assert not (tmp_path / "fails").exists()  # a failed re-run leaves no branch
    assert str(tmp_path / "fails") not in RunStore(parent_run["run_dir"]).branches()


def test_a_read_only_parent_is_only_read(parent_run, tmp_path):
    """A parent run (and its checkpoints) made read-only is branched from a stage that loads the
    checkpoint; nothing under them changes, and the parent still finds its branch (beside it
    or through the branch index, not through a file written into it)."""
    run_dir = Path(parent_run["run_dir"])
    checkpoints = parent_run["root"] / "checkpoints"
    with read_only(run_dir, checkpoints):
        before = snapshot(run_dir), snapshot(checkpoints)
        result = rerun(
            str(run_dir),
            2,
            "advantage",
            overrides=["algorithm.adv_estimator=rloo"],
            new_run_dir=str(tmp_path / "from-read-only"),
        )
        after = snapshot(run_dir), snapshot(checkpoints)
    assert after == before
    assert "update_actor" in [r.stage for r in result.records if r.status == "ran"]
    assert RunStore(str(run_dir)).branches()[result.run_dir] == 2
    note = index_dir() / run_key(str(run_dir)) / f"{run_key(result.run_dir)}.json"
    assert json.loads(note.read_text())["run_dir"] == result.run_dir


def test_rerun_takes_verl_legacy_reward_spellings(parent_run, tmp_path):
    other = tmp_path / "half_score.py"
    other.write_text(
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kw):\n"
        "    return 0.5\n"
    )
    outcome = CliRunner().invoke(
        app,
        ["rerun", parent_run["run_dir"], "--step", "1", "--from", "reward", "--to", "reward",
         f"custom_reward_function.path={other}", "--run-dir", str(tmp_path / "legacy")],
    )  # fmt: skip
    assert outcome.exit_code == 0, outcome.output
    assert (
        f"note: verl's custom_reward_function.path is read as reward.custom_reward_function.path = '{other}'"
        in outcome.output
    )
    config = RunStore(str(tmp_path / "legacy")).load_config()
    assert config["reward"]["custom_reward_function"]["path"] == str(other)
    journal = RunStore(str(tmp_path / "legacy")).read_journal(1)
    assert journal.record("reward").status == "ran"
    assert any(line.startswith("reward/score_mean") for line in outcome.output.splitlines())
    assert "cache miss: custom reward file changed" in outcome.output


def test_cli_prints_the_diff_and_the_new_run_dir_last(parent_run, tmp_path):
    outcome = CliRunner().invoke(
        app,
        [
            "rerun",
            parent_run["run_dir"],
            "--step",
            "1",
            "--from",
            "advantage",
            "--to",
            "advantage",
            "algorithm.adv_estimator=rloo",
            "--run-dir",
            str(tmp_path / "cli"),
        ],
    )
    assert outcome.exit_code == 0, outcome.output
    lines = outcome.output.strip().splitlines()
    assert lines[-1] == str(tmp_path / "cli")
    assert any(line.startswith("critic/advantages/") for line in lines)
    assert any("reused from" in line for line in lines)


ESTIMATORS = ("grpo", "rloo", "reinforce_plus_plus")
CLIP_RATIOS = ("0.1", "0.3")


def test_a_sweep_of_three_estimators_by_two_clip_ratios(parent_run, tmp_path, model_calls):
    """Issue 42's sweep: 6 branches of step 2 from the advantage, the stages before it computed
    once (the original's, reused by every branch), one table, and in MLflow one sweep run with
    the table and the 6 branches as its children, under the original's run."""
    from mlflow.tracking import MlflowClient

    sweep_dir = tmp_path / "sweep"
    outcome = CliRunner().invoke(
        app,
        [
            "rerun", parent_run["run_dir"], "--step", "2", "--from", "advantage",
            "--sweep", f"algorithm.adv_estimator={','.join(ESTIMATORS)}",
            "--sweep", f"actor_rollout_ref.actor.clip_ratio={','.join(CLIP_RATIOS)}",
            "--run-dir", str(sweep_dir),
        ],
    )  # fmt: skip
    assert outcome.exit_code == 0, outcome.output
    lines = outcome.output.strip().splitlines()
    assert lines[-1] == str(sweep_dir)
    labels = [f"adv_estimator={e} clip_ratio={c}" for e in ESTIMATORS for c in CLIP_RATIOS]
    legend = [line.split(":")[0].split(None, 1) for line in lines if line.startswith("  b")]
    assert legend == [[f"b{i}", label] for i, label in enumerate(labels)]  # in grid order
    header = next(line for line in lines if line.startswith("metric "))
    assert header.split() == ["metric", "original", *(f"b{i}" for i in range(6))]
    pg_loss = next(line for line in lines if line.startswith("actor/pg_loss "))
    assert len(pg_loss.split()) == 8

    parent = RunStore(parent_run["run_dir"]).read_journal(2)
    for i in range(6):
        branch = RunStore(str(sweep_dir / f"branch-{i}")).read_journal(2)
        for stage in UPSTREAM_OF_ADVANTAGE:  # the original's artifacts, not computed again
            reused = branch.record(stage)
            assert reused.status == "cached" and reused.reason.startswith("reused from")
            assert reused.artifact == parent.record(stage).artifact
        estimator = ESTIMATORS[i // len(CLIP_RATIOS)]  # the original's estimator: a cache hit
        advantage = "cached" if estimator == "grpo" else "ran"
        assert [branch.record(s).status for s in ("advantage", "update_actor")] == [
            advantage,
            "ran",
        ]
    assert model_calls == ["ActorWorker.update_actor"] * 6  # no rollout, no log-prob pass

    info = json.loads((Path(parent_run["run_dir"]) / "run_info.json").read_text())
    client = MlflowClient(tracking_uri=info["mlflow_tracking_uri"])
    experiment = client.get_run(info["mlflow_run_id"]).info.experiment_id
    (sweep,) = client.search_runs([experiment], "tags.`ppoflow.sweep.step` = '2'")
    assert sweep.data.tags["mlflow.parentRunId"] == info["mlflow_run_id"]
    assert sweep.info.status == "FINISHED"
    children = client.search_runs(
        [experiment], f"tags.`mlflow.parentRunId` = '{sweep.info.run_id}'"
    )
    assert len(children) == 6
    table = json.loads(
        Path(client.download_artifacts(sweep.info.run_id, "sweep.json", str(tmp_path))).read_text()
    )
    assert table["columns"][:2] == ["metric", "original"] and len(table["columns"]) == 8


def test_a_parallel_sweep_runs_its_branches_at_once_and_equals_one_after_another(
    parent_run, tmp_path
):
    """``--parallel 2``: three branches in two processes of their own, the first two at the same
    time, the third in the process that finished first; each one's records (artifact
    fingerprints included) and metrics equal the same branch run in this process; each is
    logged in MLflow as a child of the sweep's run."""
    import os

    from mlflow.tracking import MlflowClient

    from flows.rerun_diff import metric_diff
    from flows.rerun_sweep import sweep

    axis = "algorithm.adv_estimator=rloo,reinforce_plus_plus,grpo"
    args = (parent_run["run_dir"], 2, "advantage", [axis])
    at_once = sweep(*args, sweep_dir=str(tmp_path / "parallel"), parallel=2)
    in_turn = sweep(*args, sweep_dir=str(tmp_path / "in-turn"))

    assert (at_once.parallel, in_turn.parallel) == (2, 1) and in_turn.processes == []
    windows = at_once.processes
    assert [w.index for w in windows] == [0, 1, 2]
    assert len({w.pid for w in windows} | {os.getpid()}) == 3  # two processes
    assert max(w.started for w in windows[:2]) < min(w.ended for w in windows[:2])  # at once
    (first,) = [w for w in windows[:2] if w.pid == windows[2].pid]
    assert windows[2].started >= first.ended  # the third took the process that was free
    for parallel, serial in zip(at_once.branches, in_turn.branches, strict=True):
        assert parallel.run_dir.startswith(str(tmp_path / "parallel"))
        assert [(r.stage, r.status, r.fingerprint) for r in parallel.records] == [
            (r.stage, r.status, r.fingerprint) for r in serial.records
        ]
        assert metric_diff(serial.metrics, parallel.metrics) == []
        assert parallel.changes == serial.changes
    assert at_once.branches[0].changes and not at_once.branches[2].changes  # grpo: the original
    assert at_once.rows == in_turn.rows

    info = json.loads((Path(parent_run["run_dir"]) / "run_info.json").read_text())
    client = MlflowClient(tracking_uri=info["mlflow_tracking_uri"])
    children = {
        run.info.run_id: run
        for run in client.search_runs(
            [client.get_run(at_once.mlflow_run_id).info.experiment_id],
            f"tags.`mlflow.parentRunId` = '{at_once.mlflow_run_id}'",
        )
    }
    assert set(children) == {branch.mlflow_run_id for branch in at_once.branches}
    for branch in at_once.branches:
        logged = children[branch.mlflow_run_id].data.metrics
        assert logged["actor/pg_loss"] == branch.metrics["actor/pg_loss"]


def test_a_sweep_over_a_stage_before_from_is_refused_and_writes_nothing(parent_run, tmp_path):
    outcome = CliRunner().invoke(
        app,
        [
            "rerun", parent_run["run_dir"], "--step", "2", "--from", "advantage",
            "--sweep", "actor_rollout_ref.rollout.temperature=0.5,1.0",
            "--sweep", "algorithm.adv_estimator=grpo,rloo",
            "--run-dir", str(tmp_path / "sweep"),
        ],
    )  # fmt: skip
    assert outcome.exit_code == 2
    assert outcome.output.strip().splitlines() == [
        "error: ValueError: --sweep actor_rollout_ref.rollout.temperature is read by the rollout "
        "stage(s), before --from advantage: every branch would reuse the original's artifacts; "
        "pass --from rollout"
    ]
    bad_value = CliRunner().invoke(
        app,
        [
            "rerun", parent_run["run_dir"], "--step", "2", "--from", "advantage",
            "--sweep", "algorithm.adv_estimator=grpo,nope", "--run-dir", str(tmp_path / "sweep"),
        ],
    )  # fmt: skip
    assert bad_value.exit_code == 2
    assert "error: invalid config (branch algorithm.adv_estimator=nope)" in bad_value.output
    assert "algorithm.adv_estimator: got 'nope'" in bad_value.output
    assert not (tmp_path / "sweep").exists()
