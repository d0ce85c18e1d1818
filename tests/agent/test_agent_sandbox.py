"""The tool sandbox: every fault a tool can have is that call's result, and the run goes on.

Each named fault — a hang, a raise, ``os._exit``, a non-response, 100 MB of text, metrics over
the wire's bound, a socket, an allocation past ``memory_mb``, 10 MB of prints — is run through
one shared sandbox and answered in the same order as the calls; a call after it still works.
Calls the sandbox answers without a process (unknown tool, arguments that are not a JSON
object), a class that cannot be loaded (one line at start), a process per call and concurrency
are checked as well. No test asserts a wall time: overlap is read from the times the tool itself
recorded; the ``timeout`` marks only keep a broken implementation from hanging the suite.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from stages.agent.sandbox import ToolCall, ToolResult, ToolSandbox, ToolStartupError
from stages.agent.tool_config import ToolSpec, load_tool_config
from stages.reward.zygote import NETWORK_OFF_MESSAGE

HERE = str(Path(__file__).parent)
HELPERS = "agent_tools_for_tests"
MEMORY_MB = 256
TIMEOUT_S = 1.0
FAULT_TOOLS = ("Hang", "Raise", "Exit", "NonString", "Huge", "BigMetrics", "Connect", "Allocate")
FAULT_TOOLS += ("Chatty", "Pid", "Sleep", "SyncEcho", "AsyncEcho")

pytestmark = pytest.mark.timeout(60)


def spec(name: str, class_name: str, **config) -> ToolSpec:
    schema = {"type": "function", "function": {"name": name, "description": name}}
    return ToolSpec(name, class_name, {"type": "native", **config}, schema, f"test: {name}")


def helper_specs(*names: str) -> list[ToolSpec]:
    return [spec(name.lower(), f"{HELPERS}.{name}") for name in names]


def calls(name: str, n: int = 1, **arguments) -> list[ToolCall]:
    return [ToolCall(name.lower(), json.dumps(arguments)) for _ in range(n)]


@pytest.fixture(scope="module")
def helpers_importable():
    """The zygote copies this process's ``sys.path``: the helper module is importable there."""
    sys.path.insert(0, HERE)
    yield
    sys.path.remove(HERE)


@pytest.fixture(scope="module")
def sandbox(helpers_importable):
    gsm8k = spec("calc_gsm8k_reward", "verl.tools.gsm8k_tool.Gsm8kTool")
    python = spec("code_interpreter", "stages.agent.tools.python_exec.PythonExecTool")
    with ToolSandbox(
        [*helper_specs(*FAULT_TOOLS), gsm8k, python],
        num_workers=4,
        timeout_s=TIMEOUT_S,
        memory_mb=MEMORY_MB,
        output_bytes=1 << 20,
    ) as box:
        yield box


def run_one(sandbox: ToolSandbox, call: ToolCall) -> ToolResult:
    (result,) = sandbox.run([call])
    return result


def still_works(sandbox: ToolSandbox) -> None:
    result = run_one(sandbox, ToolCall("syncecho", '{"text": "ok"}', {"tag": ">"}))
    assert (result.status, result.text, result.reward) == ("ok", ">ok", 0.5)


# --- faults -----------------------------------------------------------------------------------


def test_hang_times_out_and_the_worker_is_replaced(sandbox):
    before_pids, before_restarts = set(sandbox.worker_pids), sandbox.restarts
    results = sandbox.run([*calls("Hang"), *calls("SyncEcho", 2, text="x")])
    hang = results[0]
    assert hang.status == "timeout"
    assert hang.text == "Error when executing tool: timed out after 1 s"
    assert (hang.reward, hang.seconds) == (None, TIMEOUT_S)
    assert "worker killed and replaced" in hang.message
    assert [r.text for r in results[1:]] == ["x", "x"]  # not held up by the hang
    assert sandbox.restarts >= before_restarts + 3
    assert len(before_pids - set(sandbox.worker_pids)) >= 3  # the three that ran, the hung one too
    still_works(sandbox)


def test_raise_is_the_calls_error_in_verls_wording(sandbox):
    result = run_one(sandbox, calls("Raise", x=1)[0])
    assert (result.status, result.reward) == ("error", None)
    assert result.text == "Error when executing tool: bad input 1"
    assert result.message.startswith("ValueError: bad input 1 (at ")
    still_works(sandbox)


def test_exit_kills_only_its_call(sandbox):
    result = run_one(sandbox, calls("Exit")[0])
    assert (result.status, result.reward) == ("error", None)
    assert result.text.startswith("Error when executing tool: ")
    assert "exit code 3" in result.text
    still_works(sandbox)


