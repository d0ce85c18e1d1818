"""stages/transformers_sklearn.py: a causal-LM class imported after ``stages`` does not import
scikit-learn; scikit-learn itself stays importable. Each case runs in a fresh interpreter, since
the answer is cached for the process."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytest.importorskip("sklearn")  # installed with MLflow; the hook matters only where it is

PROBE = """
import json, sys
{first}
from transformers import AutoModelForCausalLM  # imports GenerationMixin's candidate generator
from transformers.utils import is_sklearn_available
seen = {{"sklearn_imported": "sklearn" in sys.modules, "available": is_sklearn_available()}}
import sklearn.metrics
seen["importable_after"] = callable(sklearn.metrics.roc_curve)
seen["finders_left"] = [type(f).__name__ for f in sys.meta_path if "AnswerAfter" in type(f).__name__]
print(json.dumps(seen))
"""


def probe(first: str) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", PROBE.format(first=first)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_after_stages_transformers_skips_sklearn_and_sklearn_still_imports():
    seen = probe("import stages")
    assert seen == {
        "sklearn_imported": False,
        "available": False,
        "importable_after": True,
        "finders_left": [],  # the finder removed itself after its one module
    }


def test_without_stages_transformers_imports_sklearn():
    # the baseline the hook changes: plain transformers does import scikit-learn
    seen = probe("pass")
    assert seen["sklearn_imported"] is True and seen["available"] is True


def test_sklearn_already_imported_is_left_alone():
    seen = probe("import sklearn, stages")
    assert seen["sklearn_imported"] is True and seen["importable_after"] is True
