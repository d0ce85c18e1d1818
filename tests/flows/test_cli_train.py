"""``ppoflow train``: help, and a one-line error with a non-zero exit for a bad config."""

from __future__ import annotations

import typer
from typer.testing import CliRunner

from flows.cli import train as cli_train
from stages.data.demo_task import make_demo_data
from stages.data.tiny_model import make_tiny_model


def app() -> typer.Typer:
    application = typer.Typer()
    cli_train.register(application)

    @application.command("other")
    def other() -> None:  # a second command keeps `train` a subcommand
        """Unused."""

    return application


def test_help_names_the_contract():
    result = CliRunner().invoke(app(), ["train", "--help"])
    assert result.exit_code == 0
    assert "--run-dir" in result.output and "last line printed is the run" in result.output


def test_bad_override_exits_2_with_one_line_error(tmp_path):
    result = CliRunner().invoke(
        app(), ["train", "demo-cpu", "algorithm.adv_estimator=nope", "--run-dir", str(tmp_path)]
    )
    assert result.exit_code == 2
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert (
        len(lines) == 1
        and lines[0].startswith("error: invalid config (demo-cpu + 1 override): ")
        and "adv_estimator" in lines[0]
    )


def test_missing_data_exits_1(prefect_harness, tmp_path):
    model = make_tiny_model(tmp_path / "model")
    result = CliRunner().invoke(
        app(),
        ["train", "demo-cpu", f"data.train_files=[{tmp_path}/none.parquet]",
         f"data.val_files=[{tmp_path}/none.parquet]", f"actor_rollout_ref.model.path={model}",
         "--run-dir", str(tmp_path / "run")],
    )  # fmt: skip
    assert result.exit_code == 1
    assert "none.parquet" in result.output


def test_missing_model_directory_exits_1_naming_it(prefect_harness, tmp_path):
    result = CliRunner().invoke(
        app(),
        ["train", "demo-cpu", f"actor_rollout_ref.model.path={tmp_path}/no-model",
         "--run-dir", str(tmp_path / "run")],
    )  # fmt: skip
    assert result.exit_code == 1
    assert "no-model" in result.output and "make-tiny-model" in result.output


def test_a_prefect_server_is_seen_in_the_environment(monkeypatch):
    from flows.cli.train import has_prefect_server

    monkeypatch.setenv("PREFECT_API_URL", "http://127.0.0.1:9/api")
    assert has_prefect_server()


def test_quiet_prefect_keeps_run_logs_for_a_prefect_server(monkeypatch):
    import logging

    from flows.cli import train as cli_train
    from flows.cli.train import _RunLinesOffConsole, quiet_prefect

    record = logging.LogRecord("prefect.flow_runs", logging.INFO, __file__, 1, "step 1/2", (), None)
    monkeypatch.setattr(cli_train, "has_prefect_server", lambda: False)
    with quiet_prefect(False):  # the temporary server: the run lines are not made at all
        assert logging.getLogger("prefect.flow_runs").level == logging.CRITICAL
    monkeypatch.setattr(cli_train, "has_prefect_server", lambda: True)
    with quiet_prefect(False):  # a server: its UI gets them, the console does not
        assert logging.getLogger("prefect.flow_runs").getEffectiveLevel() <= logging.INFO
        filters = [f for h in logging.getLogger().handlers for f in h.filters]
        assert any(isinstance(f, _RunLinesOffConsole) and not f.filter(record) for f in filters)
    assert not any(
        isinstance(f, _RunLinesOffConsole) for h in logging.getLogger().handlers for f in h.filters
    )


def test_an_unknown_data_source_fails_before_the_first_step(prefect_harness, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    model = make_tiny_model(tmp_path / "model")
    train_file, val_file = make_demo_data(tmp_path / "data")
    table = pq.read_table(train_file)
    sources = table.column("data_source").to_pylist()
    sources[3] = "my/unknown"
    index = table.schema.get_field_index("data_source")
    pq.write_table(table.set_column(index, "data_source", pa.array(sources)), train_file)
    result = CliRunner().invoke(
        app(),
        ["train", "demo-cpu", f"data.train_files=[{train_file}]", f"data.val_files=[{val_file}]",
         f"actor_rollout_ref.model.path={model}", "--run-dir", str(tmp_path / "run")],
    )  # fmt: skip
    assert result.exit_code == 1
    lines = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "'my/unknown'" in lines[0] and "row 3" in lines[0], result.output
    assert not (tmp_path / "run" / "step_1").exists()  # nothing ran
