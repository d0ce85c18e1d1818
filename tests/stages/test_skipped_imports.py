"""stages/skipped_imports.py: in a process prepared as the ``ppoflow`` executable prepares its own
(flows/process/own_process.py), a causal-LM class imports neither
scikit-learn nor SciPy, and ``import deepspeed`` does not import MLflow; all three stay
importable; ``import stages`` alone changes nothing. Each case runs in a fresh interpreter, since the answers are cached for the process."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytest.importorskip("sklearn")  # installed with MLflow; the hook matters only where it is
pytest.importorskip("scipy")

PROBE = """
import json, sys
{first}
from transformers import AutoModelForCausalLM  # imports GenerationMixin's candidate generator
from transformers.models.qwen2 import modeling_qwen2  # imports modeling_utils' loss functions
from transformers.utils import is_scipy_available, is_sklearn_available
import deepspeed
from deepspeed.autotuning import autotuner
seen = {{
    "imported": sorted(p for p in ("sklearn", "scipy", "mlflow") if p in sys.modules),
    "available": [is_sklearn_available(), is_scipy_available(), autotuner.has_mlflow],
}}
import mlflow, scipy.optimize, sklearn.metrics
seen["importable_after"] = [
    callable(sklearn.metrics.roc_curve),
    callable(scipy.optimize.linear_sum_assignment),
    callable(mlflow.log_metric),
]
seen["finders_left"] = [type(f).__name__ for f in sys.meta_path if "Skip" in type(f).__name__]
print(json.dumps(seen))
"""


def probe(first: str) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", PROBE.format(first=first)],
        capture_output=True,
        text=True,
        timeout=180,
        check=True,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


PREPARED = "from flows.process.own_process import prepare_own_process; prepare_own_process()"


def test_in_a_prepared_process_the_libraries_skip_those_imports_and_the_packages_still_import():
    seen = probe(PREPARED)
    assert seen == {
        "imported": [],
        "available": [False, False, False],
        "importable_after": [True, True, True],
        "finders_left": [],  # the finder removed itself after its last module
    }


def test_without_the_preparation_the_libraries_import_them():
    # the baseline the hook changes: plain transformers and DeepSpeed import all three, also
    # after importing ppoflow's packages (importing them changes nothing)
    seen = probe("import dataproto, stages, flows")
    assert seen["imported"] == ["mlflow", "scipy", "sklearn"]
    assert seen["available"] == [True, True, True]


def test_a_package_already_imported_is_left_alone():
    seen = probe("import mlflow, sklearn, scipy; " + PREPARED)
    assert seen["imported"] == ["mlflow", "scipy", "sklearn"]
    assert seen["available"] == [True, True, True] and seen["importable_after"] == [
        True,
        True,
        True,
    ]
