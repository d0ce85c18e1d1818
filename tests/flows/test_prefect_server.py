"""Prefect's temporary server started ahead by the command line (flows/process/prefect_server.py): when it
is started, that a flow runs against it, that it is gone after the process exits or is killed
outright, that it runs in a session of its own, and its failures as one line."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from flows.process import prefect_server
from flows.process.prefect_server import (
    OWN_SERVER,
    WARM_UP,
    TemporaryServer,
    can_start_ahead,
    describe_prefect,
    start_ahead_for,
)

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def prefect_not_imported(monkeypatch, tmp_path):
    """This process as the command line sees it before its imports: no server configured, no
    Prefect module, an empty Prefect home."""
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    monkeypatch.delenv("PREFECT_SERVER_EPHEMERAL_ENABLED", raising=False)
    monkeypatch.setenv("PREFECT_HOME", str(tmp_path / "prefect-home"))
    monkeypatch.delenv("PREFECT_PROFILES_PATH", raising=False)
    monkeypatch.delitem(sys.modules, "prefect", raising=False)


@pytest.mark.parametrize(
    ("args", "starts"),
    [
        (["train", "configs/demo-cpu.yaml"], True),
        (["resume", "outputs/runs/x"], True),
        (["train", "--help"], False),
        (["resume", "-h"], False),
        (["inspect", "outputs/x"], False),
        (["--version"], False),
        ([], False),
    ],
)
def test_only_training_commands_start_the_server_ahead(monkeypatch, args, starts):
    calls = []
    monkeypatch.setattr(prefect_server, "start_ahead", lambda: calls.append(1))
    start_ahead_for(args)
    assert bool(calls) is starts


def test_ahead_only_where_prefect_would_start_a_temporary_server(
    monkeypatch, tmp_path, prefect_not_imported
):
    assert can_start_ahead()
    monkeypatch.setenv("PREFECT_SERVER_EPHEMERAL_ENABLED", "false")
    assert not can_start_ahead()  # the user turned temporary servers off
    monkeypatch.delenv("PREFECT_SERVER_EPHEMERAL_ENABLED")
    monkeypatch.setenv("PREFECT_API_URL", "http://127.0.0.1:4200/api")
    assert not can_start_ahead()  # a configured server
    monkeypatch.delenv("PREFECT_API_URL")
    profiles = tmp_path / "profiles.toml"
    profiles.write_text('[profiles.work]\nPREFECT_API_URL = "http://10.0.0.5:4200/api"\n')
    monkeypatch.setenv("PREFECT_PROFILES_PATH", str(profiles))
    assert not can_start_ahead()  # a server in the profile
    monkeypatch.delenv("PREFECT_PROFILES_PATH")
    monkeypatch.setitem(sys.modules, "prefect", sys)
    assert not can_start_ahead()  # Prefect already read its settings


def test_the_servers_own_url_is_not_a_configured_server(monkeypatch):
    from flows.cli.train import has_prefect_server

    monkeypatch.setenv("PREFECT_API_URL", "http://127.0.0.1:9/api")
    monkeypatch.setenv(OWN_SERVER, "http://127.0.0.1:9/api")
    assert not has_prefect_server()
    monkeypatch.setenv(OWN_SERVER, "http://127.0.0.1:10/api")
    assert has_prefect_server()


def test_the_prefect_phase_says_how_long_the_server_took(monkeypatch):
    assert describe_prefect("brave-owl") == "flow run 'brave-owl'"
    server = TemporaryServer.__new__(TemporaryServer)
    server.ready_after = 6.24
    monkeypatch.setattr(prefect_server, "_started", [server])
    assert describe_prefect("brave-owl") == (
        "temporary server up in 6.2 s (started ahead), flow run 'brave-owl'"
    )


class ExitingServer(TemporaryServer):
    def command(self) -> list[str]:
        return [sys.executable, "-c", "import sys; print('cannot open the database'); sys.exit(5)"]


class SilentServer(TemporaryServer):
    def command(self) -> list[str]:
        return [sys.executable, "-c", "import time; time.sleep(60)"]


def test_a_server_that_exits_is_one_line_with_its_last_output(tmp_path):
    server = ExitingServer(str(tmp_path / "server.log"))
    with pytest.raises(RuntimeError) as raised:
        server.wait_ready(timeout_s=30)
    message = str(raised.value)
    assert "exited with status 5" in message and "cannot open the database" in message
    assert "\n" not in message and str(tmp_path / "server.log") in message


def test_a_server_that_does_not_answer_is_stopped_and_named(tmp_path):
    server = SilentServer(str(tmp_path / "server.log"))
    process = server.process
    with pytest.raises(RuntimeError) as raised:
        server.wait_ready(timeout_s=0.5)
    assert "did not answer within 0.5 s" in str(raised.value)
    assert process.poll() is not None  # stopped, not left behind
    assert not (tmp_path / "server.log").exists()  # it wrote nothing: no empty log left


RECORDING_SERVER = """
import http.server, sys, time
log = open(sys.argv[1], "a", buffering=1)
time.sleep(0.5)  # comes up a little after its launch, as a real server does

