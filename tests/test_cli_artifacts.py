"""`ppoflow inspect`, `ppoflow ledger` and `ppoflow make-sample-batch` through typer's CliRunner."""

from __future__ import annotations

import typer
from typer.testing import CliRunner

from dataproto.artifact import load_artifact, read_manifest
from flows.cli import artifacts as cli_artifacts

runner = CliRunner()


def _app() -> typer.Typer:
    app = typer.Typer()
    cli_artifacts.register(app)
    return app


def test_ledger_hand_checked_example():
    args = ["ledger", "--batch", "2", "--n", "2", "--prompt-len", "4", "--response-len", "4"]
    result = runner.invoke(_app(), [*args, "--lengths", "4,2,0,1"])
    assert result.exit_code == 0, result.output
    lines = {
        line.split("  ")[1].strip(): line.split()[-1] for line in result.output.splitlines()[1:]
    }
    assert "1/7 = 0.142857 per token" in result.output
    assert lines["rows (B·n)"] == "4"
    assert "7 of 16 response slots" in result.output
    assert lines["total tokens (Σ attention_mask)"] == "23"
    assert "reward positions (rows with L_i > 0)  3," in result.output
    assert "aborted rows (L_i = 0)                1," in result.output


def test_ledger_errors_name_both_numbers():
    base = ["ledger", "-b", "2", "-n", "2", "--prompt-len", "4", "--response-len", "4"]
    result = runner.invoke(_app(), [*base, "--lengths", "4,2,0"])
    assert result.exit_code == 2
    assert "got 3 lengths, expected B·n = 2·2 = 4" in result.output
    result = runner.invoke(_app(), [*base, "--lengths", "4,2,9,1"])
    assert result.exit_code == 2 and "length 9 of row 2 is outside [0, R] = [0, 4]" in result.output
    result = runner.invoke(_app(), [*base, "--lengths", "4,x,0,1"])
    assert result.exit_code == 2 and "'x'" in result.output


def test_make_sample_batch_then_inspect(tmp_path):
    target = str(tmp_path / "sample")
    made = runner.invoke(_app(), ["make-sample-batch", target, "-b", "3", "-n", "2", "--seed", "5"])
    assert made.exit_code == 0, made.output
    manifest = read_manifest(target)
    assert manifest["stage"] == "sample" and manifest["rows"] == 6
    data = load_artifact(target)
    lengths = data.batch["attention_mask"][:, -32:].sum(-1)
    rm = data.batch["rm_scores"]
    for row, length in enumerate(lengths.tolist()):  # reward only at L_i − 1, none when aborted
        expected_cols = [length - 1] if length > 0 else []
        assert rm[row].nonzero().flatten().tolist() == expected_cols
    for verify in ("full", "lazy"):
        shown = runner.invoke(_app(), ["inspect", target, "--verify", verify])
        assert shown.exit_code == 0, shown.output
        for needle in (manifest["fingerprint"], "rm_scores", "uid", "reward_model", "token ledger"):
            assert needle in shown.output
        assert "elsewhere (row, column)             0" in shown.output
    again = runner.invoke(_app(), ["make-sample-batch", target])
    assert again.exit_code == 1 and "already exists" in again.output


def test_inspect_reports_corruption_with_file_name(tmp_path):
    target = tmp_path / "sample"
    assert runner.invoke(_app(), ["make-sample-batch", str(target)]).exit_code == 0
    (target / "tensors.safetensors").write_bytes(b"")
    result = runner.invoke(_app(), ["inspect", str(target)])
    assert result.exit_code == 1 and "tensors.safetensors" in result.output
    assert runner.invoke(_app(), ["inspect", str(target), "--verify", "quick"]).exit_code == 2


def test_commands_are_registered_on_the_ppoflow_app():
    from flows.cli.app import app

    result = runner.invoke(app, ["--help"])
    assert result.exit_code == 0
    for name in ("inspect", "ledger", "make-sample-batch"):
        assert name in result.output


def test_describe_artifact_without_tensors_has_no_ledger(tmp_path):
    import numpy as np

    from dataproto.artifact import save_artifact
    from dataproto.protocol import DataProto
    from dataproto.report import describe_artifact

    uid = np.array(["a", "a", "b"], dtype=object)
    save_artifact(DataProto(non_tensor_batch={"uid": uid}, meta_info={"k": 1}), tmp_path / "a")
    text = describe_artifact(tmp_path / "a", verify="lazy")
    assert "batch (tensors)\n  (none)" in text and "uid: 2 distinct; e.g. 'a', 'b'" in text
    assert "token ledger" not in text and "k: 1" in text
