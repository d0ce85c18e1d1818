"""ppoflow's stages; importing the package makes transformers skip its scikit-learn and SciPy
imports and DeepSpeed its MLflow import (stages/skipped_imports.py)."""

from stages.skipped_imports import install as _install_skipped_imports

_install_skipped_imports()
