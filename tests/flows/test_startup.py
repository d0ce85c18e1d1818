"""Start-up output (flows/process/startup.py): ppoflow's phase lines on the terminal, the libraries' output
in the run's log file until the first step, ppoflow's own warnings kept on the terminal."""

from __future__ import annotations

import io
import logging
import os
import re
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest
from typer.testing import CliRunner

from flows.cli import train as cli_train
from flows.cli.app import app as ppoflow_app
from flows.cli.config import config_messages
from flows.process.startup import (
    OutputToFile,
    Startup,
    current_startup,
    describe_model,
    log_file_for,
    prefect_records_to,
    startup_output,
)
from stages.config import ConfigNotice
from stages.data.tiny_model import make_tiny_model

PREFECT_LINE = re.compile(r"\d\d:\d\d:\d\d\.\d+ \| ")
FLOWS_FILE = str(Path(cli_train.__file__))  # a file of ppoflow's own packages


class Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def plain_startup() -> tuple[Startup, io.StringIO, Lines]:
    from rich.console import Console

    out = io.StringIO()
    logger = logging.getLogger("test_startup.phases")
    logger.setLevel(logging.INFO)
    lines = Lines()
    logger.handlers = [lines]
    return Startup(Console(file=out, width=200), logger), out, lines


def test_each_phase_prints_and_logs_one_line_with_its_result_and_time():
    startup, out, lines = plain_startup()
    with startup.phase("data", "reading the datasets") as shown:
        shown["text"] = "8 train / 2 val prompts"
    startup.begin("Prefect", "starting Prefect's temporary server")
    assert startup.pending == "Prefect"
    startup.end("flow run 'x'")
    printed = out.getvalue().splitlines()
    assert printed[0].startswith("  data     8 train / 2 val prompts  ") and printed[0].endswith(
        " s"
    )
    assert printed[1].startswith("  Prefect  flow run 'x'  ")
    assert lines.messages[0].startswith("ppoflow: data: 8 train / 2 val prompts (")
    assert startup.pending is None


def test_a_failed_phase_says_what_it_was_doing_and_the_error_propagates():
    startup, out, _ = plain_startup()
    with pytest.raises(FileNotFoundError), startup.phase("model", "reading the tokenizer of m"):
        raise FileNotFoundError("m")
    assert "  model    reading the tokenizer of m: failed after " in out.getvalue()
    assert startup.pending is None


def test_one_phase_at_a_time():
    startup, _, _ = plain_startup()
    startup.begin("data", "x")
    with pytest.raises(RuntimeError, match="'data' is still open"):
        startup.begin("model", "y")
    startup.end("done")
    with pytest.raises(RuntimeError, match="no start-up phase is open"):
        startup.end("again")


def test_without_the_command_line_a_startup_only_logs():
    startup = current_startup()
    assert startup.console is None and startup.capture is None
    with startup.phase("data", "x"):
        pass
    startup.ready()  # nothing to release


def test_output_to_file_moves_this_process_and_its_children(tmp_path, capfd):
    log = tmp_path / "libs.log"
    capture = OutputToFile(str(log))
    capture.start()
    try:
        os.write(1, b"fd one\n")
        os.write(2, b"fd two\n")
        print("print to stdout", file=sys.__stdout__, flush=True)
        subprocess.run([sys.executable, "-c", "print('from a child')"], check=True)
    finally:
        capture.stop()
    capture.stop()  # idempotent
    os.write(1, b"after\n")
    assert log.read_text().splitlines() == ["fd one", "fd two", "print to stdout", "from a child"]
    assert capfd.readouterr().out == "after\n"


def test_startup_output_keeps_ppoflow_on_the_terminal_and_libraries_in_the_log(
    tmp_path, monkeypatch
):
    terminal = io.StringIO()
    monkeypatch.setattr(sys, "stdout", terminal)  # not fd 1: ppoflow writes to this object
    log = tmp_path / "run" / "ppoflow.log"
    library = logging.getLogger("some_library")
    library.handlers = [logging.StreamHandler(sys.__stderr__)]  # bound at import, as they are
    library.propagate = False
    with config_messages(), startup_output("ppoflow x · demo · run dir r", str(log)) as startup:
        assert current_startup() is startup
        with startup.phase("engines", "actor: building"):
            os.write(1, b"DeepSpeed op built successfully\n")
            library.warning("Creating initial MLflow database tables")
            logging.getLogger("flows.something").warning("ppoflow's own warning")
            warnings.warn_explicit("a config notice", ConfigNotice, FLOWS_FILE, 1)
            with pytest.warns(UserWarning, match="a library warning"):  # not on the terminal
                warnings.warn_explicit("a library warning", UserWarning, "/site-packages/lib.py", 1)
            startup.say("resumed from ckpt/global_step_2")
        startup.ready()
        os.write(2, b"")  # the descriptors are back
    shown = terminal.getvalue()
    assert shown.startswith("ppoflow x · demo · run dir r\n")
    assert "  engines  actor: building  " in shown and "resumed from ckpt/global_step_2" in shown
    assert "WARNING: ppoflow's own warning" in shown and "note: a config notice" in shown
    assert "ready in " in shown and f"library messages in {log}" in shown
    assert "built successfully" not in shown and "a library warning" not in shown
    logged = log.read_text()
    assert "DeepSpeed op built successfully" in logged
    assert "Creating initial MLflow database tables" in logged
    assert current_startup() is not startup