def test_non_string_result_is_an_error_naming_the_type(sandbox):
    result = run_one(sandbox, calls("NonString")[0])
    assert result.status == "error"
    assert "execute() returned a list ([1, 2, 3])" in result.text


def test_100_mb_result_is_invalid_not_a_crash(sandbox):
    result = run_one(sandbox, calls("Huge", megabytes=100)[0])
    assert (result.status, result.reward) == ("invalid", None)
    assert "104857600 characters, over the bound" in result.text
    still_works(sandbox)


def test_result_over_the_wire_bound_is_invalid(sandbox):
    result = run_one(sandbox, calls("BigMetrics", megabytes=5)[0])
    assert result.status == "invalid"
    assert "over the 4194304-byte bound" in result.text
    still_works(sandbox)


def test_socket_is_refused(sandbox):
    assert sandbox.network_isolation in ("namespace", "audit-hook")
    with socket.create_server(("127.0.0.1", 0)) as server:
        server.settimeout(0.2)
        port = server.getsockname()[1]
        result = run_one(sandbox, calls("Connect", host="127.0.0.1", port=port)[0])
        with pytest.raises(TimeoutError):
            server.accept()  # nothing reached the driver's loopback
    assert result.status == "error"
    expected = "Network is unreachable" if sandbox.network_isolation == "namespace" else "off"
    assert expected in result.text


def test_allow_network_lets_the_socket_through(helpers_importable):
    with (
        socket.create_server(("127.0.0.1", 0)) as server,
        ToolSandbox(helper_specs("Connect"), num_workers=1, allow_network=True) as box,
    ):
        port = server.getsockname()[1]
        result = run_one(box, calls("Connect", host="127.0.0.1", port=port)[0])
        assert box.network_isolation is None
    assert (result.status, result.text) == ("ok", "connected")


def test_audit_hook_refuses_sockets_where_namespaces_are_not_allowed():
    """The fallback, on its own: after ``refuse_network`` a connect and a lookup raise."""
    probe = textwrap.dedent(f"""\
        import socket
        from stages.reward.zygote import refuse_network
        refuse_network()
        for attempt in (lambda: socket.create_connection(("127.0.0.1", 9)),
                        lambda: socket.getaddrinfo("localhost", 80)):
            try:
                attempt()
            except PermissionError as exc:
                assert str(exc) == {NETWORK_OFF_MESSAGE!r}, exc
            else:
                raise SystemExit("not refused")
        a, b = socket.socketpair()  # a connected pair in the process stays usable
        a.send(b"x"); assert b.recv(1) == b"x"
        print("refused")
    """)
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=30, cwd=HERE
    )
    assert done.stdout.strip() == "refused", done.stderr


def test_allocation_past_memory_mb_is_an_error(sandbox):
    result = run_one(sandbox, calls("Allocate", megabytes=2 * MEMORY_MB)[0])
    assert (result.status, result.reward) == ("error", None)
    assert result.text == (
        f"Error when executing tool: out of memory (the tool sandbox allows {MEMORY_MB} MiB per call)"
    )
    small = run_one(sandbox, calls("Allocate", megabytes=16)[0])
    assert (small.status, small.text) == ("ok", f"allocated {16 << 20}")


def test_printing_10_mb_is_capped(sandbox, capfd):
    before = sandbox.output_dropped_total
    result = run_one(sandbox, calls("Chatty", megabytes=10)[0])
    assert (result.status, result.text) == ("ok", "printed")
    assert sandbox.output_dropped_total - before >= (10 << 20) - (1 << 20)
    out, err = capfd.readouterr()
    assert len(out) <= 1 << 20
    assert "dropped" in err


# --- answered without a process ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("call", "status", "text"),
    [
        (ToolCall("nope", "{}"), "unknown_tool", "Error when executing tool: 'nope'"),
        (
            ToolCall("syncecho", '{"text": '),
            "bad_arguments",
            "Error when executing tool: Expecting value: line 1 column 10 (char 9)",
        ),
        (
            ToolCall("syncecho", "[1, 2]"),
            "bad_arguments",
            "Error when executing tool: the arguments must be a JSON object, got list",
        ),
    ],
)
def test_calls_answered_without_a_process(sandbox, call, status, text):
    restarts = sandbox.restarts
    result = run_one(sandbox, call)
    assert (result.status, result.text, result.reward, result.seconds) == (status, text, None, 0.0)
    assert sandbox.restarts == restarts  # no process ran


