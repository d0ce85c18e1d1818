"""Tools with verl's interface: the tool-config YAML (verl's files load as written, every
malformed file is one line naming the file, the item and what would be right), the base class,
the built-in tools (gsm8k, python_exec, lookup) and user classes, sync and async, run in this
process through :func:`stages.agent.tool_worker.run_tool_call` (the sandbox's processes are
tested in ``test_agent_sandbox.py``)."""

from __future__ import annotations

import asyncio
import sys
import textwrap
from pathlib import Path

import pytest

from stages.agent.tool_api import BaseTool, OpenAIFunctionToolSchema, ToolResponse
from stages.agent.tool_config import (
    VERL_TOOL_CLASSES,
    ToolSpec,
    check_tool_classes,
    load_tool_config,
    resolve_tool_class,
    tool_schemas,
)
from stages.agent.tool_worker import MAX_TEXT_CHARS, run_tool_call
from stages.agent.tools.gsm8k import Gsm8kTool
from stages.agent.tools.lookup import LookupTool
from stages.agent.tools.python_exec import PythonExecTool

HERE = str(Path(__file__).parent)
HELPERS = "agent_tools_for_tests"


@pytest.fixture(scope="module", autouse=True)
def helpers_importable():
    """``agent_tools_for_tests`` importable by class path, as a user's tool module would be."""
    sys.path.insert(0, HERE)
    yield
    sys.path.remove(HERE)
    sys.modules.pop(HELPERS, None)


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "tools.yaml"
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


def schema(name: str) -> dict:
    return {"type": "function", "function": {"name": name, "description": f"{name} tool"}}


def call(class_name: str, parameters: dict, config: dict | None = None, create_kwargs=None):
    return run_tool_call(
        class_name,
        {"type": "native", **(config or {})},
        schema("t"),
        parameters,
        create_kwargs or {},
    )


# --- the tool config --------------------------------------------------------------------------


def test_verl_gsm8k_config_loads_as_written(tmp_path, write_verl_gsm8k_tool_config):
    path = write_verl_gsm8k_tool_config(tmp_path / "gsm8k_tool_config.yaml")
    (spec,) = load_tool_config(path)
    assert spec.name == "calc_gsm8k_reward"
    assert spec.class_name == "verl.tools.gsm8k_tool.Gsm8kTool"
    assert spec.config == {"type": "native"}
    assert spec.schema["function"]["parameters"]["required"] == ["answer"]
    assert spec.origin == f"{path}: tools[0]"
    assert tool_schemas([spec]) == [spec.schema]
    assert resolve_tool_class(spec.class_name) is Gsm8kTool


def test_verl_sandbox_fusion_config_maps_to_python_exec(tmp_path):
    path = write(
        tmp_path,
        """\
        tools:
          - class_name: "verl.tools.sandbox_fusion_tools.SandboxFusionTool"
            config:
              sandbox_fusion_url: "https://example.invalid/run_code"
              num_workers: 10
              memory_limit_mb: 1024
              type: native
            tool_schema:
              type: "function"
              function:
                name: "code_interpreter"
                description: "A tool for executing code."
                parameters:
                  type: "object"
                  properties:
                    code: {type: "string", description: "The code to execute."}
                  required: ["code"]
        """,
    )
    (spec,) = load_tool_config(path)
    assert resolve_tool_class(spec.class_name) is PythonExecTool
    out = run_tool_call(spec.class_name, spec.config, spec.schema, {"code": "print(2**10)"}, {})
    assert (out["status"], out["text"]) == ("ok", "1024\n")


TOOL = """\
tools:
  - class_name: pkg.mod.Tool
    config: {type: native}
    tool_schema: {type: function, function: {name: a, description: d}}
"""

