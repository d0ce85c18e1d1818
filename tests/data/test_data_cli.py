"""`ppoflow make-tiny-model` and `ppoflow make-demo-data` through typer's test runner."""

from __future__ import annotations

import typer
from typer.testing import CliRunner

from flows.cli import data as cli_data
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


def test_make_demo_data_draws_varied_answer_lengths(tmp_path):
    result = CliRunner().invoke(
        _app(),
        ["make-demo-data", str(tmp_path), "--n-train", "200", "--n-val", "4",
         "--answer-length", "2", "--max-answer-length", "24"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    rows = load_prompt_rows(tmp_path / "train.parquet")
    lengths = {len(row.reward_model["ground_truth"]) for row in rows}
    assert min(lengths) >= 2 and max(lengths) <= 24 and len(lengths) > 10
    for row in rows:  # the prompt asks for exactly the ground truth
        assert row.prompt[0]["content"] == "copy: " + row.reward_model["ground_truth"]


def test_make_tiny_model_takes_its_size(tmp_path):
    result = CliRunner().invoke(
        _app(),
        ["make-tiny-model", str(tmp_path / "m"), "--hidden-size", "256", "--layers", "4",
         "--intermediate-size", "768"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    config = load_causal_lm(tmp_path / "m").config
    assert (config.hidden_size, config.num_hidden_layers, config.intermediate_size) == (256, 4, 768)