def test_toolcall_checks_its_fields():
    with pytest.raises(TypeError, match="arguments is a dict; expected the JSON text"):
        ToolCall("x", {"a": 1})
    with pytest.raises(TypeError, match="create_kwargs is a list"):
        ToolCall("x", "{}", [])


# --- start-up ---------------------------------------------------------------------------------


def test_missing_class_is_one_line_at_start(tmp_path, helpers_importable):
    path = tmp_path / "tools.yaml"
    path.write_text(
        "tools:\n"
        "  - class_name: no_such_module.Tool\n"
        "    config: {type: native}\n"
        "    tool_schema: {type: function, function: {name: ghost, description: d}}\n"
    )
    specs = load_tool_config(path)  # loading imports nothing: this passes
    with pytest.raises(ToolStartupError) as err:
        ToolSandbox(specs, num_workers=1)
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith(f"{path}: tools[0]: class_name 'no_such_module.Tool': module ")
    assert "No module named 'no_such_module'" in message


def test_class_without_execute_is_one_line_at_start(helpers_importable):
    with pytest.raises(ToolStartupError, match=r"^test: noexecute: class .* lacks \['execute'\]"):
        ToolSandbox(helper_specs("NoExecute"), num_workers=1)


def test_tool_module_whose_import_hangs_is_one_line_at_start(tmp_path, monkeypatch):
    (tmp_path / "hangs_at_import.py").write_text("import time\ntime.sleep(600)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ToolStartupError) as err:
        ToolSandbox([spec("h", "hangs_at_import.Tool")], num_workers=1, startup_timeout_s=0.5)
    assert "\n" not in str(err.value)
    assert "did not finish within 0.5 s (startup_timeout_s)" in str(err.value)


# --- processes and concurrency ------------------------------------------------------------------


def test_every_call_gets_a_fresh_process(sandbox):
    results = sandbox.run(calls("Pid", 8))
    pids = [r.text.split()[0] for r in results]
    assert len(set(pids)) == 8
    assert {r.text.split()[1] for r in results} == {"1"}  # no process saw an earlier call
    assert str(os.getpid()) not in pids


def test_calls_run_concurrently_on_the_workers(sandbox):
    results = sandbox.run(calls("Sleep", 4, seconds=0.5))
    spans = [tuple(map(float, r.text.split())) for r in results]
    assert all(r.status == "ok" for r in results)
    assert max(start for start, _ in spans) < min(end for _, end in spans)  # all four overlapped


def test_mixed_batch_keeps_order_and_counts(sandbox):
    before = sandbox.counts.copy()
    batch = [
        ToolCall("calc_gsm8k_reward", '{"answer": "72"}', {"ground_truth": "72"}),
        ToolCall("nope", "{}"),
        ToolCall("code_interpreter", json.dumps({"code": "print(sum(range(10)))"})),
        *calls("Raise", x=3),
        ToolCall("calc_gsm8k_reward", '{"answer": "70"}', {"ground_truth": "72"}),
        *calls("AsyncEcho", text="a"),
    ]
    results = sandbox.run(batch)
    assert [(r.status, r.text, r.reward) for r in results] == [
        ("ok", "Current parsed answer='72' reward=1.0", 0.0),
        ("unknown_tool", "Error when executing tool: 'nope'", None),
        ("ok", "45\n", None),
        ("error", "Error when executing tool: bad input 3", None),
        ("ok", "Current parsed answer='70' reward=0.0", -0.05),
        ("ok", "async:a", None),
    ]
    assert results[0].seconds > 0
    added = sandbox.counts - before
    assert dict(added) == {"ok": 4, "unknown_tool": 1, "error": 1}


def test_close_is_final_and_removes_the_entry(helpers_importable):
    box = ToolSandbox(helper_specs("Pid"), num_workers=1)
    entry_dir = box._dir
    assert entry_dir.is_dir()
    box.close()
    box.close()
    assert box.closed and not entry_dir.exists()
    with pytest.raises(RuntimeError, match="after close"):
        box.run(calls("Pid"))


def test_specs_must_be_unique():
    with pytest.raises(ValueError, match="two tools are named 'pid'"):
        ToolSandbox(helper_specs("Pid", "Pid"))


def test_no_tools_starts_no_process_and_answers_unknown_tool():
    with ToolSandbox([]) as box:
        (result,) = box.run([ToolCall("anything", "{}")])
        assert (box.worker_pids, box.network_isolation, box.restarts) == ([], None, 0)
    assert (result.status, result.text) == ("unknown_tool", "Error when executing tool: 'anything'")
