"""Progress lines in the flow run's logs: the console's one-line text, logged through the given
logger (Prefect's run logger in the train flow), with or without the console, bar or no bar."""

from __future__ import annotations

import logging
from io import StringIO
from uuid import UUID

import pytest
from prefect import get_run_logger
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId
from prefect.logging.handlers import APILogHandler
from prefect.runtime import flow_run
from rich.console import Console

from flows.sinks.progress import Progress
from flows.step_flow import StepFlow

STEP_1 = {"critic/score/mean": 0.5, "timing_s/step": 2.0, "actor/ppo_kl": 0.00123}
STEP_2 = {"critic/score/mean": 0.25, "timing_s/step": 4.0}
VAL = {"val-core/demo/reward/mean@1": 0.125, "val-aux/demo/acc/std@1": 0.3}
EXPECTED = [
    "validation @ step 0: score 0.125 demo/reward/mean@1=0.125",
    "step 1/4 │ score 0.500 │ ppo_kl 0.0012 │ 2.0 s │ eta 0:06",
    "step 2/4 │ score 0.250 │ 4.0 s │ eta 0:06",
]


class Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(f"{record.levelname} {record.getMessage()}")


def logger_with_lines() -> tuple[logging.Logger, Lines]:
    logger = logging.getLogger(f"test-progress-{id(object())}")
    logger.setLevel(logging.INFO)
    logger.propagate = False
    handler = Lines()
    logger.addHandler(handler)
    return logger, handler


def drive(progress: Progress) -> None:
    progress.validation(0, 0.125, VAL)
    progress.step(1, STEP_1)
    progress.step(2, STEP_2)


@pytest.mark.parametrize("terminal", [False, True])
def test_the_logged_lines_are_the_console_lines_on_or_off_a_terminal(terminal):
    out = StringIO()
    console = Console(file=out, force_terminal=terminal, width=140, highlight=False)
    logger, handler = logger_with_lines()
    progress = Progress(4, console=console, logger=logger)
    drive(progress)
    progress.close()
    assert handler.lines == [f"INFO {line}" for line in EXPECTED]
    if not terminal:  # the console output is what it was without a logger
        assert out.getvalue().splitlines() == EXPECTED


def test_lines_are_logged_when_the_console_is_off():
    out = StringIO()
    logger, handler = logger_with_lines()
    progress = Progress(4, enabled=False, console=Console(file=out), logger=logger)
    drive(progress)
    progress.summary({"steps": "2", "val score after": 0.5})
    assert out.getvalue() == ""
    assert handler.lines[:3] == [f"INFO {line}" for line in EXPECTED]
    assert handler.lines[3].startswith("INFO ppoflow train: wall time 0:00 │ steps 2 │ ")
    assert handler.lines[3].endswith("│ val score after 0.500")


def _progress_in_a_flow() -> str:
    progress = Progress(4, enabled=False, logger=get_run_logger())
    drive(progress)
    return str(flow_run.id)


@pytest.fixture
def run_logs_at_info():
    """Prefect's flow-run logger at INFO, its default (a ``ppoflow train`` test earlier in the
    session leaves the parent "prefect" logger at WARNING: flows/cli/train.py)."""
    logger = logging.getLogger("prefect.flow_runs")
    saved = logger.level
    logger.setLevel(logging.INFO)
    yield
    logger.setLevel(saved)


@pytest.mark.usefixtures("prefect_harness", "run_logs_at_info")
def test_the_run_logger_sends_the_lines_to_the_flow_runs_logs():
    flow_run_id = StepFlow(fn=_progress_in_a_flow, name="test-progress-logs")()
    APILogHandler().flush()  # the log worker sends batches in the background
    with get_client(sync_client=True) as client:
        logs = client.read_logs(
            log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[UUID(flow_run_id)]))
        )
    messages = [log.message for log in logs]
    assert [m for m in messages if m.startswith(("step ", "validation "))] == EXPECTED
    assert all(log.level == logging.INFO for log in logs if log.message in EXPECTED)
