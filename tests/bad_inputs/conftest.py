"""The bad-input suite's shared inputs and its one check.

Every test feeds ``ppoflow`` one malformed input, in process (the ``ppoflow`` fixture: typer's
``CliRunner`` on ``flows.cli.app.app``), and hands the result to the ``expect`` fixture, which asserts
the contract of docs/bad-inputs.md: the exit status (2 for input to fix in the config or the
arguments, 1 otherwise), exactly one output line starting with ``error:`` that holds the given
needles (the offending key / row / file and what would be right), no ``Traceback``, and no
exception escaping the command. Whether anything was lost or half-written each test asserts
itself: ``with unchanged(dir, …):`` around the command, or a look at what is there after it.

Shared inputs, made once per session: ``demo`` (the demo task's parquet files and the tiny
model), ``finished`` (one GRPO step of the train flow with a checkpoint: the run directory,
artifact and checkpoint cases damage a file of it with ``damaged``, which restores it after)
and ``prefect_harness`` (one temporary Prefect server, as in tests/flows/conftest.py).

``PPOFLOW_BAD_INPUTS_TABLE=1 pytest tests/bad_inputs -m ''`` rewrites the table of
docs/bad-inputs.md from the lines the commands printed (tests/bad_inputs/test_table.py checks
that it lists every test).
"""

from __future__ import annotations

import hashlib
import io
import logging
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

REPO = Path(__file__).resolve().parents[2]
TABLE_DOC = REPO / "docs" / "bad-inputs.md"
HERE = Path(__file__).resolve().parent
#: run-time files a failed start may write without changing what the run computed: the
#: library log is created or appended to (checked: its old text stays its prefix), the lock
#: file is rewritten by whoever takes the lock
RUN_TIME_FILES = ("ppoflow.log", ".lock")

#: every test id collected under tests/bad_inputs (slow ones included: collection comes
#: before the -m deselection), for test_table.py
COLLECTED: set[str] = set()
#: test id -> (input, the error line, exit status, whether the test is slow), for the docs table
RECORDED: dict[str, tuple[str, str, int, bool]] = {}


def pytest_itemcollected(item: pytest.Item) -> None:
    if Path(str(item.path)).parent == HERE:
        COLLECTED.add(case_id(item.nodeid))


def case_id(nodeid: str) -> str:
    """``tests/bad_inputs/test_config.py::test_x[a]`` → ``test_config.py::test_x[a]``."""
    return nodeid.split("bad_inputs/", 1)[-1]


# --- the check ---------------------------------------------------------------------------------


def invoke(*args: Any) -> Any:
    """``ppoflow ARGS…`` in this process; the result holds stdout and stderr together."""
    from flows.cli.app import app

    return CliRunner().invoke(app, [str(a) for a in args])


def place(texts: list[str], **paths: Any) -> list[str]:
    """``texts`` with every ``{name}`` replaced by ``paths[name]`` (the cases' tables name the
    paths a test makes: ``{run}``, ``{out}``, …)."""
    placed = []
    for text in texts:
        for name, path in paths.items():
            text = text.replace(f"{{{name}}}", str(path))
        placed.append(text)
    return placed


@pytest.fixture
def fill() -> Callable[..., list[str]]:
    """``fill(texts, run=…, out=…)``: :func:`place`."""
    return place


@pytest.fixture
def ppoflow() -> Callable[..., Any]:
    """``ppoflow(*args)``: :func:`invoke`."""
    return invoke


def error_line(result: Any, console: str = "") -> str:
    """The one ``error:`` line of ``result``, after the checks every case shares."""
    escaped = result.exception
    assert escaped is None or isinstance(escaped, SystemExit), f"raised {escaped!r}"
    for text in (result.output, console):
        assert "Traceback" not in text, text
    lines = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, result.output
    return lines[0]


