"""End to end: the README's main job, command by command, as a new user runs it (slow)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PPOFLOW = Path(sys.executable).with_name("ppoflow")


def run_ppoflow(*args: str, cwd: Path) -> str:
    result = subprocess.run(
        [str(PPOFLOW), *args],
        cwd=cwd,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, (
        f"ppoflow {' '.join(args)} failed:\n{result.stdout}\n{result.stderr}"
    )
    return result.stdout


@pytest.mark.slow
def test_demo_commands_write_loadable_outputs(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from dataproto import load_artifact
    from stages.config import load_config
    from stages.data import load_dataset_files

    run_ppoflow("make-demo-data", "outputs/demo/data", cwd=tmp_path)
    run_ppoflow("make-tiny-model", "outputs/demo/model", cwd=tmp_path)
    shown = run_ppoflow(
        "config", "show", "--config", str(REPO / "configs" / "demo-cpu.yaml"), cwd=tmp_path
    )
    run_ppoflow("make-sample-batch", "outputs/demo/sample-batch", cwd=tmp_path)
    inspected = run_ppoflow("inspect", "outputs/demo/sample-batch", cwd=tmp_path)
    ledger = run_ppoflow(
        "ledger",
        "--batch",
        "2",
        "--n",
        "2",
        "--prompt-len",
        "4",
        "--response-len",
        "4",
        "--lengths",
        "4,2,0,1",
        cwd=tmp_path,
    )

    demo = tmp_path / "outputs" / "demo"
    train = load_dataset_files([demo / "data" / "train.parquet"])
    assert len(train) > 0
    tokenizer = AutoTokenizer.from_pretrained(demo / "model")
    model = AutoModelForCausalLM.from_pretrained(demo / "model")
    assert model.config.vocab_size >= len(tokenizer)
    assert "adv_estimator" in shown
    assert load_config(REPO / "configs" / "demo-cpu.yaml").algorithm.adv_estimator == "grpo"
    batch = load_artifact(demo / "sample-batch")
    assert "responses" in inspected and "fingerprint" in inspected.lower()
    assert len(batch) > 0
    assert "7" in ledger  # valid response tokens of lengths 4,2,0,1
