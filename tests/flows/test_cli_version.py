"""``ppoflow --version`` and the command discovery of flows/cli/app.py."""

from __future__ import annotations

import re

from typer.testing import CliRunner

from flows.cli.app import app, command_modules
from flows.version import ppoflow_version, source_commit, version_line


def test_version_prints_the_package_version_and_commit():
    result = CliRunner().invoke(app, ["--version"])
    assert result.exit_code == 0
    assert result.output.strip() == version_line()
    assert re.fullmatch(
        r"ppoflow \d+\.\d+\.\d+( \(commit [0-9a-f]{12}(\+dirty)?\))?", version_line()
    )
    assert ppoflow_version() != "unknown"  # the tests run against the installed package
    assert source_commit() is None or re.fullmatch(r"[0-9a-f]{12}(\+dirty)?", source_commit())


def test_every_cli_module_is_registered():
    names = command_modules()
    assert "flows.cli.train" in names and "flows.cli.config" in names
    commands = {c.name for c in app.registered_commands} | {g.name for g in app.registered_groups}
    assert {"train", "rerun", "inspect", "config"} <= commands
