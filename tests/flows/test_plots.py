"""flows.sinks.plots: which PNGs a history yields, which plots are skipped and why; and
MLflowLogger.log_plots, which queues the PNG bytes so an outage does not lose them."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from mlflow.exceptions import MlflowException

from flows.sinks.mlflow_logger import MLflowLogger
from flows.sinks.plots import STEP, metric_series, write_run_plots

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def grpo_history(steps: int = 3) -> list[dict[str, float]]:
    """A GRPO run's rows: score, length and ppo_kl every step, validation at the last step."""
    rows = [
        {
            STEP: float(step),
            "critic/score/mean": 0.1 * step,
            "response_length/mean": 5.0 + step,
            "actor/ppo_kl": 0.001 * step,
            "timing_s/step": 1.0,
        }
        for step in range(1, steps + 1)
    ]
    rows[-1]["val-core/demo/reward/mean@1"] = 0.4
    return rows


def test_writes_the_three_pngs_for_a_grpo_history(tmp_path):
    report = write_run_plots(grpo_history(), tmp_path / "plots")
    assert report.skipped == {}
    assert sorted(report.written) == ["kl.png", "response_length.png", "reward.png"]
    for name, path in report.written.items():
        assert path == tmp_path / "plots" / name
        data = path.read_bytes()
        assert data.startswith(PNG_SIGNATURE) and len(data) > 1000, name


def test_a_metric_never_logged_skips_its_plot_with_the_reason(tmp_path):
    history = [{k: v for k, v in row.items() if k != "actor/ppo_kl"} for row in grpo_history()]
    report = write_run_plots(history, tmp_path)
    assert sorted(report.written) == ["response_length.png", "reward.png"]
    reason = report.skipped["kl.png"]
    assert "actor/reward_kl_penalty or actor/ppo_kl or actor/kl_loss" in reason
    assert "never" in reason and "3 steps" in reason
    assert not (tmp_path / "kl.png").exists()


def test_a_metric_logged_only_as_nan_skips_its_plot_and_says_so(tmp_path):
    history = grpo_history(2)
    for row in history:
        row["response_length/mean"] = math.nan
    report = write_run_plots(history, tmp_path)
    assert "only as NaN (response_length/mean)" in report.skipped["response_length.png"]
    assert "reward.png" in report.written


def test_empty_history_skips_every_plot(tmp_path):
    report = write_run_plots([], tmp_path)
    assert report.written == {}
    assert sorted(report.skipped) == ["kl.png", "response_length.png", "reward.png"]


def test_validation_alone_still_makes_the_reward_plot(tmp_path):
    history = [{STEP: 2.0, "val-core/demo/acc/mean@4": 0.3, "val-core/demo/acc/std@4": 0.1}]
    report = write_run_plots(history, tmp_path)
    assert list(report.written) == ["reward.png"]


def test_series_skips_missing_and_nan_values_and_keeps_the_step():
    history = [{STEP: 4.0, "a": 1.0}, {STEP: 5.0}, {STEP: 6.0, "a": math.inf}, {STEP: 7.0, "a": 2}]
    assert metric_series(history, "a") == ([4.0, 7.0], [1.0, 2.0])


def test_a_row_without_the_global_step_is_named():
    with pytest.raises(ValueError, match="history row 1 has no 'training/global_step'"):
        metric_series([{STEP: 1.0}, {"a": 1.0}], "a")


class ArtifactStore:
    """Stands in for MlflowClient: one run; log_artifact fails like an unreachable server while
    ``down`` and otherwise keeps the bytes of the file it is given at the time of the call;
    metrics, tags and the metric-names file are accepted and dropped."""

    def __init__(self) -> None:
        self.down, self.artifacts, self.status = True, {}, None

    def get_experiment_by_name(self, name):
        return SimpleNamespace(experiment_id="1", tags={})

    def set_experiment_tag(self, experiment_id, key, value):
        pass

    def create_run(self, experiment_id, run_name):
        return SimpleNamespace(info=SimpleNamespace(run_id="run-1"))

    def log_artifact(self, run_id, local_path, artifact_path=None):
        if self.down:
            raise MlflowException("API request to http://x/api failed with ConnectionError")
        self.artifacts[f"{artifact_path}/{Path(local_path).name}"] = Path(local_path).read_bytes()

    def set_terminated(self, run_id, status):
        self.status = status

    def log_batch(self, run_id, metrics=(), **_):
        pass

    def log_dict(self, run_id, data, artifact_file):
        pass

    def set_tag(self, run_id, key, value):
        pass


def test_log_plots_survives_an_outage_and_sends_the_pngs_when_the_store_returns(monkeypatch):
    store = ArtifactStore()
    monkeypatch.setattr("flows.sinks.mlflow_logger.MlflowClient", lambda tracking_uri: store)
    logger = MLflowLogger("proj", "plots", tracking_uri="sqlite:///unused.db", retry_interval_s=0)
    history = [{k: v for k, v in row.items() if k != "actor/ppo_kl"} for row in grpo_history()]
    report = logger.log_plots(history)
    assert sorted(report.written) == ["response_length.png", "reward.png"]
    assert "kl.png" in report.skipped
    assert not logger.flush() and store.artifacts == {}  # both PNGs queued; temp files gone
    store.down = False
    logger.close()
    assert sorted(store.artifacts) == ["plots/response_length.png", "plots/reward.png"]
    assert all(data.startswith(PNG_SIGNATURE) for data in store.artifacts.values())
    assert store.status == "FINISHED"


RENDERER_PROBE = """
import sys
from flows.sinks.plots import RENDERER_MODULES, preload_renderer
before = [m for m in RENDERER_MODULES if m in sys.modules]
preload_renderer().join(timeout=120)
print(before, [m for m in RENDERER_MODULES if m not in sys.modules])
"""


def test_preload_renderer_imports_matplotlib_in_its_thread_and_importing_plots_does_not():
    # a fresh interpreter: this test process may have imported matplotlib already
    done = subprocess.run(
        [sys.executable, "-c", RENDERER_PROBE], capture_output=True, text=True, timeout=180
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["[]", "[]"]  # none loaded by the import, all by the thread


def test_the_first_metrics_start_the_renderer_import_once(monkeypatch):
    started = []
    monkeypatch.setattr(
        "flows.sinks.mlflow_logger.MlflowClient", lambda tracking_uri: ArtifactStore()
    )
    monkeypatch.setattr(
        "flows.sinks.mlflow_logger.preload_renderer", lambda: started.append(1) or 1
    )
    logger = MLflowLogger("proj", "plots", tracking_uri="sqlite:///unused.db", retry_interval_s=0)
    assert started == []
    logger.log_metrics({"a": 1.0}, step=1)
    logger.log_metrics({"a": 2.0}, step=2)
    assert started == [1]
