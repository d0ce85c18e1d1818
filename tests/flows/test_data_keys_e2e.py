"""End to end: the config keys that used to do nothing act in a real training run (tiny GRPO).

One run with train_max_samples, dataloader_num_workers, validation_shuffle and a two-batch
validation, return_raw_chat=false, rollout.ignore_eos, and both generation dumps.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dataproto import keys as K
from dataproto.artifact import load_artifact
from flows.runs.store import RunStore
from flows.train import train

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("prefect_harness")]

REPO = Path(__file__).resolve().parents[2]
STEPS, PROMPTS, N, R = 2, 4, 2, 8  # tiny_run_overrides: 4 prompts × n 2, 8 response tokens


def _records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def test_formerly_ignored_keys_act_in_training(tmp_path, tiny_run_overrides, make_demo_inputs):
    demo = make_demo_inputs(tmp_path / "demo", n_train=32, n_val=8)
    rollouts, validations = tmp_path / "rollouts", tmp_path / "validations"
    overrides = tiny_run_overrides(
        demo,
        tmp_path,
        STEPS,
        "data.train_max_samples=8",  # 2 batches per epoch of 4 prompts
        "data.val_batch_size=4",  # two validation batches: collated by the workers
        "data.dataloader_num_workers=2",
        "data.validation_shuffle=true",
        "data.return_raw_chat=false",
        "actor_rollout_ref.rollout.ignore_eos=true",
        f"trainer.rollout_data_dir={rollouts}",
        f"trainer.validation_data_dir={validations}",
    )
    result = train(REPO / "configs" / "demo-cpu.yaml", overrides, str(tmp_path / "run"))

    assert result.steps == STEPS
    assert [m["training/epoch"] for m in result.history] == [0.0, 0.0]  # 8 rows: 2 steps/epoch
    assert all(m["response_length/mean"] == R for m in result.history)  # past EOS, R tokens
    assert sorted(p.name for p in rollouts.iterdir()) == ["1.jsonl", "2.jsonl"]
    step_records = _records(rollouts / "2.jsonl")
    assert len(step_records) == PROMPTS * N and {r["step"] for r in step_records} == {2}
    assert {"input", "output", "gts", "score"} <= set(step_records[0])
    assert sorted(p.name for p in validations.iterdir()) == ["0.jsonl", "2.jsonl"]
    val_records = _records(validations / "2.jsonl")
    assert len(val_records) == 8 and all("reward" in r for r in val_records)
    step_input = load_artifact(RunStore(result.run_dir).input_path(1))
    assert K.RAW_PROMPT not in step_input.non_tensor_batch