class Handler(http.server.BaseHTTPRequestHandler):
    def answer(self):
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length).decode()
        log.write(f"{self.command} {self.path} {body}\\n")
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"{}")
    do_GET = do_POST = answer
    def log_message(self, *args):
        pass

http.server.HTTPServer(("127.0.0.1", int(sys.argv[2])), Handler).serve_forever()
"""


class RecordingServer(TemporaryServer):
    """Answers 200 to everything and writes each request to ``<log_path>.requests``."""

    def command(self) -> list[str]:
        return [sys.executable, "-c", RECORDING_SERVER, f"{self.log_path}.requests", str(self.port)]


def test_the_server_is_watched_from_its_launch_and_warmed_up_once_healthy(tmp_path):
    server = RecordingServer(str(tmp_path / "server.log"))
    try:
        requests = tmp_path / "server.log.requests"
        deadline = time.monotonic() + 30
        # nobody called wait_ready: the watcher alone sees it come up and sends the warm-up
        while time.monotonic() < deadline and len(lines(requests)) < 1 + len(WARM_UP):
            time.sleep(0.05)
        assert lines(requests) == [
            "GET /api/health ",
            "GET /api/admin/version ",
            'POST /api/flows/filter {"limit": 1}',
            'POST /api/flow_runs/filter {"limit": 1}',
        ]
        time.sleep(0.5)
        ready = server.wait_ready(timeout_s=10)
        # the time the watcher saw it healthy (after its 0.5 s), not the time of this call
        assert 0.5 <= ready < time.perf_counter() - server.began - 0.4
    finally:
        server.stop()


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


RUN_A_FLOW = """
import os, sys
from flows.process.prefect_server import start_ahead, started_ahead
server = start_ahead()
assert server is not None and started_ahead() is server
print(server.process.pid, flush=True)
from prefect import flow  # the imports run while the server starts
server.wait_ready()
from prefect.settings import get_current_settings

@flow
def one() -> int:
    return 1

assert one() == 1
print(get_current_settings().api.url, server.api_url, flush=True)
"""


def test_a_flow_runs_against_the_server_and_the_server_ends_with_the_process(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("PREFECT_API_URL", OWN_SERVER)}
    env["PREFECT_HOME"] = str(tmp_path / "prefect-home")
    done = subprocess.run(
        [sys.executable, "-c", RUN_A_FLOW], env=env, cwd=REPO, capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    pid_line, urls = done.stdout.strip().splitlines()[-2:]
    used, started = urls.split()
    assert used == started
    deadline = time.monotonic() + 10
    while running(int(pid_line)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not running(int(pid_line))


def running(pid: int) -> bool:
    """Whether process ``pid`` exists and has not exited (a zombie waiting to be reaped has)."""
    try:
        return "State:\tZ" not in Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False


def wait_gone(pid: int, seconds: float) -> bool:
    """Whether process ``pid`` is gone within ``seconds``."""
    deadline = time.monotonic() + seconds
    while running(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not running(pid)


def test_flow_runs_send_no_heartbeats_only_to_the_servers_own(monkeypatch):
    from prefect.settings import PREFECT_API_URL, PREFECT_FLOWS_HEARTBEAT_FREQUENCY

    from flows.process.prefect_server import own_server_settings

    prefects = PREFECT_FLOWS_HEARTBEAT_FREQUENCY.value(), PREFECT_API_URL.value()
    with own_server_settings():  # no server started ahead: Prefect's settings stand
        assert (PREFECT_FLOWS_HEARTBEAT_FREQUENCY.value(), PREFECT_API_URL.value()) == prefects
    server = TemporaryServer.__new__(TemporaryServer)
    server.port = 4321
    monkeypatch.setattr(prefect_server, "_started", [server])
    with own_server_settings():
        assert PREFECT_FLOWS_HEARTBEAT_FREQUENCY.value() is None
        assert PREFECT_API_URL.value() == "http://127.0.0.1:4321/api"
    assert (PREFECT_FLOWS_HEARTBEAT_FREQUENCY.value(), PREFECT_API_URL.value()) == prefects


#: the first launch exits as uvicorn does when its port is taken; the second answers /api/health
PORT_TAKEN_THEN_SERVE = """
import http.server, sys
from pathlib import Path
marker = Path(sys.argv[1])
if not marker.exists():
    marker.write_text("launched")
    sys.exit(3)