def test_a_failed_start_names_the_log_and_restores_the_output(tmp_path, monkeypatch, capfd):
    terminal = io.StringIO()
    monkeypatch.setattr(sys, "stdout", terminal)
    log = tmp_path / "ppoflow.log"
    with pytest.raises(ValueError, match="bad"), startup_output("h", str(log)) as startup:
        startup.begin("Prefect", "starting Prefect's temporary server")
        os.write(2, b"a traceback from a library\n")
        raise ValueError("bad")
    shown = terminal.getvalue().splitlines()
    assert shown[1].startswith("  Prefect  starting Prefect's temporary server: failed after ")
    assert shown[2] == f"library messages: {log}"
    assert log.read_text() == "a traceback from a library\n"
    os.write(2, b"visible\n")
    assert capfd.readouterr().err == "visible\n"


def test_verbose_moves_nothing(tmp_path, monkeypatch, capfd):
    terminal = io.StringIO()
    monkeypatch.setattr(sys, "stdout", terminal)
    log = tmp_path / "ppoflow.log"
    with startup_output("h", str(log), capture=False) as startup:
        os.write(2, b"library line\n")
        startup.ready()
    assert capfd.readouterr().err == "library line\n"
    assert not log.exists() and terminal.getvalue().splitlines() == ["h", "ready in 0.0 s"]


@pytest.mark.parametrize("internal_propagates", [False, True])  # False: Prefect's logging config
def test_prefects_records_go_to_the_runs_log_and_not_the_terminal(
    tmp_path, monkeypatch, internal_propagates
):
    """A failed task's record and an internal service's error go to the file in the block;
    ppoflow's own warnings stay on the terminal, and everything is as before after it."""
    monkeypatch.setattr(logging.getLogger("prefect._internal"), "propagate", internal_propagates)
    for name in ("flows", "flows.train"):  # as a run has them, whatever earlier tests configured
        monkeypatch.setattr(logging.getLogger(name), "disabled", False)
        monkeypatch.setattr(logging.getLogger(name), "propagate", True)
    terminal = io.StringIO()
    handlers = {name: logging.StreamHandler(terminal) for name in ("", "prefect._internal")}
    for name, handler in handlers.items():
        logging.getLogger(name).addHandler(handler)
    log_file = tmp_path / "run" / "ppoflow.log"
    log_file.parent.mkdir()
    try:
        run = {"task_run_name": "reward-step1"}  # what Prefect's run logger adds
        with prefect_records_to(str(log_file)):
            logging.getLogger("prefect.task_runs").error(
                "Finished in state Failed('boom')", extra=run
            )
            logging.getLogger("prefect._internal.concurrency").error("Service failed")
            logging.getLogger("prefect.task_runs").error("a record without its run's name")
            logging.getLogger("flows.train").warning("a warning of ppoflow's own")
        logging.getLogger("prefect.task_runs").error("after the run", extra=run)
    finally:
        for name, handler in handlers.items():
            logging.getLogger(name).removeHandler(handler)
    in_file = log_file.read_text()
    assert "Finished in state Failed('boom')" in in_file and "Service failed" in in_file
    assert "a record without its run's name" in in_file  # formatted all the same
    assert in_file.count("Service failed") == 1  # one handler wrote it, once
    assert "own" not in in_file and "after the run" not in in_file
    shown = terminal.getvalue()
    assert "Failed" not in shown and "Service failed" not in shown
    assert "a warning of ppoflow's own" in shown and "after the run" in shown


def test_describe_model_reads_the_config(tmp_path):
    model = make_tiny_model(tmp_path / "model")
    text = describe_model(str(model))
    assert text.startswith("qwen2, 2 layers, hidden ") and text.endswith(f"({model})")
    assert describe_model(str(tmp_path / "none")) == str(tmp_path / "none")


