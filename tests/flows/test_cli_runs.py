"""``ppoflow runs``: run directories made from their files (config, journals, run_info.json,
rerun.json) and a real SQLite MLflow store, no training. Each status has a case; the scores
come from the journals and the MLflow run; the order is the start time; a missing or empty
directory is one line."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient
from typer.testing import CliRunner

from flows.cli.app import app
from flows.runs.index import ACTIVE_FLOOR_S, list_runs
from flows.runs.store import RunStore, StepJournal
from flows.runs.tracking import TrackingLookup
from stages.config import load_config
from stages.metrics.naming import sanitize_metric_name

REPO = Path(__file__).resolve().parents[2]
LONG_AGO = time.time() - 10 * ACTIVE_FLOOR_S
VAL = "val-aux/ppoflow/demo-copy/reward/mean@1"


def runs(*args: str):
    return CliRunner().invoke(app, ["runs", *map(str, args)])


def table_rows(stdout: str) -> dict[str, list[str]]:
    """The table's rows by run name (the third word: after the start date and time)."""
    rows = [line.split() for line in stdout.splitlines()[2:] if line.strip()]
    return {row[2]: row[3:] for row in rows}


def make_run(
    path: Path,
    statuses: list[str],
    *,
    total: int | None = 2,
    first: int = 1,
    started: float = LONG_AGO,
    written: float = LONG_AGO,
    info: dict | None = None,
    rerun: dict | None = None,
) -> Path:
    """A run directory: config (``total`` planned steps), one journal per status from step
    ``first`` on, with ``critic/score/mean`` = step / 10, run_info.json / rerun.json when given, the config and
    the first step folder dated ``started``, the journals ``written``."""
    steps = "null" if total is None else total
    cfg = load_config(REPO / "configs" / "demo-cpu.yaml", [f"trainer.total_training_steps={steps}"])
    store = RunStore(path)
    store.save_config(cfg)
    for step, status in enumerate(statuses, start=first):
        metrics = {"critic/score/mean": step / 10, "timing_s/step": 1.0}
        store.write_journal(StepJournal(step, status=status, metrics=metrics))
        os.utime(path / f"step_{step}" / "journal.json", (written, written))
        os.utime(path / f"step_{step}", (started + step, started + step))  # after config.json
    if info is not None:
        (path / "run_info.json").write_text(json.dumps(info))
    if rerun is not None:
        (path / "rerun.json").write_text(json.dumps(rerun))
    os.utime(path / "config.json", (started, started))
    return path


def run_info(run_id: str, tracking_uri: str) -> dict:
    """What ``ppoflow train`` writes to run_info.json (the keys ``ppoflow runs`` reads)."""
    return {
        "mlflow_run_id": run_id,
        "mlflow_tracking_uri": tracking_uri,
        "mlflow_experiment": "p",
        "working_dir": "/",
    }


@pytest.fixture
def store(tmp_path) -> tuple[str, MlflowClient]:
    """A SQLite MLflow store: (its URI, a client)."""
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    return uri, MlflowClient(tracking_uri=uri)


def mlflow_run(client: MlflowClient, status: str, val: dict[int, float]) -> str:
    """An MLflow run ended with ``status`` whose validation reward was ``val[step]``."""
    experiment = client.get_experiment_by_name("p") or client.get_experiment(
        client.create_experiment("p")
    )
    run_id = client.create_run(experiment.experiment_id).info.run_id
    for step, value in val.items():
        client.log_metric(run_id, sanitize_metric_name(VAL), value, step=step)
    if status != "RUNNING":
        client.set_terminated(run_id, status)
    return run_id


def test_a_finished_run_and_a_rerun_branch_with_its_parent(tmp_path, store):
    uri, client = store
    run_id = mlflow_run(client, "FINISHED", {0: 0.1, 2: 0.375})
    info = run_info(run_id, uri)
    parent = make_run(tmp_path / "runs" / "a", ["done", "done"], info=info)
    make_run(
        tmp_path / "runs" / "a-rerun",
        ["done"],
        first=2,  # a branch journals the one step it re-ran
        rerun={"parent_run_dir": str(parent), "step": 2, "from": "reward"},
        started=LONG_AGO + 60,
    )
    listed = json.loads(runs(tmp_path / "runs", "--json").stdout)
    assert [Path(run["run_dir"]).name for run in listed] == ["a", "a-rerun"]
    first, branch = listed
    assert (first["status"], first["steps_done"], first["steps_total"]) == ("done", 2, 2)
    assert (first["score"], first["val_score"], first["val_step"]) == (0.2, 0.375, 2)
    assert (first["mlflow_run_id"], first["mlflow_status"]) == (run_id, "FINISHED")
    assert (branch["status"], branch["steps_total"], branch["parent"]) == ("done", 1, str(parent))
    assert branch["mlflow_run_id"] is None
    table = runs(tmp_path / "runs")
    assert table.exit_code == 0
    assert table.stdout.splitlines()[0].split() == [
        "started", "run", "status", "steps", "score", "val", "score", "MLflow", "run", "parent"
    ]  # fmt: skip
    rows = table_rows(table.stdout)
    assert rows["a"] == ["done", "2/2", "0.200", "0.375", "@2", run_id, "-"]
    assert rows["a-rerun"] == ["done", "1/1", "0.200", "-", "-", "a"]  # the parent, relative


