"""`ppoflow inspect RUN_DIR [--step K] [--stage S] [--json]` on small hand-built run directories.

The run built by ``build_run`` (no training, no Prefect):

    step 1  done     rollout ran, reward ran, values skipped, advantage ran
    step 2  done     rollout cached (artifact in a parent run directory), reward ran,
                     values skipped, advantage ran; metrics with a NaN
    step 3  running  rollout ran (nothing else recorded yet)

With ``branch=True`` its ``rerun.json`` names that parent, as a re-run branch's does: only a
branch's journal may name artifacts outside its own directory (those of the runs it branched
from), and ``inspect --stage`` refuses any other path outside the run.
"""

from __future__ import annotations

import doctest
import json
import math
import uuid

import fsspec
import pytest
import torch
import typer
from typer.testing import CliRunner

from dataproto import DataProto
from dataproto.artifact import ArtifactRef, save_artifact
from dataproto.report import describe_artifact
from dataproto.sample_batch import make_sample_batch
from flows.cli import artifacts as cli_artifacts
from flows.runs import report as run_report
from flows.runs.report import RunReportError, format_bytes
from flows.runs.store import RunStore, StageRecord, StepJournal, decode_metrics

runner = CliRunner()
SKIP_REASON = "disabled: uses_critic(config) is False"


def _app() -> typer.Typer:
    app = typer.Typer()
    cli_artifacts.register(app)
    return app


def inspect(*args: str):
    return runner.invoke(_app(), ["inspect", *map(str, args)])


def _record(stage: str, ref: ArtifactRef, status: str = "ran", **metrics: float) -> StageRecord:
    reason = "cache hit" if status == "cached" else "cache miss"
    return StageRecord(
        stage, status, reason, ref.path, ref.fingerprint, f"key-{stage}", ref.rows, ref.nbytes,
        0.25, dict(metrics),
    )  # fmt: skip


def _delta(step: int, key: str) -> DataProto:
    return DataProto.from_dict({key: torch.full((4,), float(step))})


def build_run(root: str, parent: str, branch: bool = False) -> RunStore:
    """The run of the module docstring under ``root``; step 2's rollout lives under ``parent``
    (with ``branch``, the run is a re-run branch of ``parent``)."""
    store = RunStore(root)
    store.save_config({"trainer": {"experiment_name": "unit"}, "algorithm": {"gamma": 1.0}})
    if branch:
        store.save_json("rerun.json", {"parent_run_dir": parent, "step": 2, "from": "reward"})
    parent_store = RunStore(parent)
    for step in (1, 2, 3):
        batch = make_sample_batch(2, 2, 4, 4, seed=step)
        input_ref = store.save_input(step, batch)
        owner = parent_store if step == 2 else store
        rollout = save_artifact(batch, owner.artifact_path(step, "rollout"), stage="rollout")
        records = [_record("rollout", rollout, "cached" if step == 2 else "ran")]
        if step < 3:
            reward = save_artifact(_delta(step, "seq_scores"), store.artifact_path(step, "reward"))
            advantage = save_artifact(_delta(step, "adv"), store.artifact_path(step, "advantage"))
            records += [
                _record("reward", reward, **{"reward/score_mean": 0.5 * step}),
                StageRecord("values", "skipped", SKIP_REASON),
                _record("advantage", advantage, **{"actor/kl": float("nan")}),
            ]
        metrics = {"critic/score/mean": 0.5 * step, "timing_s/step": 1.25 * step}
        store.write_journal(
            StepJournal(
                step,
                "running" if step == 3 else "done",
                input_ref.path,
                input_ref.fingerprint,
                records,
                {} if step == 3 else {**metrics, "actor/kl": float("nan")},
            )
        )
    return store


@pytest.fixture
def run(tmp_path) -> RunStore:
    return build_run(str(tmp_path / "run"), str(tmp_path / "parent"))


