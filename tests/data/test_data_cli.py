"""`ppoflow make-tiny-model` and `ppoflow make-demo-data` through typer's test runner."""

from __future__ import annotations

import typer
from typer.testing import CliRunner

from flows import cli_data
from stages.data.dataset import load_prompt_rows
from stages.data.tiny_model import load_causal_lm
from stages.data.tokenizer import load_tokenizer


def _app() -> typer.Typer:
    app = typer.Typer()
    cli_data.register(app)
    return app


def test_make_demo_data_command(tmp_path):
    result = CliRunner().invoke(
        _app(), ["make-demo-data", str(tmp_path), "--n-train", "12", "--n-val", "5", "--seed", "3"]
    )
    assert result.exit_code == 0, result.output
    assert "12 training prompts" in result.output
    assert len(load_prompt_rows(tmp_path / "train.parquet")) == 12
    assert len(load_prompt_rows(tmp_path / "val.parquet")) == 5


def test_make_demo_data_rejects_bad_sizes(tmp_path):
    result = CliRunner().invoke(_app(), ["make-demo-data", str(tmp_path), "--n-train", "0"])
    assert result.exit_code != 0


def test_make_tiny_model_command(tmp_path):
    result = CliRunner().invoke(_app(), ["make-tiny-model", str(tmp_path / "m"), "--seed", "1"])
    assert result.exit_code == 0, result.output
    assert load_tokenizer(tmp_path / "m").eos_token_id == 1
    assert load_causal_lm(tmp_path / "m").config.num_hidden_layers == 2
