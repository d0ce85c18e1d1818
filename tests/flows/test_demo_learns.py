"""The demo learns: configs/demo-cpu.yaml as shipped, 250 GRPO steps on CPU, one update each.

The demo task (stages/data/demo_task.py) asks the tiny random-init model to copy the letter of
"copy: c" (one of eight letters). A response character earns 1 for the letter, cyclic near-miss
credit for another letter of the alphabet, 0 for anything else; each character written after the
answer takes a share of that credit (up to 0.4), and the greedy validation score is the mean over
the validation prompts. A policy that ignores the prompt answers every prompt with the
same greedy string, so its score is at most the best single letter's mean credit over the
validation answers: 0.3125 for uniformly drawn answers (every letter has the same expected credit,
(1 + 0.5 · 3) / 8), and max over letters of the mean credit on the actual validation split (0.363
on the 64 answers of seed 1, where g and h are the most frequent). Its accuracy is at most the
most frequent answer's share. Scoring above both bounds means the policy reads the prompt.

Before training the random model emits no letters (greedy validation score 0.000); after 250
steps it copies the letter and stops: greedy accuracy ≥ 0.8 (0.938, measured 2026-12-06), a
greedy score ≥ 0.85 (0.961; the letter repeated to the 16-token limit, what an earlier scorer
taught, scores at most 0.6), and at most 10 % of the last step's sampled responses cut at the
limit (0.0). About 3 minutes of training on two quiet cores; data, model, run directory, MLflow
and checkpoints all go under ``tmp_path``.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from flows.train import train
from stages.data import make_demo_data, make_tiny_model
from stages.data.demo_task import DEFAULT_ALPHABET, char_credit

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("prefect_harness")]

REPO = Path(__file__).resolve().parents[2]
UNIFORM_CEILING = 0.3125  # a prompt-ignoring policy's expected score under uniform answers
ACC = "val-core/ppoflow/demo-copy/acc/mean@1"


def validation_answers(val_file: Path) -> list[str]:
    return [
        row["ground_truth"] for row in pq.read_table(val_file).column("reward_model").to_pylist()
    ]


def prompt_ignoring_ceilings(answers: list[str]) -> tuple[float, float]:
    """(score, acc) bounds of any policy that answers every prompt alike, on these answers: the
    best letter's mean credit, the most frequent answer's share."""
    best_score = max(
        sum(char_credit(letter, answer) for answer in answers) / len(answers)
        for letter in DEFAULT_ALPHABET
    )
    return best_score, Counter(answers).most_common(1)[0][1] / len(answers)


def test_demo_validation_score_rises_past_any_prompt_ignoring_policy(tmp_path):
    _, val_file = make_demo_data(tmp_path / "data")
    make_tiny_model(tmp_path / "model")
    result = train(
        REPO / "configs" / "demo-cpu.yaml",
        [
            f"data.train_files=[{tmp_path}/data/train.parquet]",
            f"data.val_files=[{val_file}]",
            f"actor_rollout_ref.model.path={tmp_path}/model",
            f"trainer.default_local_dir={tmp_path}/checkpoints",
            f"ppoflow.artifact_dir={tmp_path}/runs",
            f"ppoflow.mlflow_tracking_uri=sqlite:///{tmp_path}/mlflow.db",
        ],
        str(tmp_path / "run"),
    )
    score_ceiling, acc_ceiling = prompt_ignoring_ceilings(validation_answers(val_file))
    assert score_ceiling >= UNIFORM_CEILING  # the split's bound, never below the uniform one

    assert result.steps == 250 and len(result.history) == 250
    assert result.val_before is not None and result.val_before < 0.05
    assert result.val_after is not None and result.val_after > score_ceiling, (
        f"validation score {result.val_after:.3f} after 250 steps does not beat "
        f"{score_ceiling:.3f}, the best score of a policy that ignores the prompt"
    )
    assert result.history[-1][ACC] > acc_ceiling
    assert result.history[-1][ACC] >= 0.8, f"greedy accuracy {result.history[-1][ACC]:.3f} < 0.8"
    assert result.val_after >= 0.85, f"greedy score {result.val_after:.3f}: it does not stop"
    clipped = result.history[-1]["response_length/clip_ratio"]
    assert clipped <= 0.1, f"{clipped:.0%} of the last step's responses ran to the limit"
