"""A markdown summary of each training step as a keyed Prefect artifact: what ran or hit the
cache, why, how long, the key metrics, the validation score when the step validated, the run
directory and the MLflow run.

The artifact key is ``<experiment>-<run tag>-step-<kkkkkk>`` (:func:`report_key`, the step
zero-padded to six digits so that a run's reports sort in step order by name): the experiment
name (``trainer.experiment_name``) and the run tag (the first 8 hex digits of the training flow
run's id) lowercased, with every run of other characters than ``a-z``/``0-9`` turned into one
dash, as Prefect's keys allow only lowercase letters, digits and dashes. A key is what lists a
report on the UI's Artifacts page; Prefect keeps the artifacts of one key as its versions, so
the run tag keeps two runs of the same experiment from becoming versions of each other's reports.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

from prefect import runtime
from prefect.artifacts import create_markdown_artifact

from flows.runs.store import StageRecord

KEY_METRICS = (
    "critic/score/mean",
    "actor/pg_loss",
    "actor/entropy",
    "actor/reward_kl_penalty",
    "critic/vf_loss",
    "response_length/mean",
    "timing_s/step",
)
#: digits of the step in a report key (zero-padded)
STEP_DIGITS = 6
#: the longest experiment-name part of a report key (characters, after sanitizing)
EXPERIMENT_KEY_CHARS = 40
_NOT_KEY = re.compile(r"[^a-z0-9]+")


def key_part(text: str) -> str:
    """``text`` as a Prefect key fragment: lowercased, each run of other characters than
    ``a-z0-9`` one dash, no dash at either end.

    >>> key_part("GRPO_tiny.v2 (Qwen)")
    'grpo-tiny-v2-qwen'
    """
    return _NOT_KEY.sub("-", text.lower()).strip("-")


def report_key(experiment: str, run_tag: str, step: int) -> str:
    """The artifact key of step ``step``'s report (module docstring).

    The experiment part is cut to :data:`EXPERIMENT_KEY_CHARS`; an experiment or a tag with
    no letter or digit leaves its part out.

    The step has six digits (:data:`STEP_DIGITS`), so the keys of a run sort in step order
    where Prefect lists them by name.

    >>> report_key("grpo-tiny", "4f9c2a1e", 7)
    'grpo-tiny-4f9c2a1e-step-000007'
    >>> report_key("My Exp/2026", "", 1)
    'my-exp-2026-step-000001'
    """
    parts = [key_part(experiment)[:EXPERIMENT_KEY_CHARS].strip("-"), key_part(run_tag)]
    return "-".join([part for part in parts if part] + ["step", f"{step:0{STEP_DIGITS}d}"])


def flow_run_tag() -> str:
    """The run tag of a report key: the first 8 hex digits of the current flow run's id
    (``prefect.runtime.flow_run.id``), "" outside a flow run."""
    flow_run_id = runtime.flow_run.id
    return "" if flow_run_id is None else str(flow_run_id).replace("-", "")[:8]


#: where ``mlflow server`` (and ``mlflow ui``) serve by default: a local store's runs are linked there
MLFLOW_DEFAULT_ADDRESS = "http://127.0.0.1:5000"


def mlflow_run_link(tracking_uri: str, run_id: str) -> str:
    """A markdown link to the MLflow run ``run_id`` in the UI (``#/runs/<id>``, which MLflow
    redirects to the run's page in its experiment): on the tracking server itself, or for a
    local store on :data:`MLFLOW_DEFAULT_ADDRESS` with the command that serves it there.

    >>> mlflow_run_link("https://mlflow.example.org/", "abc")
    '[abc](https://mlflow.example.org/#/runs/abc)'
    >>> mlflow_run_link("sqlite:////data/runs/mlflow.db", "abc")
    '[abc](http://127.0.0.1:5000/#/runs/abc) (served by `mlflow server --backend-store-uri sqlite:////data/runs/mlflow.db`)'
    """
    if tracking_uri.startswith(("http://", "https://")):
        return f"[{run_id}]({tracking_uri.rstrip('/')}/#/runs/{run_id})"
    served = f"mlflow server --backend-store-uri {tracking_uri}"
    return f"[{run_id}]({MLFLOW_DEFAULT_ADDRESS}/#/runs/{run_id}) (served by `{served}`)"


def _number(value: float | None) -> str:
    return "-" if value is None or not math.isfinite(value) else f"{value:.4g}"


def step_markdown(
    step: int,
    records: Sequence[StageRecord],
    metrics: dict[str, float],
    mlflow_run_id: str | None = None,
    *,
    run_dir: str | None = None,
    val_score: float | None = None,
    tracking_uri: str | None = None,
) -> str:
    """The step's markdown: a title, the run directory, the MLflow run as a link
    (:func:`mlflow_run_link`, with ``tracking_uri``), the validation score (``val_score``:
    the mean score of a validation at this step, None when the step did not validate), a stage
    table, and a key-metric table (:data:`KEY_METRICS`, then every ``val-core/…`` metric).

    >>> text = step_markdown(2, [StageRecord("rollout", "ran", "cache miss", timing_s=1.5)],
    ...                      {"timing_s/step": 2.0}, "abc", run_dir="/runs/r1", val_score=0.25)
    >>> print("\\n".join(text.splitlines()[:4]))
    ### Step 2 (MLflow run `abc`)
    <BLANKLINE>
    - run directory: `/runs/r1`
    - validation score: **0.25**
    """
    title = f"### Step {step}" + (f" (MLflow run `{mlflow_run_id}`)" if mlflow_run_id else "")
    lines = [title, ""]
    if run_dir is not None:
        lines.append(f"- run directory: `{run_dir}`")
    if mlflow_run_id and tracking_uri:
        lines.append(f"- MLflow run: {mlflow_run_link(tracking_uri, mlflow_run_id)}")
    if val_score is not None:
        lines.append(f"- validation score: **{_number(val_score)}**")
    if len(lines) > 2:
        lines.append("")
    lines += ["| stage | status | reason | seconds |", "|---|---|---|---|"]
    for record in records:
        reason = record.reason.replace("|", "/")
        lines.append(
            f"| {record.stage} | {record.status} | {reason} | {_number(record.timing_s)} |"
        )
    shown = [name for name in KEY_METRICS if name in metrics]
    shown += sorted(name for name in metrics if name.startswith("val-core/"))
    lines += ["", "| metric | value |", "|---|---|"]
    lines += [f"| {name} | {_number(metrics[name])} |" for name in shown]
    return "\n".join(lines) + "\n"


def publish_step_report(
    step: int,
    records: Sequence[StageRecord],
    metrics: dict[str, float],
    mlflow_run_id: str | None = None,
    *,
    key: str | None = None,
    run_dir: str | None = None,
    val_score: float | None = None,
    tracking_uri: str | None = None,
) -> None:
    """Create the step's markdown artifact in the current flow run, under ``key`` (None: an
    unkeyed artifact, shown only on the flow run's page).

    Raises:
        ValueError: ``key`` has other characters than lowercase letters, digits and dashes.
    """
    create_markdown_artifact(
        markdown=step_markdown(
            step,
            records,
            metrics,
            mlflow_run_id,
            run_dir=run_dir,
            val_score=val_score,
            tracking_uri=tracking_uri,
        ),
        key=key,
        description=f"PPO step {step}: stages, key metrics"
        + (", validation" if val_score is not None else ""),
    )
