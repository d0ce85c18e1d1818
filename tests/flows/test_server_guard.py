"""A run's temporary Prefect server watched while the run uses it (flows/process/server_guard.py),
and a child process that ends with its parent (flows/process/lifeline.py).

The servers here are stand-ins (a small HTTP server answering ``/api/health``) launched through
:class:`~flows.process.prefect_server.TemporaryServer`, so the guard watches a real process that
is killed or stopped for real; the end-to-end runs are in tests/flows/test_server_loss.py."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from flows.process import server_guard
from flows.process.lifeline import LIFELINE_FD
from flows.process.prefect_server import TemporaryServer
from flows.process.server_guard import (
    DEFAULT_TIMEOUT_S,
    SIGNAL,
    TIMEOUT_VAR,
    ServerGuard,
    ServerLost,
    TimeoutSettingError,
    configured_timeout_s,
    lost_line,
    server_lost,
)
from flows.process.stop_signals import signals_deferred

REPO = Path(__file__).resolve().parents[2]
#: longer than any test here may take: a wait that returns earlier was interrupted
NEVER_S = 120.0

HEALTH_SERVER = """
import http.server, sys
class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/api/health" else 404)
        self.end_headers()
    def log_message(self, *args):
        pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Health).serve_forever()
"""


class HealthServer(TemporaryServer):
    """Answers ``/api/health`` with 200, like Prefect's server once it is up."""

    def command(self) -> list[str]:
        return [sys.executable, "-c", HEALTH_SERVER, str(self.port)]


@pytest.fixture
def server(tmp_path):
    """A stand-in server that answers, with the settings object a flow run would use."""
    server = HealthServer(str(tmp_path / "server.log"))
    server.wait_ready(timeout_s=60)
    server.client_settings = SimpleNamespace(
        client=SimpleNamespace(max_retries=5),
        logging=SimpleNamespace(to_api=SimpleNamespace(enabled=True)),
    )
    yield server
    if server.process is not None and server.process.poll() is None:
        os.kill(server.process.pid, signal.SIGCONT)
    server.stop()


@pytest.fixture(autouse=True)
def no_earlier_losses(monkeypatch):
    monkeypatch.setattr(server_guard, "_losses", [])


def test_a_server_that_dies_stops_the_main_thread_at_once(server):
    pid = server.process.pid
    began = time.monotonic()
    with pytest.raises(ServerLost) as raised, ServerGuard(server, timeout_s=NEVER_S) as guard:
        os.kill(pid, signal.SIGKILL)
        time.sleep(NEVER_S)  # interrupted: the guard saw the process end
    assert time.monotonic() - began < NEVER_S
    assert str(raised.value) == guard.lost == "exited with status -9 (killed by SIGKILL)"
    assert server_lost() == guard.lost
    # the flow run's later calls fail at once instead of being retried, and send no records
    assert server.client_settings.client.max_retries == 0
    assert server.client_settings.logging.to_api.enabled is False
    line = lost_line(guard, "/runs/r", 2)
    assert line.startswith(f"Prefect's temporary server (pid {pid}) exited with status -9")
    assert line.endswith("the checkpoint of step 2 is kept; continue with `ppoflow resume /runs/r`")


def test_a_signal_that_did_not_wake_the_main_thread_is_sent_again(server, monkeypatch):
    """The first send is taken without waking the main thread's sleep (as when it lands between
    the GIL's release and the sleep's start): the next send, :data:`RESEND_S` later, wakes it."""
    sent = []
    send = signal.pthread_kill

    def first_lost(thread_id, signum):
        sent.append(signum)
        if len(sent) > 1:
            send(thread_id, signum)

    monkeypatch.setattr(signal, "pthread_kill", first_lost)
    began = time.monotonic()
    with pytest.raises(ServerLost), ServerGuard(server, timeout_s=NEVER_S):
        os.kill(server.process.pid, signal.SIGKILL)
        time.sleep(NEVER_S)
    assert time.monotonic() - began < NEVER_S
    assert len(sent) >= 2 and set(sent) == {SIGNAL}


def test_a_server_that_stops_answering_is_killed_at_the_bound_and_named(server):
    process = server.process
    with pytest.raises(ServerLost), ServerGuard(server, timeout_s=1.0, probe_s=0.2) as guard:
        os.kill(process.pid, signal.SIGSTOP)  # alive, but it answers nothing any more
        time.sleep(NEVER_S)
    assert guard.silent and process.wait(timeout=30) == -signal.SIGKILL  # not left stopped
    line = lost_line(guard, "/runs/r", None)
    assert f"did not answer its health check for 1 s ({TIMEOUT_VAR}) and was killed" in line
    assert "before the first checkpoint (trainer.save_freq): nothing to resume" in line
    assert line.endswith(f"(on a loaded machine export a larger {TIMEOUT_VAR})")
    assert "\n" not in line


def test_a_server_that_answers_is_left_alone_and_the_handler_restored(server):
    before = signal.getsignal(SIGNAL)
    with ServerGuard(server, timeout_s=1.0, probe_s=0.05) as guard:
        time.sleep(1.5)  # past the bound, probed many times
    assert guard.lost is None and guard.settled() is None and server_lost() is None
    assert server.process.poll() is None
    assert signal.getsignal(SIGNAL) is before
    assert server.client_settings.client.max_retries == 5


def test_a_loss_during_a_checkpoint_waits_for_the_checkpoint(server):
    finished = []
    with pytest.raises(ServerLost), ServerGuard(server, timeout_s=NEVER_S) as guard:
        with signals_deferred():  # as around a checkpoint (flows/train.py save_checkpoint)
            os.kill(server.process.pid, signal.SIGKILL)
            deadline = time.monotonic() + 30
            while guard.lost is None and time.monotonic() < deadline:
                time.sleep(0.05)
            time.sleep(0.2)  # the signal has come by now, and is held
            finished.append(True)
        time.sleep(NEVER_S)
    assert finished == [True] and guard.lost is not None
    assert signal.getsignal(SIGNAL) != guard._on_signal  # restored after a loss too


