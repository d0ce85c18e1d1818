"""Prefect's temporary server, started by the command line ahead of everything else.

Without a configured server (``PREFECT_API_URL``) Prefect starts a temporary one the first time a
flow needs its API: the calling process imports Prefect's whole server package (FastAPI, the
database layer, every route: seconds of CPU) only to launch
``python -m uvicorn --factory prefect.server.api.server:create_app`` in a subprocess, then waits
for the subprocess to import the same package, migrate its database and answer ``/api/health``.
Both happen before the flow's first line, one after the other (bench/README.md has the figures).

``ppoflow train`` and ``ppoflow resume`` launch that same server command first
(:func:`start_ahead`), before torch, transformers or Prefect are imported, and point this process
at it through ``PREFECT_API_URL`` — Prefect reads its settings when it is first imported, so the
variable must be in the environment by then. The server then comes up on the other core while
the trainer imports and opens the run, and the flow waits for its health check only when it needs
the API (:meth:`TemporaryServer.wait_ready`). A daemon thread watches each launch: it notes when
the server first answers and then sends a few read-only requests (:data:`WARM_UP`), so the lazy
set-up of the server's first API calls is done before the flow run's first call. It is stopped
when the interpreter exits, after Prefect's own exit handlers have sent their last logs and events
to it (registered first, so it runs last). It also ends when this process ends any other way
(``kill -9``, the OOM killer): it holds the read end of a pipe whose write end only this process
holds, and ends at its end-of-file (flows/process/lifeline.py). It runs in a session of its
own, so a stop sent to the run's process group (Ctrl-C on a terminal, ``kill -TERM -PGID``)
reaches only the training process, which stops the run while the server can still record it,
then stops the server. While a run uses it, its death or silence stops the run with one line
(flows/process/server_guard.py).

Ahead only where that is exact: no server configured, nothing in the process has imported Prefect
yet, and the Prefect server is installed. Otherwise Prefect's own path runs as before. The run's
own code tells this server from a configured one by :data:`OWN_SERVER` (nobody reads its logs,
so the flow's INFO lines are not sent: ``flows/cli/train.py`` ``has_prefect_server``).
"""

from __future__ import annotations

import atexit
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from flows.process.lifeline import Lifeline
from flows.process.service_waits import PREFECT_STARTUP, startup_timeout_line

#: set to the API URL of the server :func:`start_ahead` started (also seen by child processes)
OWN_SERVER = "PPOFLOW_TEMPORARY_PREFECT_API_URL"
#: what Prefect sets for its temporary server's subprocess: no UI, the ephemeral service set
SERVER_ENV = {
    "PREFECT_UI_ENABLED": "0",
    "PREFECT__SERVER_EPHEMERAL": "1",
    "PREFECT__SERVER_FINAL": "1",
}
#: the temporary server's defaults here (the environment's values win): its task runs are
#: recorded in batches of up to 200 events, written at Prefect's own flush interval (5 s) instead
#: of one write per event, and the event persister (the UI's event feed) and the triggers
#: (automations) do not run, as a server without a UI that ends with its run has neither; its CPU
#: beside a training is in bench/README.md ("Side processes").
SERVER_DEFAULTS = {
    "PREFECT_SERVER_SERVICES_TASK_RUN_RECORDER_BATCH_SIZE": "200",
    "PREFECT_SERVER_SERVICES_EVENT_PERSISTER_ENABLED": "false",
    "PREFECT_SERVER_SERVICES_TRIGGERS_ENABLED": "false",
}


def server_environment(env: dict[str, str]) -> dict[str, str]:
    """The temporary server's environment: :data:`SERVER_DEFAULTS` unless ``env`` sets them,
    ``env``, then :data:`SERVER_ENV`.

    >>> server_environment({"PREFECT_SERVER_SERVICES_TRIGGERS_ENABLED": "true"})[
    ...     "PREFECT_SERVER_SERVICES_TRIGGERS_ENABLED"]
    'true'
    >>> server_environment({})["PREFECT_SERVER_SERVICES_EVENT_PERSISTER_ENABLED"]
    'false'
    """
    return {**SERVER_DEFAULTS, **env, **SERVER_ENV}


