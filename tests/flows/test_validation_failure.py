"""A validation that fails never discards the training of its step: a due checkpoint is written
first (flows/train.py), so the run resumes after that step."""

from __future__ import annotations

from pathlib import Path

import pytest

from flows.train import train
from stages.engines.checkpoint import read_latest_step

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("prefect_harness")]

REPO = Path(__file__).resolve().parents[2]
TRAIN_ONLY_SCORER = """
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    if (extra_info or {}).get("split") != "train":
        raise RuntimeError("this scorer only scores training rows")
    return float(solution_str.startswith(ground_truth))
"""


def test_a_failed_validation_keeps_the_steps_checkpoint(
    make_demo_inputs, tiny_run_overrides, tmp_path
):
    demo = make_demo_inputs(tmp_path / "demo")
    scorer = tmp_path / "train_only.py"
    scorer.write_text(TRAIN_ONLY_SCORER)
    overrides = tiny_run_overrides(
        demo, tmp_path, 2,
        f"reward.custom_reward_function.path={scorer}", "trainer.val_before_train=false",
    )  # fmt: skip
    with pytest.raises(Exception, match=r"this scorer only scores training rows|invalid"):
        train(REPO / "configs" / "demo-cpu.yaml", overrides, str(tmp_path / "run"))
    assert read_latest_step(tmp_path / "checkpoints") == 2  # step 2's training was kept
    assert (tmp_path / "checkpoints" / "global_step_2" / "actor").is_dir()