def _table_rows(text: str) -> dict[str, dict[str, str]]:
    """The steps × stages table as {step: {column: cell}} (cells hold no spaces)."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("step  "))
    header = lines[start].split()
    rows = {}
    for line in lines[start + 1 :]:
        if not line.strip():
            break
        cells = line.split()
        if cells[-1] in ("B", "KiB", "MiB"):  # "199.6 KiB" is one cell
            cells = [*cells[:-2], f"{cells[-2]} {cells[-1]}"]
        rows[cells[0]] = dict(zip(header, cells, strict=True))
    return rows


def _stage_bytes(store: RunStore, status: str) -> int:
    return sum(
        record.nbytes or 0
        for step in store.steps()
        for record in store.read_journal(step).stages
        if record.status == status
    )


def test_run_table_shows_each_step_and_stage_status(run):
    result = inspect(run.root)
    assert result.exit_code == 0, result.output
    rows = _table_rows(result.output)
    assert list(rows) == ["1", "2", "3"]
    assert [rows["1"][c] for c in ("status", "rollout", "reward", "advantage")] == [
        "done",
        "ran",
        "ran",
        "ran",
    ]
    assert rows["2"]["rollout"] == "cached"
    assert rows["3"]["status"] == "running" and rows["3"]["reward"] == "-"
    assert "values" not in rows["1"]  # skipped in every step: listed below the table instead
    assert f"  values: {SKIP_REASON}" in result.output
    assert (rows["1"]["score"], rows["2"]["score"], rows["3"]["score"]) == ("0.5", "1", "-")
    assert (rows["1"]["step_s"], rows["2"]["step_s"]) == ("1.250", "2.500")
    step_1 = sum(record.nbytes for record in run.read_journal(1).stages if record.nbytes)
    assert rows["1"]["bytes"] == format_bytes(step_1)
    assert "stages: 6 ran, 1 cached (cache hits), 2 skipped" in result.output
    ran, cached = _stage_bytes(run, "ran"), _stage_bytes(run, "cached")
    assert f"{format_bytes(ran)} written by stages that ran" in result.output
    assert f"{format_bytes(cached)} reused by cache hits" in result.output
    assert "experiment   unit" in result.output
    assert "steps        1-3 (2 done, 1 running)" in result.output


def test_step_view_lists_records_paths_and_metrics(run, tmp_path):
    result = inspect(run.root, "--step", "2")
    assert result.exit_code == 0, result.output
    journal = run.read_journal(2)
    rollout, reward = journal.record("rollout"), journal.record("reward")
    lines = result.output.splitlines()
    row = next(line for line in lines if line.startswith("rollout "))
    assert row.split() == ["rollout", "cached", "4", *format_bytes(rollout.nbytes).split(),
                           "0.250", rollout.fingerprint[:12], "cache", "hit"]  # fmt: skip
    assert next(line for line in lines if line.startswith("values ")).split()[:2] == [
        "values",
        "skipped",
    ]
    assert f"  rollout    {tmp_path}/parent/step_2/rollout" in lines  # outside the run: in full
    assert "  reward     step_2/reward" in lines  # inside the run: relative to it
    assert reward.fingerprint[:12] in result.output
    assert "metrics of reward" in lines and "  reward/score_mean  1" in lines
    assert "  actor/kl  nan" in lines  # a NaN metric is shown, not dropped
    assert "other step metrics" in lines and "  critic/score/mean  1" in lines
    assert "time         2.500 s" in lines


def test_stage_view_describes_the_artifact(run):
    result = inspect(run.root, "--step", "1", "--stage", "rollout")
    assert result.exit_code == 0, result.output
    record = run.read_journal(1).record("rollout")
    assert f"fingerprint  {record.fingerprint}" in result.output
    assert f"cache key    {record.cache_key}" in result.output
    assert describe_artifact(record.artifact) in result.output  # schema, statistics, ledger
    assert "token ledger" in result.output and "schema" in result.output
    skipped = inspect(run.root, "--step", "1", "--stage", "values")
    assert skipped.exit_code == 0, skipped.output
    assert f"status       skipped ({SKIP_REASON})" in skipped.output
    assert "no artifact: the stage was skipped" in skipped.output


def test_json_document_round_trips_with_nan_tagged(run, tmp_path):
    result = inspect(run.root, "--json")
    assert result.exit_code == 0, result.output
    document = json.loads(result.output)
    assert set(document) == {"run_dir", "config", "rerun", "steps"}
    assert document["rerun"] is None  # a trained run, not a re-run branch
    assert document["run_dir"] == run.root
    assert document["config"] == {
        "trainer": {"experiment_name": "unit"},
        "algorithm": {"gamma": 1.0},
    }
    assert [s["step"] for s in document["steps"]] == [1, 2, 3]
    step_2 = document["steps"][1]
    contract = {"step", "status", "input_artifact", "input_fingerprint", "metrics", "stages"}
    assert contract <= set(step_2)
    assert step_2["input_fingerprint"] == run.read_journal(2).input_fingerprint
    assert step_2["metrics"]["actor/kl"] == {"float": "nan"}
    assert math.isnan(decode_metrics(step_2["metrics"])["actor/kl"])
    stages = {s["stage"]: s for s in step_2["stages"]}
    assert list(stages) == ["rollout", "reward", "values", "advantage"]
    record_keys = {"stage", "status", "reason", "artifact", "fingerprint", "cache_key", "rows",
                   "nbytes", "timing_s", "metrics", "key_parts"}  # fmt: skip
    assert all(set(s) == record_keys for s in stages.values())
    assert stages["rollout"]["status"] == "cached"
    assert stages["rollout"]["artifact"] == f"{tmp_path}/parent/step_2/rollout"
    assert stages["values"] == {**dict.fromkeys(record_keys), "stage": "values",
                                "status": "skipped", "reason": SKIP_REASON, "metrics": {}}  # fmt: skip
    assert document["steps"][2]["status"] == "running" and document["steps"][2]["metrics"] == {}


def test_json_filters_by_step_and_stage(run):
    one = json.loads(inspect(run.root, "--json", "--step", "2").output)
    assert [s["step"] for s in one["steps"]] == [2] and len(one["steps"][0]["stages"]) == 4
    result = inspect(run.root, "--json", "--step", "1", "--stage", "reward")
    assert result.exit_code == 0, result.output
    (step,) = json.loads(result.output)["steps"]
    assert [s["stage"] for s in step["stages"]] == ["reward"]
    assert step["stages"][0]["fingerprint"] == run.read_journal(1).record("reward").fingerprint


def test_json_config_non_finite_values_are_tagged(run, tmp_path):
    (tmp_path / "run" / "config.json").write_text('{"algorithm": {"kl": NaN, "cap": -Infinity}}')
    result = inspect(run.root, "--json", "--step", "1")
    assert result.exit_code == 0, result.output
    assert "NaN" not in result.output and "Infinity" not in result.output  # strict JSON
    config = json.loads(result.output)["config"]
    assert config == {"algorithm": {"kl": {"float": "nan"}, "cap": {"float": "-inf"}}}


@pytest.mark.parametrize(
    ("args", "code", "needles"),
    [
        (["--step", "7"], 1, ["no step 7", "steps with a journal: 1-3"]),
        (["--json", "--step", "7"], 1, ["no step 7"]),
        (["--step", "1", "--stage", "critic"], 1, ["no stage 'critic'", "rollout, reward, values"]),
        (["--step", "3", "--stage", "reward"], 1, ["step 3 has no stage 'reward'", "rollout)"]),
        (["--stage", "reward"], 2, ["--stage reward needs --step K"]),
        (["--json", "--stage", "reward"], 2, ["needs --step K"]),
    ],
)
def test_run_errors_are_one_line_and_list_what_exists(run, args, code, needles):
    result = inspect(run.root, *args)
    assert result.exit_code == code, result.output
    assert len(result.output.strip().splitlines()) == 1 and result.output.startswith("error: ")
    for needle in needles:
        assert needle in result.output


def test_paths_that_are_neither_run_nor_artifact(tmp_path):
    (tmp_path / "empty").mkdir()
    for path, found in ((tmp_path / "empty", "is not a run or artifact"), (tmp_path / "no", "does not exist")):  # fmt: skip
        result = inspect(path)
        assert result.exit_code == 1 and found in result.output
        assert "config.json" in result.output and "manifest.json" in result.output
        assert len(result.output.strip().splitlines()) == 1


def test_artifact_mode_is_unchanged_and_refuses_run_options(run):
    path = run.artifact_path(1, "reward")
    result = inspect(path, "--verify", "lazy")
    assert result.exit_code == 0 and result.output == describe_artifact(path, verify="lazy") + "\n"
    for option in (["--json"], ["--step", "1"], ["--stage", "reward"]):
        refused = inspect(path, *option)
        assert refused.exit_code == 2 and "is an artifact directory" in refused.output


def test_run_without_config_or_without_steps(tmp_path):
    store = RunStore(tmp_path / "journals-only")
    store.write_journal(StepJournal(4, "done", metrics={"timing_s/step": 0.5}))
    assert inspect(store.root).exit_code == 0
    assert "config       (no config.json)" in inspect(store.root).output
    assert json.loads(inspect(store.root, "--json").output)["config"] is None
    fresh = RunStore(tmp_path / "fresh")
    fresh.save_config({"trainer": {"experiment_name": "x"}})
    result = inspect(fresh.root)
    assert result.exit_code == 0 and "no step has a journal yet" in result.output
    assert json.loads(inspect(fresh.root, "--json").output)["steps"] == []


def test_memory_run_dir():
    name = f"memory://ppoflow-run-report-{uuid.uuid4().hex[:8]}"
    try:
        store = build_run(f"{name}/run", f"{name}/parent", branch=True)
        table = inspect(store.root)
        assert table.exit_code == 0, table.output
        assert _table_rows(table.output)["2"]["rollout"] == "cached"
        document = json.loads(inspect(store.root, "--json").output)
        assert document["run_dir"] == f"{name}/run"
        assert document["steps"][1]["stages"][0]["artifact"] == f"{name}/parent/step_2/rollout"
        staged = inspect(store.root, "--step", "2", "--stage", "rollout")
        assert staged.exit_code == 0 and "token ledger" in staged.output
        artifact = inspect(f"{name}/run/step_1/reward")
        assert artifact.exit_code == 0 and "seq_scores" in artifact.output
    finally:
        fsspec.filesystem("memory").rm(name.removeprefix("memory://"), recursive=True)


def test_run_json_refuses_stage_without_step(run):
    with pytest.raises(ValueError, match=r"stage 'reward' given without a step"):
        run_report.run_json(run, stage="reward")
    with pytest.raises(RunReportError, match=r"no step 0 \(steps with a journal: 1-3\)"):
        run_report.read_journals(run, 0)


def test_doctests():
    result = doctest.testmod(run_report)
    assert result.failed == 0 and result.attempted >= 4
