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


def _command_paths(command, path=()):
    yield path
    for name, sub in getattr(command, "commands", {}).items():
        yield from _command_paths(sub, (*path, name))


def test_help_shows_no_type_for_flags_in_every_command_and_group():
    import typer

    paths = list(_command_paths(typer.main.get_command(app)))
    assert ("config", "show") in paths and ("train",) in paths
    for path in paths:
        result = CliRunner().invoke(app, [*path, "--help"], terminal_width=100)
        assert result.exit_code == 0, (path, result.output)
        assert "--help" in result.output
        assert "<bool>" not in result.output, (path, result.output)
    train_help = CliRunner().invoke(app, ["train", "--help"], terminal_width=100).output
    assert "<str>" in train_help  # options that take a value still show their type