class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/api/health" else 404)
        self.end_headers()
    def log_message(self, *args):
        pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[2])), Health).serve_forever()
"""


def test_a_port_taken_meanwhile_moves_the_server_and_the_processs_url(monkeypatch, tmp_path):
    class MovingServer(TemporaryServer):
        def command(self) -> list[str]:
            marker = tmp_path / "first-launch"
            return [sys.executable, "-c", PORT_TAKEN_THEN_SERVE, str(marker), str(self.port)]

    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    monkeypatch.delenv(OWN_SERVER, raising=False)
    server = MovingServer(str(tmp_path / "server.log"))
    monkeypatch.setenv("PREFECT_API_URL", server.api_url)  # as start_ahead points the process
    monkeypatch.setenv(OWN_SERVER, server.api_url)
    try:
        server.wait_ready(timeout_s=60)
        assert (tmp_path / "first-launch").exists()  # the first launch exited 3: relaunched
        assert os.environ["PREFECT_API_URL"] == os.environ[OWN_SERVER] == server.api_url
    finally:
        server.stop()


EXIT_HANDLERS_RUN = """
import atexit, sys
atexit.register(lambda: print("handler ran", flush=True))
sys.argv = ["ppoflow", "--version"]
from flows.cli.entry import main
main()
"""


def test_the_executable_exits_with_its_status_after_the_exit_handlers():
    done = subprocess.run(
        [sys.executable, "-c", EXIT_HANDLERS_RUN], cwd=REPO, capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.splitlines()[0].startswith("ppoflow ")
    assert done.stdout.splitlines()[-1] == "handler ran"
    failed = subprocess.run(
        [sys.executable, "-m", "flows", "inspect", "/nonexistent/run"], cwd=REPO,
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert failed.returncode != 0 and failed.stderr.strip().startswith("error:")


def test_the_server_runs_in_a_session_of_its_own(tmp_path):
    """A stop sent to the run's process group (Ctrl-C) reaches the training process only, which
    stops the run while the server still answers, then stops the server."""
    server = SilentServer(str(tmp_path / "server.log"))
    try:
        assert os.getsid(server.process.pid) == server.process.pid != os.getsid(0)
    finally:
        server.stop()


def test_the_temporary_server_ends_with_its_parent_even_while_it_starts(tmp_path):
    """The real server command: the parent is killed while the server still imports Prefect."""
    code = (
        "from flows.process.prefect_server import TemporaryServer; import time; "
        f"s = TemporaryServer({str(tmp_path / 'server.log')!r}); print(s.process.pid, flush=True); "
        "time.sleep(600)"
    )
    env = {**os.environ, "PREFECT_HOME": str(tmp_path / "prefect-home")}
    parent = subprocess.Popen(
        [sys.executable, "-c", code], cwd=REPO, env=env, stdout=subprocess.PIPE, text=True
    )
    server_pid = None
    try:
        server_pid = int(parent.stdout.readline())
        assert running(server_pid)
        parent.kill()
        parent.wait()
        assert wait_gone(server_pid, 15), "Prefect's temporary server outlived its parent"
    finally:
        parent.kill()
        parent.wait()
        if server_pid is not None and running(server_pid):
            os.kill(server_pid, signal.SIGKILL)  # not left behind when the test fails
