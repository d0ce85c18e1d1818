"""Hermetic test environment: no network, and every store (Prefect, MLflow, artifacts) in a temp dir.

The environment variables are set at import time of this file, before any test module imports
prefect or mlflow, because both read their settings on import.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

_SESSION_TMP = Path(tempfile.mkdtemp(prefix="ppoflow-tests-"))
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"
os.environ["HF_HOME"] = str(_SESSION_TMP / "hf-home")
os.environ["PREFECT_HOME"] = str(_SESSION_TMP / "prefect-home")
os.environ["PREFECT_RESULTS_LOCAL_STORAGE_PATH"] = str(_SESSION_TMP / "prefect-results")
os.environ["PREFECT_SERVER_SERVICES_TASK_RUN_RECORDER_ENABLED"] = "false"
os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{_SESSION_TMP / 'mlflow.db'}"
# DeepSpeed's JIT-compiled ops are expensive (~30 s); reuse them across runs when the user has a cache.
os.environ.setdefault(
    "TORCH_EXTENSIONS_DIR", str(Path.home() / ".cache" / "ppoflow-torch-extensions")
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip `gpu` tests on machines without CUDA (they are selected only with `-m gpu`)."""
    import torch

    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs CUDA: torch.cuda.is_available() is False")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)
