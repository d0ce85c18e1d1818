"""``ppoflow config show`` / ``config defaults`` through typer's CliRunner."""

from __future__ import annotations

import typer
import yaml
from typer.testing import CliRunner

from flows import cli_config
from stages.config import load_config, render_default_yaml, validate_config


def make_app() -> typer.Typer:
    app = typer.Typer()

    @app.callback()
    def main() -> None:
        """Test app: a group, so `config` stays a sub-command."""

    cli_config.register(app)
    return app


RUNNER = CliRunner()


def test_show_prints_resolved_yaml_with_derived_comments() -> None:
    result = RUNNER.invoke(
        make_app(), ["config", "show", "--config", "grpo", "trainer.total_epochs=2"]
    )
    assert result.exit_code == 0, result.output
    assert (
        "#   use_critic: False" in result.stdout
        and "#   use_reference_policy: True" in result.stdout
    )
    shown = validate_config(yaml.safe_load(result.stdout))  # the comment block keeps it loadable
    assert shown == load_config("grpo", ["trainer.total_epochs=2"])


def test_show_defaults_without_a_config() -> None:
    result = RUNNER.invoke(make_app(), ["config", "show"])
    assert result.exit_code == 0, result.output
    assert "adv_estimator: gae" in result.stdout and "#   dp_size: 8" in result.stdout


def test_show_error_exits_2_with_the_message() -> None:
    result = RUNNER.invoke(
        make_app(), ["config", "show", "trainer.totl_epochs=3", "data.truncation=x"]
    )
    assert result.exit_code == 2
    assert "trainer.totl_epochs: unknown key; did you mean 'total_epochs'?" in result.stderr
    assert "Traceback" not in result.output


def test_show_validation_error_exits_2() -> None:
    result = RUNNER.invoke(
        make_app(), ["config", "show", "-c", "demo-cpu", "actor_rollout_ref.actor.optim.lr=-1"]
    )
    assert result.exit_code == 2
    assert "actor_rollout_ref.actor.optim.lr: got -1; must be > 0" in result.stderr


def test_show_prints_warnings_on_stderr_only() -> None:
    result = RUNNER.invoke(make_app(), ["config", "show", "algorithm.adv_estimator=grpo"])
    assert result.exit_code == 0, result.output
    assert "warning: algorithm.adv_estimator = 'grpo'" in result.stderr
    assert "#   warning: algorithm.adv_estimator" in result.stdout
    assert "warning:" not in result.stdout.replace("#   warning:", "")


def test_defaults_prints_the_rendered_yaml() -> None:
    result = RUNNER.invoke(make_app(), ["config", "defaults"])
    assert result.exit_code == 0
    assert result.stdout == render_default_yaml()
