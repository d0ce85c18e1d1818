"""The rollout's cache key covers the tool config's contents and the tool classes' code."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from flows.cache.keys import code_part, files_part
from stages.config import load_config
from stages.rollout import ROLLOUT_STAGE

REPO = Path(__file__).resolve().parents[2]
TOOL_SOURCE = """
from stages.agent.tool_api import BaseTool, ToolResponse


class EchoTool(BaseTool):
    async def execute(self, instance_id, parameters, **kwargs):
        return ToolResponse(text=str(parameters)), None, {}
"""
TOOLS_YAML = """
tools:
  - class_name: {module}.EchoTool
    config: {{type: native}}
    tool_schema: {{type: function, function: {{name: echo, description: echo it, parameters: {{type: object, properties: {{}}, required: []}}}}}}
"""


@pytest.fixture
def user_tool(tmp_path, monkeypatch):
    module = "ppoflow_test_echo_tool"
    (tmp_path / f"{module}.py").write_text(TOOL_SOURCE)
    (tmp_path / "tools.yaml").write_text(TOOLS_YAML.format(module=module))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path, module
    sys.modules.pop(module, None)


def test_editing_a_tool_class_or_the_tool_config_changes_the_rollout_key(user_tool):
    root, module = user_tool
    config = load_config(
        REPO / "configs" / "demo-cpu.yaml",
        [f"actor_rollout_ref.rollout.multi_turn.tool_config_path={root / 'tools.yaml'}"],
    )
    plain = load_config(REPO / "configs" / "demo-cpu.yaml", [])
    code, files = code_part(ROLLOUT_STAGE, config), files_part(ROLLOUT_STAGE, config)
    assert code != code_part(ROLLOUT_STAGE, plain)  # the tool's module is part of the code
    (root / f"{module}.py").write_text(TOOL_SOURCE + "\n# edited\n")
    assert code_part(ROLLOUT_STAGE, config) != code
    (root / "tools.yaml").write_text((root / "tools.yaml").read_text() + "\n# edited\n")
    assert files_part(ROLLOUT_STAGE, config) != files