MALFORMED = {
    "invalid YAML": ("tools: [\n  - {", ["not valid YAML"]),
    "no tools list": ("foo: 1\n", ["expected a top-level 'tools:' list", "missing"]),
    "tools not a list": ("tools: {a: 1}\n", ["expected a top-level 'tools:' list"]),
    "empty tools": ("tools: []\n", ["one or more tools"]),
    "item not a mapping": ("tools: [just-a-string]\n", ["tools[0] is 'just-a-string'"]),
    "no class_name": (
        "tools:\n  - config: {type: native}\n    tool_schema: {function: {name: a}}\n",
        ["tools[0]: class_name is missing", "verl.tools.gsm8k_tool.Gsm8kTool"],
    ),
    "class_name not dotted": (
        TOOL.replace("pkg.mod.Tool", "Tool"),
        ["tools[0]: class_name is 'Tool'", "dotted class path"],
    ),
    "type mcp": (
        TOOL.replace("type: native", "type: mcp"),
        ["tools[0] (pkg.mod.Tool): config.type is 'mcp'", "expected 'native'"],
    ),
    "no config": (
        "tools:\n  - class_name: pkg.mod.Tool\n    tool_schema: {function: {name: a}}\n",
        ["tools[0] (pkg.mod.Tool): config is missing", "expected a mapping with type: native"],
    ),
    "no type": (
        TOOL.replace("{type: native}", "{url: x}"),
        ["tools[0] (pkg.mod.Tool): config.type is missing", "expected 'native'"],
    ),
    "config not plain": (
        TOOL.replace("{type: native}", "{type: native, since: 2024-01-01}"),
        ["config.since is a date", "plain YAML data"],
    ),
    "no tool_schema": (
        "tools:\n  - class_name: pkg.mod.Tool\n    config: {type: native}\n",
        ["tools[0] (pkg.mod.Tool): tool_schema is missing", "function.name"],
    ),
    "schema without function.name": (
        TOOL.replace("{name: a, description: d}", "{description: d}"),
        ["tool_schema.function.name is missing", "non-empty string"],
    ),
    "required not a property": (
        TOOL.replace(
            "{name: a, description: d}",
            "{name: a, parameters: {type: object, properties: {x: {type: string}}, required: [y]}}",
        ),
        ["required is ['y']", "among the properties ['x']"],
    ),
    "unknown item key": (
        TOOL + "    mcp: {}\n",
        ["tools[0] has unknown keys ['mcp']", "class_name, config, tool_schema"],
    ),
    "duplicate names": (
        TOOL + TOOL.removeprefix("tools:\n"),
        ["tools[1]: the tool name 'a' is already used by tools[0]", "unique"],
    ),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_config_is_one_line_naming_file_and_item(tmp_path, case):
    text, expected = MALFORMED[case]
    path = write(tmp_path, text)
    with pytest.raises(ValueError) as err:
        load_tool_config(path)
    message = str(err.value)
    assert "\n" not in message
    whole_file = case in {"invalid YAML", "no tools list", "tools not a list", "empty tools"}
    assert message.startswith(f"tools config {path}" if whole_file else f"{path}: tools[")
    for part in expected:
        assert part in message, (part, message)


def test_missing_file_is_one_line(tmp_path):
    with pytest.raises(ValueError, match=r"^tools config .*nope\.yaml: no such file; give a YAML"):
        load_tool_config(tmp_path / "nope.yaml")


def test_resolve_tool_class_errors_are_one_line():
    with pytest.raises(ValueError, match="is a verl tool ppoflow does not provide") as err:
        resolve_tool_class("verl.tools.search_tool.SearchTool")
    assert sorted(VERL_TOOL_CLASSES)[0] in str(err.value)
    with pytest.raises(ValueError, match=r"module 'no_such_pkg\.mod' cannot be imported"):
        resolve_tool_class("no_such_pkg.mod.Tool")
    with pytest.raises(ValueError, match=r"has no class 'Missing' \(found missing\)"):
        resolve_tool_class(f"{HELPERS}.Missing")
    assert resolve_tool_class(f"{HELPERS}.SyncEcho").__name__ == "SyncEcho"


def test_check_tool_classes_needs_the_called_methods():
    spec = ToolSpec(
        "x", f"{HELPERS}.NoExecute", {"type": "native"}, schema("x"), "t.yaml: tools[2]"
    )
    with pytest.raises(ValueError) as err:
        check_tool_classes([spec])
    assert str(err.value).startswith("t.yaml: tools[2]: class 'agent_tools_for_tests.NoExecute'")
    assert "lacks ['execute']" in str(err.value)
    good = ToolSpec("e", f"{HELPERS}.SyncEcho", {"type": "native"}, schema("e"))
    assert check_tool_classes([good]) == {good.class_name: resolve_tool_class(good.class_name)}


# --- the base class ---------------------------------------------------------------------------


def test_base_tool_defaults_follow_verl():
    tool = BaseTool({"type": "native"}, schema("base"))
    assert tool.name == "base"
    assert isinstance(tool.tool_schema, OpenAIFunctionToolSchema)
    assert tool.get_openai_tool_schema().model_dump() == schema("base")
    instance_id, response = asyncio.run(tool.create())
    assert len(instance_id) == 36 and response == ToolResponse()
    assert asyncio.run(tool.create("mine"))[0] == "mine"
    assert asyncio.run(tool.calc_reward(instance_id)) == 0.0
    assert asyncio.run(tool.release(instance_id)) is None
    assert asyncio.run(tool.execute(instance_id, {})) == (  # verl's base answer
        ToolResponse(text="Updated the tool state."),
        0.0,
        {},
    )
    with pytest.raises(ValueError, match="has no tool schema"):
        BaseTool({}, None)


# --- gsm8k ------------------------------------------------------------------------------------

GSM8K = "verl.tools.gsm8k_tool.Gsm8kTool"


@pytest.mark.parametrize(
    ("answer", "text", "reward"),
    [
        ("72", "Current parsed answer='72' reward=1.0", 0.0),
        ("#### 72", "Current parsed answer='#### 72' reward=1.0", 0.0),
        (72, "Current parsed answer='72' reward=1.0", 0.0),
        ("71", "Current parsed answer='71' reward=0.0", -0.05),
        ("no number", "Current parsed answer='no number' reward=0.0", -0.05),
    ],
)
def test_gsm8k_tool_scores_like_verl(answer, text, reward):
    out = call(GSM8K, {"answer": answer}, create_kwargs={"ground_truth": "72"})
    assert (out["status"], out["text"], out["score"], out["has_reward"]) == (
        "ok",
        text,
        reward,
        True,
    )


def test_gsm8k_tool_keeps_state_per_instance():
    tool = Gsm8kTool({"type": "native"}, schema("calc_gsm8k_reward"))

    async def session():
        a, _ = await tool.create(create_kwargs={"ground_truth": "1"})
        b, _ = await tool.create(ground_truth="2")
        first = await tool.execute(a, {"answer": "1"})
        again = await tool.execute(a, {"answer": "1"})  # no improvement on a's own last reward
        other = await tool.execute(b, {"answer": "1"})
        scores = [await tool.calc_reward(a), await tool.calc_reward(b)]
        await tool.release(a)
        return first[1], again[1], other[1], scores, sorted(tool._instance_dict) == [b]

    assert asyncio.run(session()) == (0.0, -0.05, -0.05, [1.0, 0.0], True)


def test_gsm8k_tool_without_ground_truth_scores_zero():
    out = call(GSM8K, {"answer": "3"})
    assert out["text"] == "Current parsed answer='3' reward=0.0"


# --- python_exec --------------------------------------------------------------------------------

PY = "stages.agent.tools.python_exec.PythonExecTool"


@pytest.mark.parametrize(
    ("code", "text"),
    [
        ("print(6 * 7)", "42\n"),
        ("import sys\nprint('out'); print('err', file=sys.stderr)", "out\nerr\n"),
        ("x = 1\nprint(x); 1 / 0", "1\nZeroDivisionError: division by zero"),
        ("raise KeyError('k')", "KeyError: 'k'"),
        ("print('a', end='')\nraise ValueError('v')", "a\nValueError: v"),
        ("1 +", "SyntaxError: invalid syntax"),
        ("print('bye'); exit()", "bye\n"),
        ("import sys; sys.exit(2)", "SystemExit: 2"),
        ("print(__name__, 'x' in globals())", "__main__ False\n"),
    ],
)
def test_python_exec_returns_output_then_exception_line(code, text):
    out = call(PY, {"code": code})
    assert (out["status"], out["text"], out["has_reward"]) == ("ok", text, False)


def test_python_exec_namespace_is_fresh_per_call():
    assert call(PY, {"code": "secret = 1"})["text"] == ""
    assert call(PY, {"code": "print(secret)"})["text"] == "NameError: name 'secret' is not defined"


def test_python_exec_output_is_bounded():
    out = call(PY, {"code": "print('z' * 100)"}, {"max_output_chars": 10})
    assert out["text"] == "z" * 10 + "\n…(output truncated: 91 more characters)"


def test_python_exec_refuses_other_languages_and_bad_config():
    out = call(PY, {"code": "1", "language": "cpp"})
    assert (out["status"], out["error"]) == (
        "error",
        "language 'cpp' is not supported; this tool runs python",
    )
    out = call(PY, {"code": "1"}, {"max_output_chars": 0})
    assert out["status"] == "error" and "max_output_chars is 0" in out["error"]


# --- lookup -----------------------------------------------------------------------------------

LOOKUP = "stages.agent.tools.lookup.LookupTool"


def test_lookup_answers_value_or_unknown_key():
    table = {"table": {"paris": "France", 3: 9}}
    assert call(LOOKUP, {"key": "paris"}, table)["text"] == "France"
    assert call(LOOKUP, {"key": 3}, table)["text"] == "9"
    assert call(LOOKUP, {"key": "rome"}, table)["text"] == "unknown key"
    assert call(LOOKUP, {}, table)["text"] == "unknown key"
    out = call(LOOKUP, {"key": "paris"}, {"table": ["paris"]})
    assert out["status"] == "error" and "config.table is list" in out["error"]
    assert LookupTool({"table": {}}, schema("lk")).name == "lk"


# --- user classes and results -------------------------------------------------------------------


def test_user_class_sync_duck_typed():
    out = call(f"{HELPERS}.SyncEcho", {"text": "hi"}, create_kwargs={"tag": "T:"})
    assert out | {"seconds": 0} == {
        "status": "ok",
        "score": 0.5,
        "has_reward": True,
        "text": "T:hi",
        "metrics": {"chars": 4},
        "error": "",
        "error_type": "",
        "detail": "",
        "seconds": 0,
    }


def test_user_class_async_bare_string():
    out = call(f"{HELPERS}.AsyncEcho", {"text": "hi"})
    assert (out["status"], out["text"], out["has_reward"], out["score"]) == (
        "ok",
        "async:hi",
        False,
        0.0,
    )


@pytest.mark.parametrize(
    ("tool", "parameters", "status", "error"),
    [
        ("Raise", {"x": 1}, "error", "bad input 1"),
        ("NonString", {}, "error", "execute() returned a list ([1, 2, 3]); expected (ToolResponse"),
        ("WithImage", {}, "error", "images/videos in tool responses are not supported"),
        ("BadReward", {}, "error", "returned the reward a float (nan); expected a finite number"),
        (
            "Huge",
            {"megabytes": 2},
            "invalid",
            f"2097152 characters, over the bound {MAX_TEXT_CHARS}",
        ),
    ],
)
def test_failed_calls_are_results_not_raises(tool, parameters, status, error):
    out = call(f"{HELPERS}.{tool}", parameters)
    assert out["status"] == status
    assert out["text"] == "" and out["has_reward"] is False
    assert error in out["error"], out["error"]


def test_exception_detail_names_type_and_frame():
    out = call(f"{HELPERS}.Raise", {"x": 2})
    assert out["error"] == "bad input 2"  # what verl puts after "Error when executing tool: "
    assert out["error_type"] == "ValueError"
    assert out["detail"].startswith("ValueError: bad input 2 (at ")
    assert "agent_tools_for_tests.py" in out["detail"]