#: uvicorn's exit status when its port was taken meanwhile (Prefect retries on it too)
PORT_TAKEN = 3
#: how long :meth:`TemporaryServer.stop` waits for a graceful exit before it kills
STOP_GRACE_S = 5.0
#: read-only requests sent once the server is healthy: the first API calls after its start do
#: lazy set-up (the database engine, the routes' models) that the
#: flow run's first calls (the API-version check, creating the flow) would otherwise wait for
WARM_UP = (
    ("GET", "/admin/version", None),
    ("POST", "/flows/filter", b'{"limit": 1}'),
    ("POST", "/flow_runs/filter", b'{"limit": 1}'),
)


def create_app() -> Any:
    """Prefect's server app, as ``prefect.server.api.server:create_app`` builds it for uvicorn's
    factory; then the cyclic garbage collector, which the server's command line held off while
    uvicorn, FastAPI, SQLAlchemy and Prefect's routes were imported, is turned on again with
    those objects frozen (flows/process/start_up_gc.py)."""
    from prefect.server.api.server import create_app as prefect_create_app

    from flows.process.start_up_gc import resume

    app = prefect_create_app()
    resume()
    return app


def free_port() -> int:
    """A TCP port on 127.0.0.1 that the OS reports free now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class TemporaryServer:
    """One Prefect server subprocess on 127.0.0.1, its output in ``log_path``."""

    def __init__(self, log_path: str | None = None) -> None:
        if log_path is None:
            handle, log_path = tempfile.mkstemp(prefix="ppoflow-prefect-server-", suffix=".log")
            os.close(handle)
        self.log_path = log_path
        self.began = time.perf_counter()
        self.ready_after: float | None = None  # seconds from launch to the first healthy answer
        self.process: subprocess.Popen | None = None
        self.port = 0
        self._lifeline: Lifeline | None = None  # the pipe the process ends with (lifeline.py)
        #: the Prefect settings a flow run uses against it (:func:`own_server_settings`)
        self.client_settings: Any = None
        self._healthy_after: dict[int, float] = {}  # port → when the watcher first saw it healthy
        self._launch()

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/api"

    def _launch(self) -> None:
        """Launch on a port free now; when this process points at this server (:func:`start_ahead`),
        its variables follow a relaunch onto a new port (:func:`own_server_settings` hands the new
        URL to Prefect, which read the old one when it was imported)."""
        pointed_here = self.port and os.environ.get(OWN_SERVER) == self.api_url
        self.port = free_port()
        if pointed_here:
            os.environ["PREFECT_API_URL"] = os.environ[OWN_SERVER] = self.api_url
        env = {k: v for k, v in os.environ.items() if k not in ("PREFECT_API_URL", OWN_SERVER)}
        if self._lifeline is not None:  # a relaunch: the previous process has exited
            self._lifeline.cut()
        self._lifeline = lifeline = Lifeline()
        try:
            with open(self.log_path, "ab") as log:
                self.process = subprocess.Popen(
                    self.command(),
                    env=lifeline.child_env(server_environment(env)),
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    pass_fds=lifeline.pass_fds,
                    start_new_session=True,  # out of the run's process group (module docstring)
                )
        except BaseException:
            lifeline.cut()
            raise
        lifeline.started()
        threading.Thread(
            target=self._watch, args=(self.process, self.port), name="prefect-server-watch",
            daemon=True,
        ).start()  # fmt: skip

    def _watch(self, process: subprocess.Popen, port: int) -> None:
        """Beside the caller (a daemon thread per launch): note when the server on ``port``
        first answers its health check, then warm it up (:data:`WARM_UP`), so the run's first
        API calls find it ready. Ends when that process exits or the server was stopped."""
        while process.poll() is None and self.process is process:
            if self._healthy(port):
                self._healthy_after[port] = time.perf_counter() - self.began
                for method, path, body in WARM_UP:
                    self._ask(port, method, path, body)
                return
            time.sleep(0.05)

    def command(self) -> list[str]:
        """The server's command line: Prefect's own for its temporary server (uvicorn with
        Prefect's app factory), on :attr:`port`, with the cyclic garbage collector off until the
        app is built (:func:`create_app`), ending when this process ends (its first call:
        flows/process/lifeline.py)."""
        return [
            sys.executable,
            "-c",
            "from flows.process.lifeline import watch; watch(); "
            "from flows.process.start_up_gc import pause; pause(); "
            "from uvicorn.main import main; main()",
            "--factory",
            f"{__name__}:create_app",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--log-level",
            "error",
            "--lifespan",
            "on",
        ]

    def wait_ready(self, timeout_s: float | None = None) -> float:
        """Block until ``/api/health`` answers 200; returns the seconds from launch to then.

        Raises:
            RuntimeError: the server exited first (its output's last lines in the message), or
                did not answer within ``timeout_s`` (default ``PREFECT_SERVER_EPHEMERAL_STARTUP_
                TIMEOUT_SECONDS``, as for Prefect's own temporary server).
        """
        if self.ready_after is not None:
            return self.ready_after
        if timeout_s is None:
            timeout_s = float(os.environ.get(PREFECT_STARTUP, "20"))
        # counted from this call, not the launch: the run may have been opening meanwhile
        deadline = time.perf_counter() + timeout_s
        while True:
            code = self.process.poll()
            if code == PORT_TAKEN:
                self._launch()
            elif code is not None:
                raise RuntimeError(
                    f"Prefect's temporary server exited with status {code} before answering: "
                    f"{self.output_tail()} (its output: {self.log_path})"
                )
            elif self._healthy(self.port):
                now = time.perf_counter() - self.began
                self.ready_after = self._healthy_after.get(self.port, now)
                return self.ready_after
            if time.perf_counter() > deadline:
                self.stop()
                raise RuntimeError(startup_timeout_line(timeout_s))
            time.sleep(0.05)

    def _healthy(self, port: int) -> bool:
        return self._ask(port, "GET", "/health") == 200

    @staticmethod
    def _ask(port: int, method: str, path: str, body: bytes | None = None) -> int | None:
        """One request to the API on ``port``: its HTTP status, or None when it did not answer."""
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/api{path}",
            data=body,
            method=method,
            headers={"Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return response.status
        except urllib.error.HTTPError as err:
            return err.code
        except (urllib.error.URLError, OSError):
            return None

    def output_tail(self, lines: int = 3) -> str:
        text = Path(self.log_path).read_text(errors="replace").strip().splitlines()
        return " | ".join(line.strip() for line in text[-lines:]) or "no output"

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after :data:`STOP_GRACE_S`; the log file is removed when empty.
        Idempotent."""
        process, self.process = self.process, None
        if process is not None and process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if self._lifeline is not None:
            self._lifeline.cut()
            self._lifeline = None
        log = Path(self.log_path)
        if log.exists() and log.stat().st_size == 0:
            log.unlink()


#: the server :func:`start_ahead` started in this process
_started: list[TemporaryServer] = []


def can_start_ahead() -> bool:
    """No server configured, Prefect not imported yet in this process, temporary servers
    allowed (``PREFECT_SERVER_EPHEMERAL_ENABLED``), and Prefect's server installed."""
    if os.environ.get("PREFECT_API_URL") or "prefect" in sys.modules:
        return False
    if os.environ.get("PREFECT_SERVER_EPHEMERAL_ENABLED", "").lower() in ("0", "false"):
        return False  # the user wants no temporary server
    if _profile_api_url():
        return False
    from importlib.util import find_spec

    return find_spec("uvicorn") is not None and find_spec("prefect") is not None


def _profile_api_url() -> bool:
    """Whether Prefect's profiles file sets an API URL in any profile (read as text, so any
    mention counts and Prefect's own path decides: importing Prefect to ask which profile is
    active would cost the start this module saves)."""
    home = Path(os.environ.get("PREFECT_HOME", "~/.prefect")).expanduser()
    profiles = Path(os.environ.get("PREFECT_PROFILES_PATH", home / "profiles.toml"))
    try:
        return "PREFECT_API_URL" in profiles.read_text()
    except OSError:
        return False


def start_ahead() -> TemporaryServer | None:
    """Launch the temporary server and point this process (and its children) at it, when
    :func:`can_start_ahead`; returns it (or the one already started), else None."""
    if _started:
        return _started[0]
    if not can_start_ahead():
        return None
    server = TemporaryServer()
    os.environ["PREFECT_API_URL"] = server.api_url
    os.environ[OWN_SERVER] = server.api_url
    atexit.register(server.stop)  # first registered, so after Prefect's own exit handlers
    _started.append(server)
    return server


#: the commands that run a Prefect flow from its start, where starting the server ahead pays
FLOW_COMMANDS = ("train", "resume")


def is_flow_command(args: list[str]) -> bool:
    """Whether the command line ``args`` run one of :data:`FLOW_COMMANDS` (not its ``--help``).

    >>> is_flow_command(["train", "configs/demo-cpu.yaml"]), is_flow_command(["train", "--help"])
    (True, False)
    """
    return bool(args) and args[0] in FLOW_COMMANDS and not {"--help", "-h"} & set(args)


def start_ahead_for(args: list[str]) -> TemporaryServer | None:
    """:func:`start_ahead` when the command line ``args`` run a flow (:func:`is_flow_command`)."""
    return start_ahead() if is_flow_command(args) else None


def started_ahead() -> TemporaryServer | None:
    """The server :func:`start_ahead` started in this process, if any."""
    return _started[0] if _started else None


@contextmanager
def own_server_settings() -> Iterator[None]:
    """Inside, flow runs talk to the server :func:`start_ahead` started, at its current URL (a
    port taken meanwhile moves it, after Prefect read ``PREFECT_API_URL``), and send it no
    heartbeats. A heartbeat lets a lasting server mark a run that stopped answering as crashed;
    this server ends with the process, so nobody reads them, and the end of each flow run waits
    for the heartbeat thread's 1 s sleep. With a
    configured server, or Prefect's own temporary one, Prefect's settings stand."""
    server = started_ahead()
    if server is None:
        yield
        return
    from prefect.settings import (
        PREFECT_API_URL,
        PREFECT_FLOWS_HEARTBEAT_FREQUENCY,
        temporary_settings,
    )

    updates = {PREFECT_API_URL: server.api_url, PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}
    with temporary_settings(updates=updates) as settings:
        server.client_settings = settings  # what flows/process/server_guard.py adjusts on a loss
        try:
            yield
        finally:
            server.client_settings = None


def describe_prefect(flow_run_name: str) -> str:
    """The Prefect phase's line: ``flow run 'NAME'``, after ``temporary server up in 6.2 s
    (started ahead)`` when :func:`start_ahead` started it."""
    server = started_ahead()
    line = f"flow run {flow_run_name!r}"
    if server is None or server.ready_after is None:
        return line
    return f"temporary server up in {server.ready_after:.1f} s (started ahead), {line}"


def is_own_server(url: str | None) -> bool:
    """Whether ``url`` is the API of a temporary server a ppoflow command started."""
    return bool(url) and url == os.environ.get(OWN_SERVER)


__all__ = [
    "FLOW_COMMANDS",
    "OWN_SERVER",
    "TemporaryServer",
    "can_start_ahead",
    "describe_prefect",
    "is_flow_command",
    "is_own_server",
    "own_server_settings",
    "start_ahead",
    "start_ahead_for",
    "started_ahead",
]