@pytest.fixture
def expect(request: pytest.FixtureRequest) -> Callable[..., str]:
    """``expect(result, code, *needles, input="…", console="")`` → the error line, after
    asserting the suite's contract (module docstring); the line is recorded for the table."""

    def check(result: Any, code: int, *needles: str, input: str, console: str = "") -> str:
        line = error_line(result, console)
        slow = request.node.get_closest_marker("slow") is not None
        RECORDED[case_id(request.node.nodeid)] = (input, line, result.exit_code, slow)
        assert result.exit_code == code, result.output
        for needle in needles:
            assert needle in line, f"{needle!r} not in {line!r}"
        return line

    return check


@pytest.fixture
def console() -> Iterator[Callable[[], str]]:
    """What the logging handlers that write to a terminal (Prefect's console handler
    included) wrote during the test: ``console()`` returns it. CliRunner captures only what
    the command itself prints; these handlers hold the streams of when logging was set up."""
    buffer = _Kept()
    swapped: list[tuple[logging.StreamHandler, Any, Any]] = []
    for ref in list(logging._handlerList):  # every live handler
        handler = ref()
        if not isinstance(handler, logging.StreamHandler) or isinstance(
            handler,
            (logging.FileHandler, type(logging.lastResort)),  # lastResort: a property
        ):
            continue
        rich = getattr(handler, "console", None)
        swapped.append((handler, handler.stream, rich and rich.file))
        handler.stream = buffer  # not setStream: it flushes the old one, which may be closed
        if rich is not None:
            rich.file = buffer
    try:
        yield buffer.getvalue
    finally:
        for handler, stream, rich_file in swapped:
            handler.stream = stream
            if rich_file is not None:
                handler.console.file = rich_file


class _Kept(io.StringIO):
    """A buffer that keeps its text when something closes it (a handler or a console)."""

    def close(self) -> None:
        pass


# --- nothing lost ------------------------------------------------------------------------------


def snapshot(*roots: Path) -> dict[str, Any]:
    """Every file under ``roots``: its sha256, or its text for :data:`RUN_TIME_FILES`."""
    files: dict[str, Any] = {}
    for root in roots:
        for path in sorted(Path(root).rglob("*")):
            if path.is_file():
                data = path.read_bytes()
                keep = data.decode(errors="replace") if path.name in RUN_TIME_FILES else None
                files[str(path)] = keep if keep is not None else hashlib.sha256(data).hexdigest()
    return files


def changed_files(before: dict[str, Any], *roots: Path) -> list[str]:
    """The files under ``roots`` added, removed or changed since ``before`` (a
    :func:`snapshot`); the library log may only have grown, the lock file may be rewritten."""
    after = snapshot(*roots)
    changed = {n for n in set(after) ^ set(before) if Path(n).name not in RUN_TIME_FILES}
    for name in set(after) & set(before):
        if Path(name).name == "ppoflow.log":
            grew = after[name].startswith(before[name])
            changed |= set() if grew else {name}
        elif Path(name).name != ".lock" and after[name] != before[name]:
            changed.add(name)
    return sorted(changed)


@contextmanager
def unchanged_files(*roots: Path) -> Iterator[None]:
    """Assert that the block left every file under ``roots`` as it was (:func:`changed_files`)."""
    before = snapshot(*roots)
    yield
    assert changed_files(before, *roots) == []


@pytest.fixture
def unchanged() -> Callable[..., Any]:
    """``with unchanged(dir, …):`` — :func:`unchanged_files`."""
    return unchanged_files