def test_statuses_from_journals_activity_and_mlflow(tmp_path, store):
    uri, client = store
    now = time.time()

    def info(status: str) -> dict:
        return run_info(mlflow_run(client, status, {}), uri)

    make_run(tmp_path / "mid-step", ["done", "running"], written=now, started=1)
    make_run(tmp_path / "killed", ["done", "running"], started=2)
    make_run(tmp_path / "between", ["done"], written=now, started=3, info=info("RUNNING"))
    make_run(tmp_path / "stopped", ["done"], started=4)
    make_run(tmp_path / "crashed", ["done"], written=now, started=5, info=info("FAILED"))
    make_run(tmp_path / "epochs", ["done"], total=None, started=6, info=info("FINISHED"))
    listed = {Path(r.run_dir).name: r for r in list_runs(tmp_path, TrackingLookup(), now)}
    assert {name: run.status for name, run in listed.items()} == {
        "mid-step": "running",
        "killed": "failed",
        "between": "running",
        "stopped": "partial",
        "crashed": "failed",
        "epochs": "done",
    }
    assert (listed["killed"].steps_done, listed["killed"].last_step) == (1, 2)
    assert listed["killed"].score == 0.1  # the last finished step's
    assert (listed["epochs"].steps_done, listed["epochs"].steps_total) == (1, None)
    assert table_rows(runs(tmp_path).stdout)["epochs"][:2] == ["done", "1/?"]


def test_a_missing_store_or_damaged_journal_is_a_note_not_a_failure(tmp_path):
    gone = run_info("abc", f"sqlite:///{tmp_path}/none.db")
    make_run(tmp_path / "ok", ["done", "done"], info=gone)
    damaged = make_run(tmp_path / "damaged", ["done"])
    (damaged / "step_1" / "journal.json").write_text('{"step": 1, "sta')
    result = runs(tmp_path)
    assert result.exit_code == 0
    rows = table_rows(result.stdout)
    assert rows["ok"] == ["done", "2/2", "0.200", "-", "abc", "-"]
    assert rows["damaged"][0] == "unreadable"
    notes = [line for line in result.stderr.splitlines() if line.startswith("note: ")]
    assert len(notes) == 2
    assert "none.db: the database file does not exist" in notes[0]
    assert "damaged" in notes[1] and "journal for step 1 is not valid JSON" in notes[1]
    assert not (tmp_path / "none.db").exists()  # listing never creates a store


def test_an_unreachable_server_is_asked_once_without_retries(tmp_path, monkeypatch):
    for name in ("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "MLFLOW_HTTP_REQUEST_TIMEOUT"):
        monkeypatch.delenv(name, raising=False)  # restored after the test
    down = run_info("abc", "http://127.0.0.1:9")
    for name in ("one", "two"):
        make_run(tmp_path / name, ["done", "done"], info=down)
    started = time.perf_counter()
    result = runs(tmp_path, "--json")
    assert time.perf_counter() - started < 30  # MLflow's defaults retry for minutes
    assert [run["status"] for run in json.loads(result.stdout)] == ["done", "done"]
    notes = [line for line in result.stderr.splitlines() if line.startswith("note: ")]
    assert len(notes) == 1 and "http://127.0.0.1:9" in notes[0]


def test_an_empty_directory_is_one_line(tmp_path):
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")  # a model directory is not a run
    result = runs(tmp_path)
    assert result.exit_code == 0
    assert result.stdout.splitlines() == [
        f"no run directories under {tmp_path} (a run directory holds config.json and "
        "step_<k>/journal.json; ppoflow train writes them)"
    ]
    assert json.loads(runs(tmp_path, "--json").stdout) == []


def test_a_missing_directory_is_one_line_exit_2(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no packaged config's runs here
    result = runs(tmp_path / "nope")
    assert result.exit_code == 2
    assert result.stderr.splitlines() == [
        f"error: {tmp_path / 'nope'} is not a directory; pass the directory that holds the run "
        "directories (ppoflow.artifact_dir of the runs)"
    ]


def test_a_missing_directory_points_to_the_packaged_configs_runs_that_exist(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "outputs" / "demo" / "runs").mkdir(parents=True)  # what make demo writes
    result = runs(tmp_path / "nope")
    assert result.exit_code == 2
    (line,) = result.stderr.splitlines()
    assert line.endswith(
        "; the packaged configs' runs here: outputs/demo/runs (configs/demo-cpu.yaml)"
    )


def test_the_default_directory_is_the_default_artifact_dir(tmp_path, monkeypatch):
    from stages.config import PPORunConfig

    default = PPORunConfig().ppoflow.artifact_dir
    monkeypatch.chdir(tmp_path)
    make_run(tmp_path / default / "r1", ["done", "done"])
    listed = json.loads(runs("--json").stdout)
    assert [run["run_dir"] for run in listed] == [str(tmp_path / default / "r1")]