def test_the_log_file_is_in_a_local_run_dir_and_in_tmp_for_a_url(tmp_path):
    assert log_file_for(str(tmp_path / "run")) == str(tmp_path / "run" / "ppoflow.log")
    assert (tmp_path / "run").is_dir()
    remote = log_file_for("s3://bucket/runs/r")
    assert Path(remote).is_file() and remote.endswith(".log")
    os.unlink(remote)


def test_a_failed_start_from_the_command_line_shows_the_phase_then_one_error(
    prefect_harness, tmp_path
):
    model = make_tiny_model(tmp_path / "model")
    result = CliRunner().invoke(
        ppoflow_app,
        ["train", "demo-cpu", f"data.train_files=[{tmp_path}/none.parquet]",
         f"data.val_files=[{tmp_path}/none.parquet]", f"actor_rollout_ref.model.path={model}",
         "--run-dir", str(tmp_path / "run")],
    )  # fmt: skip
    assert result.exit_code == 1
    # the test's Prefect server keeps the run loggers on (flows/cli/train.py quiet_prefect), so
    # Prefect's own error lines and traceback come in between here
    lines = result.output.splitlines()
    expected = [
        ("ppoflow ", f"run dir {tmp_path / 'run'}"),
        ("  Prefect  flow run '", ""),
        ("  model    qwen2, 2 layers", ""),
        ("  data     reading and tokenizing the datasets: failed after ", ""),
        (f"library messages: {tmp_path / 'run' / 'ppoflow.log'}", ""),
        ("error: ", "none.parquet"),
    ]
    at = [
        next(i for i, line in enumerate(lines) if line.startswith(a) and b in line)
        for a, b in expected
    ]
    assert at == sorted(at) and at[-1] == len(lines) - 1, result.output


class AheadServer:
    """Stands in for the temporary server ``start_ahead`` launched: the test harness's server,
    with the moment the command line first waited for it recorded (or a start that failed)."""

    def __init__(self, api_url: str, fails: bool = False) -> None:
        self.api_url, self.fails, self.port, self.ready_after = api_url, fails, 0, 1.0
        self.waited_at: float | None = None

    def wait_ready(self, timeout_s: float | None = None) -> float:
        self.waited_at = time.perf_counter()
        if self.fails:
            raise RuntimeError("Prefect's temporary server exited with status 5: cannot start")
        return 1.0


def started_ahead_as(monkeypatch, fails: bool = False) -> AheadServer:
    from prefect.settings import PREFECT_API_URL

    from flows.process import prefect_server

    server = AheadServer(PREFECT_API_URL.value(), fails)
    monkeypatch.setattr(prefect_server, "_started", [server])
    return server


def run_train(demo: Path, out: Path, overrides: list[str]):
    return CliRunner().invoke(
        ppoflow_app, ["train", "demo-cpu", *overrides, "--run-dir", str(out / "run")]
    )


def test_with_the_server_started_ahead_the_run_opens_before_the_flow_run(
    prefect_harness, tmp_path, monkeypatch, make_demo_inputs, tiny_run_overrides
):
    demo = make_demo_inputs(tmp_path / "demo")
    server = started_ahead_as(monkeypatch)
    result = run_train(demo, tmp_path, tiny_run_overrides(demo, tmp_path, 1))
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    starts = [
        "  model ",
        "  data ",
        "  engines  actor",
        "  MLflow ",
        "  Prefect  temporary",
        "step 1/1",
    ]
    at = [next(i for i, line in enumerate(lines) if line.startswith(s)) for s in starts]
    assert at == sorted(at), result.output  # model → … → MLflow, then the flow run
    assert server.waited_at is not None
    assert result.output.strip().splitlines()[-1] == str(tmp_path / "run")


def test_a_flow_run_that_cannot_start_closes_the_run_opened_ahead(
    prefect_harness, tmp_path, monkeypatch, make_demo_inputs, tiny_run_overrides
):
    import mlflow

    from flows.runs.lock import lock_run_dir

    demo = make_demo_inputs(tmp_path / "demo")
    started_ahead_as(monkeypatch, fails=True)
    result = run_train(demo, tmp_path, tiny_run_overrides(demo, tmp_path, 1))
    assert result.exit_code == 1
    assert result.output.splitlines()[-1].startswith("error: ") and "status 5" in result.output
    assert "  MLflow " in result.output and "step 1" not in result.output
    lock = lock_run_dir(str(tmp_path / "run"), True)  # released: a new training may start
    assert lock is not None
    lock.release()
    runs = mlflow.MlflowClient(f"sqlite:///{tmp_path}/mlflow.db").search_runs(
        [
            e.experiment_id
            for e in mlflow.MlflowClient(f"sqlite:///{tmp_path}/mlflow.db").search_experiments()
        ]
    )
    assert [r.info.status for r in runs] == ["FAILED"]
