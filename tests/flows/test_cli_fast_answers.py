"""The command line answers ``--help`` and usage errors without torch and without servers: its
modules import the heavy libraries only when a command runs, and a training command parses its
arguments and finds its config file before Prefect's server and the MLflow process start
(flows/cli/entry.py, ``flows.cli.app.check_command_line``)."""

from __future__ import annotations

import subprocess
import sys

import pytest

HEAVY = ("torch", "transformers", "deepspeed", "prefect", "mlflow", "tensordict")


def test_the_command_line_modules_import_no_heavy_library():
    code = f"import sys, flows.cli.app; print(sorted(m for m in {HEAVY!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout


@pytest.fixture
def no_servers(monkeypatch):
    """entry.main with the server starts replaced by a failure: the test fails if one starts."""
    import flows.process.prefect_server as prefect_server
    import flows.sinks.mlflow_process as mlflow_process

    def started(*_args, **_kwargs):
        raise AssertionError("a server started before the command line was checked")

    monkeypatch.setattr(prefect_server, "start_ahead_for", started)
    monkeypatch.setattr(mlflow_process, "start_ahead", started)
    monkeypatch.setattr("flows.process.start_up_gc.pause", lambda: None)
    monkeypatch.setattr("flows.process.own_process.prepare_own_process", lambda: None)


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (["train", "--bogus"], "error: No such option: --bogus"),
        (["train"], "error: Missing argument 'config'."),
        (["resume"], "error: Missing argument 'run_dir'."),
        (["train", "/nowhere/at-all.yaml"], "error: invalid config (/nowhere/at-all.yaml): config "
         "file not found: '/nowhere/at-all.yaml'"),
    ],
)  # fmt: skip
def test_a_training_command_with_bad_arguments_answers_before_any_server_starts(
    no_servers, monkeypatch, capsys, args, line
):
    from flows.cli import entry

    monkeypatch.setattr(sys, "argv", ["ppoflow", *args])
    with pytest.raises(SystemExit) as stopped:
        entry.main()
    assert stopped.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(line), err


def test_a_good_command_line_passes_the_check(capsys):
    from flows.cli.app import check_command_line

    check_command_line(["train", "demo-cpu", "trainer.total_training_steps=1", "--run-dir", "x"])
    assert capsys.readouterr().err == ""


def test_train_help_ends_with_examples_that_parse_and_points_to_config_defaults():
    from typer.testing import CliRunner

    from flows.cli.app import app, check_command_line
    from flows.cli.train import TRAIN_EXAMPLES

    result = CliRunner().invoke(app, ["train", "--help"])
    assert result.exit_code == 0
    text = " ".join(result.output.split())
    assert "ppoflow config defaults" in text and "Examples: ppoflow train demo-cpu" in text
    for example in TRAIN_EXAMPLES.removeprefix("Examples: ").split(" · ")[:2]:
        check_command_line(example.split()[1:])  # each example parses, its config is there