def test_an_error_before_the_thread_saw_the_end_is_still_put_down_to_the_server(server):
    guard = ServerGuard(server, timeout_s=NEVER_S, probe_s=NEVER_S)
    guard._process, guard._pid = server.process, server.process.pid  # watched, not yet polled
    server.process.kill()
    server.process.wait()
    assert guard.settled() == "exited with status -9 (killed by SIGKILL)"


def test_a_guard_without_a_server_watches_nothing(monkeypatch):
    monkeypatch.setenv(TIMEOUT_VAR, "not a number")  # not read: there is nothing to watch
    with ServerGuard(None) as guard:
        pass
    assert guard.settled() is None


@pytest.mark.parametrize("value", ["0", "-5", "soon", "inf", "nan"])
def test_a_bad_bound_is_one_line_naming_the_variable(value):
    with pytest.raises(TimeoutSettingError) as raised:
        configured_timeout_s({TIMEOUT_VAR: value})
    message = str(raised.value)
    assert message.startswith(f"{TIMEOUT_VAR}={value!r} is not a number of seconds above 0")
    assert f"default {DEFAULT_TIMEOUT_S:g}" in message and "\n" not in message


def test_the_command_line_refuses_a_bad_bound_before_the_run_opens(monkeypatch, tmp_path):
    """With the server started ahead (a stand-in: nothing is launched), ``ppoflow train`` reads
    the bound first: a bad value is one line, exit 1, and no run directory is made."""
    from typer.testing import CliRunner

    from flows.cli.app import app
    from flows.process import prefect_server

    monkeypatch.setattr(prefect_server, "_started", [SimpleNamespace(process=None, port=0)])
    monkeypatch.setenv(TIMEOUT_VAR, "two minutes")
    result = CliRunner().invoke(app, ["train", "demo-cpu", "--run-dir", str(tmp_path / "run")])
    assert result.exit_code == 1, result.output
    assert result.output.splitlines() == [
        f"error: {TIMEOUT_VAR}='two minutes' is not a number of seconds above 0: export the "
        f"seconds a run waits for Prefect's temporary server to answer (default "
        f"{DEFAULT_TIMEOUT_S:g})"
    ]
    assert not (tmp_path / "run").exists()


def test_the_bound_defaults_and_is_read_from_the_environment():
    assert configured_timeout_s({}) == DEFAULT_TIMEOUT_S
    assert configured_timeout_s({TIMEOUT_VAR: " 7.5 "}) == 7.5


# --- the lifeline ----------------------------------------------------------------------------

#: a parent that starts a child on a lifeline, says the child's pid, and waits to be killed
PARENT = textwrap.dedent(
    """
    import subprocess, sys, time
    from flows.process.lifeline import Lifeline
    lifeline = Lifeline()
    child = subprocess.Popen(
        [sys.executable, "-c", sys.argv[1]], env=lifeline.child_env({"PYTHONPATH": sys.argv[2]}),
        pass_fds=lifeline.pass_fds, start_new_session=True,
    )
    lifeline.started()
    print(child.pid, flush=True)
    time.sleep(600)
    """
)
#: the child: watches its lifeline first, reports what its own children would inherit
CHILD = textwrap.dedent(
    f"""
    import os, sys, time
    from flows.process.lifeline import watch
    assert watch()
    assert {LIFELINE_FD!r} not in os.environ  # its own children do not watch the same pipe
    time.sleep(600)
    """
)


def running(pid: int) -> bool:
    """Whether process ``pid`` exists and has not exited (a zombie has)."""
    try:
        return "State:\tZ" not in Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False


def wait_gone(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while running(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not running(pid)


def test_a_child_on_a_lifeline_ends_when_its_parent_is_killed_outright():
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, CHILD, str(REPO)], cwd=REPO, stdout=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    child = None
    try:
        child = int(parent.stdout.readline())
        time.sleep(1.0)
        assert running(child)  # the parent lives: the child stays (its checks passed)
        parent.kill()  # SIGKILL: no handler of the parent runs
        parent.wait()
        assert wait_gone(child, 10), "the child outlived its parent"
    finally:
        parent.kill()
        parent.wait()
        if child is not None and running(child):
            os.kill(child, signal.SIGKILL)


def test_a_lifeline_that_is_cut_lets_the_child_go():
    from flows.process.lifeline import Lifeline

    lifeline = Lifeline()
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD], cwd=REPO,
        env=lifeline.child_env({**os.environ, "PYTHONPATH": str(REPO)}), pass_fds=lifeline.pass_fds,
    )  # fmt: skip
    lifeline.started()
    try:
        time.sleep(1.0)
        assert child.poll() is None
        lifeline.cut()
        assert child.wait(timeout=15) == -signal.SIGTERM  # it stopped itself as a server stops
    finally:
        child.kill()
        child.wait()


def test_a_guard_entered_outside_the_main_thread_watches_without_interrupting(server):
    seen: list[object] = []

    def in_a_thread() -> None:
        with ServerGuard(server, timeout_s=NEVER_S) as guard:
            os.kill(server.process.pid, signal.SIGKILL)
            deadline = time.monotonic() + 30
            while guard.lost is None and time.monotonic() < deadline:
                time.sleep(0.05)
            seen.append(guard.lost)

    thread = threading.Thread(target=in_a_thread)
    thread.start()
    thread.join(60)
    assert seen == ["exited with status -9 (killed by SIGKILL)"]
