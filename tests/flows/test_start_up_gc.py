"""flows/process/start_up_gc.py: the cyclic collector off while a process starts, on again with the
start-up's objects frozen — in the trainer (the first step), in Prefect's server (its app built)
and in the MLflow process (its logger built)."""

from __future__ import annotations

import gc
import os
import sys
import types
from multiprocessing.connection import Connection

import pytest

from flows.process import start_up_gc
from flows.process.prefect_server import create_app
from flows.process.startup import Startup
from flows.sinks import mlflow_process


@pytest.fixture(autouse=True)
def collector_restored():
    """Each test starts with the collector on, nothing frozen and nothing paused, and leaves it
    so."""
    assert gc.isenabled() and not start_up_gc.is_paused()
    gc.unfreeze()
    yield
    start_up_gc.resume()
    gc.unfreeze()
    gc.enable()


def test_paused_until_resumed_then_the_objects_so_far_are_frozen():
    start_up_gc.pause()
    assert not gc.isenabled() and start_up_gc.is_paused()
    kept = [object() for _ in range(10)]
    assert gc.get_freeze_count() == 0
    start_up_gc.resume()
    assert gc.isenabled() and not start_up_gc.is_paused()
    assert gc.get_freeze_count() >= len(gc.get_objects()) // 2  # the start-up's objects
    start_up_gc.resume()  # a second call changes nothing
    assert gc.isenabled() and kept


def test_a_process_that_did_not_pause_is_left_as_it_is():
    start_up_gc.resume()
    assert gc.isenabled() and gc.get_freeze_count() == 0
    gc.disable()  # turned off by someone else: not this module's to turn on
    try:
        start_up_gc.pause()
        start_up_gc.resume()
        assert not gc.isenabled() and gc.get_freeze_count() == 0
    finally:
        gc.enable()


def test_the_first_step_turns_the_collector_back_on():
    start_up_gc.pause()
    startup = Startup()
    startup.begin("model", "loading")
    startup.end("loaded")
    assert not gc.isenabled()
    startup.ready()
    assert gc.isenabled() and gc.get_freeze_count() > 0


def test_prefect_servers_app_is_built_with_the_collector_off_then_it_is_on(monkeypatch):
    seen = []
    server_module = types.ModuleType("prefect.server.api.server")
    server_module.create_app = lambda: seen.append(gc.isenabled()) or "the app"
    monkeypatch.setitem(sys.modules, "prefect.server.api.server", server_module)
    start_up_gc.pause()  # what the server's command line does first
    assert create_app() == "the app"
    assert seen == [False] and gc.isenabled() and gc.get_freeze_count() > 0


def test_the_mlflow_process_builds_its_logger_with_the_collector_off_then_it_is_on(monkeypatch):
    """``serve`` (the process's main) run here: the settings and ``close`` already in its pipe, a
    stand-in logger that notes the collector's state while it is built and when it is closed."""
    seen = {}

    class Logger:
        def close(self) -> None:
            seen["close"] = gc.isenabled()

    def build(logger_class, settings):
        seen["build"] = gc.isenabled()
        return Logger()

    class Ended(Exception):
        pass

    def end_now() -> None:
        raise Ended

    monkeypatch.setattr(mlflow_process.signal, "signal", lambda *args: None)
    monkeypatch.setattr(mlflow_process, "_import_logger", lambda: Logger)
    monkeypatch.setattr(mlflow_process, "_build_ahead", build)
    monkeypatch.setattr(mlflow_process, "_exit_now", end_now)
    request_read, request_write = os.pipe()
    reply_read, reply_write = os.pipe()
    requests = Connection(request_write, readable=False)
    requests.send({"output": None, "logger": {}})
    requests.send(("close", ()))
    replies = Connection(reply_read, writable=False)
    with pytest.raises(Ended):
        mlflow_process.serve(request_read, reply_write)
    assert seen == {"build": False, "close": True}
    assert gc.isenabled() and gc.get_freeze_count() > 0
    assert replies.poll(5)
    requests.close()
    replies.close()
