"""``ppoflow config show`` / ``config defaults`` through typer's CliRunner."""

from __future__ import annotations

import typer
import yaml
from typer.testing import CliRunner

from flows.cli import config as cli_config
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


def show_layout(config: str, *overrides: str):
    """``ppoflow config show --layout --config CONFIG OVERRIDES…``"""
    return RUNNER.invoke(make_app(), ["config", "show", "--layout", "--config", config, *overrides])


def test_show_layout_prints_processes_roles_and_devices() -> None:
    result = show_layout(
        "grpo",
        "ppoflow.workers.backend=ray",
        "trainer.n_gpus_per_node=4",
        "trainer.nnodes=2",
        "actor_rollout_ref.actor.use_kl_loss=true",
        "actor_rollout_ref.ref.param_offload=true",
        "actor_rollout_ref.rollout.name=hf",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
    )
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0] == (
        "8 ranks (2 nodes × 4), backend ray; colocated: every role of a rank in one process; "
        "8 rank processes, 4 GPUs per node (8 in all); each node's ranks of a group in one "
        "bundle of a STRICT_SPREAD placement group"
    )
    assert len(lines) == 9  # one per rank process
    assert lines[8] == (
        "  node 1  rank 7   GPU 3    actor (DeepSpeed ZeRO-3, rollout hf) + "
        "ref (ZeRO-3, parameters on the host)"
    )


def test_show_layout_of_roles_apart_and_of_a_refused_layout() -> None:
    apart = show_layout(
        "grpo",
        "ppoflow.workers.backend=ray",
        "trainer.n_gpus_per_node=2",
        "actor_rollout_ref.actor.use_kl_loss=true",
        "ppoflow.workers.colocate=false",
        "actor_rollout_ref.rollout.name=hf",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
    )
    assert apart.exit_code == 0, apart.output
    assert [line.split()[4:] for line in apart.output.splitlines()[1:]] == [
        ["GPU", "0", "actor", "(DeepSpeed", "ZeRO-3,", "rollout", "hf)"],
        ["GPU", "1", "actor", "(DeepSpeed", "ZeRO-3,", "rollout", "hf)"],
        ["GPU", "2", "ref", "(ZeRO-3)"],
        ["GPU", "3", "ref", "(ZeRO-3)"],
    ]
    refused = show_layout(
        "grpo",
        "ppoflow.workers.backend=local",
        "trainer.n_gpus_per_node=2",
    )
    assert refused.exit_code == 2
    assert "error: the local backend runs at most 1 rank(s)" in refused.output


def test_show_layout_names_the_engine_each_rank_holds_a_shard_of() -> None:
    result = show_layout(
        "grpo",  # verl's TP 2
        "ppoflow.workers.backend=ray",
        "trainer.n_gpus_per_node=4",
        "actor_rollout_ref.rollout.name=vllm",
    )
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0].endswith("; 2 vllm engines, each spanning 2 actor ranks (external_launcher)")
    assert [line.split("rollout ")[1].split(")")[0] for line in lines[1:]] == [
        "vllm engine 0 shard 1/2",
        "vllm engine 0 shard 2/2",
        "vllm engine 1 shard 1/2",
        "vllm engine 1 shard 2/2",
    ]
