"""A markdown summary of each training step as a Prefect artifact (what ran or hit the cache,
why, how long, the key metrics, and the MLflow run)."""

from __future__ import annotations

import math
from collections.abc import Sequence

from prefect.artifacts import create_markdown_artifact

from flows.run_store import StageRecord

KEY_METRICS = (
    "critic/score/mean",
    "actor/pg_loss",
    "actor/entropy",
    "actor/reward_kl_penalty",
    "critic/vf_loss",
    "response_length/mean",
    "timing_s/step",
)


def _number(value: float | None) -> str:
    return "-" if value is None or not math.isfinite(value) else f"{value:.4g}"


def step_markdown(
    step: int,
    records: Sequence[StageRecord],
    metrics: dict[str, float],
    mlflow_run_id: str | None = None,
) -> str:
    """The step's markdown: a stage table and a key-metric table.

    >>> print(step_markdown(1, [StageRecord("rollout", "ran", "cache miss", timing_s=1.5)],
    ...                     {"timing_s/step": 2.0}, "abc").splitlines()[0])
    ### Step 1 (MLflow run `abc`)
    """
    title = f"### Step {step}" + (f" (MLflow run `{mlflow_run_id}`)" if mlflow_run_id else "")
    lines = [title, "", "| stage | status | reason | seconds |", "|---|---|---|---|"]
    for record in records:
        reason = record.reason.replace("|", "/")
        lines.append(
            f"| {record.stage} | {record.status} | {reason} | {_number(record.timing_s)} |"
        )
    lines += ["", "| metric | value |", "|---|---|"]
    lines += [f"| {name} | {_number(metrics[name])} |" for name in KEY_METRICS if name in metrics]
    return "\n".join(lines) + "\n"


def publish_step_report(
    step: int,
    records: Sequence[StageRecord],
    metrics: dict[str, float],
    mlflow_run_id: str | None = None,
) -> None:
    """Create the step's markdown artifact in the current flow run."""
    create_markdown_artifact(
        markdown=step_markdown(step, records, metrics, mlflow_run_id),
        description=f"PPO step {step}: stages and key metrics",
    )