@contextmanager
def damage(path: Path, how: str | Callable[[Path], object]) -> Iterator[Path]:
    """``path`` damaged for the block, then restored: ``truncate`` (to half its bytes),
    ``flip`` (one byte in the middle inverted), ``garbage`` (``not json``), ``delete``, or a
    function that changes the file. The copy it is restored from is kept outside the run."""
    backup = Path(tempfile.mkdtemp(prefix="bad-input-")) / path.name
    if path.is_dir():
        shutil.copytree(path, backup)
    else:
        shutil.copy2(path, backup)
    try:
        if callable(how):
            how(path)
        elif how == "delete":
            shutil.rmtree(path) if path.is_dir() else path.unlink()
        elif how == "truncate":
            data = path.read_bytes()
            path.write_bytes(data[: len(data) // 2])
        elif how == "flip":
            data = bytearray(path.read_bytes())
            data[len(data) // 2] ^= 0xFF
            path.write_bytes(bytes(data))
        elif how == "garbage":
            path.write_text("not json")
        else:
            raise ValueError(f"unknown damage {how!r}")
        yield path
    finally:
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()
        shutil.move(backup, path)
        backup.parent.rmdir()


@pytest.fixture
def damaged() -> Callable[..., Any]:
    """``with damaged(path, how):`` — :func:`damage`."""
    return damage


# --- shared inputs -----------------------------------------------------------------------------


@pytest.fixture(scope="session")
def prefect_harness():
    """One temporary Prefect server for the cases that run the train or rerun flow (the
    pattern of tests/flows/conftest.py, whose fixture this directory cannot see)."""
    from prefect.settings import PREFECT_FLOWS_HEARTBEAT_FREQUENCY, temporary_settings
    from prefect.testing.utilities import prefect_test_harness

    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    with (
        prefect_test_harness(server_startup_timeout=120),
        temporary_settings(updates={PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}),
    ):
        yield


@pytest.fixture
def as_without_a_server(monkeypatch: pytest.MonkeyPatch) -> None:
    """The console as a user without a Prefect server sees it (Prefect's temporary server,
    the default): the CLI's logging choice reads has_prefect_server(), which the harness
    makes True."""
    monkeypatch.setattr("flows.cli.train.has_prefect_server", lambda: False)


@dataclass(frozen=True)
class Demo:
    """The demo task's data and the tiny model (``make-demo-data`` / ``make-tiny-model``)."""

    root: Path

    @property
    def train(self) -> Path:
        return self.root / "data" / "train.parquet"

    @property
    def val(self) -> Path:
        return self.root / "data" / "val.parquet"

    @property
    def model(self) -> Path:
        return self.root / "model"

    def overrides(self, out: Path, *extra: str) -> list[str]:
        """A tiny one-step run of configs/demo-cpu.yaml writing only under ``out`` (so a
        config that turned out valid trains for a second, not 200 steps); ``extra`` wins."""
        return [
            f"data.train_files=[{self.train}]",
            f"data.val_files=[{self.val}]",
            f"actor_rollout_ref.model.path={self.model}",
            "data.train_batch_size=4",
            "data.max_response_length=8",
            "actor_rollout_ref.rollout.n=2",
            "actor_rollout_ref.actor.ppo_mini_batch_size=2",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
            "trainer.total_training_steps=1",
            "trainer.val_before_train=false",
            "trainer.test_freq=1",
            "trainer.save_freq=1",
            f"trainer.default_local_dir={out}/checkpoints",
            f"ppoflow.artifact_dir={out}/runs",
            f"ppoflow.mlflow_tracking_uri=sqlite:///{out}/mlflow.db",
            "reward.num_workers=1",
            *extra,
        ]


@pytest.fixture(scope="session")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Demo:
    from stages.data.demo_task import make_demo_data
    from stages.data.tiny_model import make_tiny_model

    root = tmp_path_factory.mktemp("demo")
    make_demo_data(root / "data", n_train=32, n_val=8)
    make_tiny_model(root / "model")
    return Demo(root)


@dataclass(frozen=True)
class Finished:
    """One finished training: ``run`` (step 1 with every stage's artifact) and its checkpoint
    of step 1 under ``checkpoints``."""

    root: Path

    @property
    def run(self) -> Path:
        return self.root / "run"

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    @property
    def step(self) -> Path:
        return self.checkpoints / "global_step_1"

    @property
    def actor_weights(self) -> Path:
        return self.step / "actor" / "state" / "mp_rank_00_model_states.pt"

    def artifact(self, stage: str) -> Path:
        return self.run / "step_1" / stage

    @property
    def dirs(self) -> tuple[Path, Path]:
        """What a failing command must leave as it was: the run and its checkpoints."""
        return self.run, self.checkpoints


@pytest.fixture(scope="session")
def finished(demo: Demo, tmp_path_factory: pytest.TempPathFactory, prefect_harness) -> Finished:
    """One GRPO step of the tiny model trained by the train flow, checkpointed (about 8 s)."""
    from flows.train import train

    root = tmp_path_factory.mktemp("finished")
    train(REPO / "configs" / "demo-cpu.yaml", demo.overrides(root), str(root / "run"))
    return Finished(root)


# --- the docs table ----------------------------------------------------------------------------

TABLE_START = "<!-- bad-inputs table: generated by tests/bad_inputs (conftest.py) -->"
TABLE_END = "<!-- end of the bad-inputs table -->"
#: how the table marks a test that runs only with ``-m slow`` (a rollout)
SLOW = " (slow)"
TABLE_HEAD = "| input | what ppoflow says | exit | test |\n|---|---|---|---|"


def table_rows(text: str) -> dict[str, tuple[str, str, int, bool]]:
    """The rows of docs/bad-inputs.md's table: test id → (input, line, exit status, slow)."""
    body = text.split(TABLE_START, 1)[-1].split(TABLE_END, 1)[0]
    rows: dict[str, tuple[str, str, int, bool]] = {}
    for line in body.splitlines():
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]
        if len(cells) == 4 and cells[3].startswith("`test_"):
            name, slow = cells[3].split("`")[1], cells[3].endswith(SLOW)
            rows[name] = (cells[0], cells[1].strip("` "), int(cells[2]), slow)
    return rows


def normalize(line: str, basetemp: Path) -> str:
    """A recorded line without this machine's paths: the session's temp directories become
    ``…``, the repository ``.``; table cells escape ``|``."""
    line = re.sub(rf"{re.escape(str(basetemp))}/[^/\s'\"]+", "…", line)
    line = line.replace(str(REPO), ".")
    return line.replace("|", "\\|")


def write_table(rows: dict[str, tuple[str, str, int, bool]]) -> None:
    """Replace the table between the markers of docs/bad-inputs.md, rows in test order."""
    text = TABLE_DOC.read_text(encoding="utf-8")
    head, rest = text.split(TABLE_START, 1)
    tail = rest.split(TABLE_END, 1)[1]
    lines = [  # a double-backtick code span may hold the backticks of a line
        f"| {i} | `` {line} `` | {code} | `{name}`{SLOW if slow else ''} |"
        for name, (i, line, code, slow) in rows.items()
    ]
    body = "\n".join([TABLE_HEAD, *lines])
    TABLE_DOC.write_text(f"{head}{TABLE_START}\n{body}\n{TABLE_END}{tail}", encoding="utf-8")


@pytest.fixture
def docs_table() -> Any:
    """``.rows``: docs/bad-inputs.md's table (test id → input, line, exit status);
    ``.collected``: the test ids collected under tests/bad_inputs in this session."""

    class Table:
        rows = table_rows(TABLE_DOC.read_text(encoding="utf-8"))
        collected = frozenset(COLLECTED)

    return Table


def pytest_sessionfinish(session: pytest.Session) -> None:
    """With ``PPOFLOW_BAD_INPUTS_TABLE=1``: the rows of the tests that ran replaced by what
    they printed, the rows of tests that no longer exist (in a module collected) dropped, the
    others kept (a run of a few tests updates those few)."""
    if os.environ.get("PPOFLOW_BAD_INPUTS_TABLE") != "1" or not RECORDED:
        return
    basetemp = session.config._tmp_path_factory.getbasetemp()  # type: ignore[attr-defined]
    rows = table_rows(TABLE_DOC.read_text(encoding="utf-8"))
    for name, (described, line, code, slow) in RECORDED.items():
        rows[name] = (described, normalize(line, basetemp), code, slow)
    modules = {name.split("::")[0] for name in COLLECTED}
    kept = [name for name in rows if name in COLLECTED or name.split("::")[0] not in modules]
    write_table({name: rows[name] for name in sorted(kept, key=lambda n: (n.split("::")[0], n))})
