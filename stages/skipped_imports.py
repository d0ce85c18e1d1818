"""Imports that libraries make for features ppoflow never uses, skipped in ppoflow's processes.

A library module of :data:`SKIPS` finds some installed packages "not installed" while it runs,
and for the availability checks it caches. MLflow installs scikit-learn and SciPy, which
transformers then imports; DeepSpeed imports MLflow, which ppoflow's training process leaves to
its MLflow process (flows/sinks/mlflow_process.py). The figures are in bench/README.md:

* ``transformers.utils.import_utils``: every causal-LM class imports
  ``transformers.generation.candidate_generator`` (through ``GenerationMixin``), which runs
  ``from sklearn.metrics import roc_curve`` when ``is_sklearn_available()`` (scikit-learn, SciPy's
  statistics and pandas: the largest part of a run's start after torch), used only to tune assisted (speculative)
  generation; and ``transformers.loss.loss_utils`` (through ``modeling_utils``), whose
  object-detection losses run ``from scipy.optimize import linear_sum_assignment`` when
  ``is_scipy_available()``, used only for the Hungarian matching of DETR-like models.
  Both checks are ``lru_cache``d, so they are asked once right after the module runs, with the
  packages hidden, and transformers keeps the answers for the process.
* ``deepspeed.autotuning.autotuner``, imported by ``import deepspeed``, runs ``import mlflow``
  to report DeepSpeed's own autotuning experiments; ppoflow never runs DeepSpeed's
  autotuner. It finds MLflow absent (``has_mlflow`` False).

:func:`install` adds a finder to ``sys.meta_path``. When a module of :data:`SKIPS` is imported,
the finder finds it as the path finder would, and runs its code (and then its checks) with each
listed package's ``sys.modules`` entry set to ``None``, which makes ``import`` and
``importlib.util.find_spec`` answer "not installed". ``sys.modules`` is then restored, so user
code (a reward function, a test) still imports those packages as usual; a package already
imported (the user imported it first) is left as it is, and so are the library's answers about
it. The finder declines every other name, and takes itself off ``sys.meta_path`` once every
module of :data:`SKIPS` has been imported.

Importing ``stages`` does not install it: the ``ppoflow`` executable does, first thing
(flows/process/own_process.py), and so does each Ray rank's actor before it builds its worker
(stages/engines/worker_group_ray.py); vLLM's in-process engine shares the trainer's process.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from types import ModuleType


@dataclass(frozen=True)
class Skip:
    """One library module and the packages it finds absent.

    module: the library module whose import is watched.
    packages: the packages hidden while it runs.
    checks: functions of the module asked once right after it runs, still with the packages
        hidden, so their cached answers say "not installed".
    """

    module: str
    packages: tuple[str, ...]
    checks: tuple[str, ...] = ()


SKIPS = (
    Skip(
        "transformers.utils.import_utils",
        ("sklearn", "scipy"),
        checks=("is_sklearn_available", "is_scipy_available"),
    ),
    Skip("deepspeed.autotuning.autotuner", ("mlflow",)),
)


@contextmanager
def hidden(packages: tuple[str, ...]) -> Iterator[None]:
    """``packages`` look "not installed" inside the block, except those already imported."""
    absent = [package for package in packages if package not in sys.modules]
    for package in absent:
        sys.modules[package] = None  # type: ignore[assignment]  # find_spec: "not installed"
    try:
        yield
    finally:
        for package in absent:
            del sys.modules[package]


def run_skipping(skip: Skip, run_module: Callable[[ModuleType], None], module: ModuleType) -> None:
    """Run ``module``'s code, then its checks, with ``skip.packages`` hidden."""
    with hidden(skip.packages):
        run_module(module)
        for check in skip.checks:
            getattr(module, check)()


class _SkipWhileImporting(importlib.abc.MetaPathFinder):
    """Finds the modules of :data:`SKIPS` not yet imported as the path finder would, their code
    run by :func:`run_skipping`; declines every other name."""

    def __init__(self, skips: tuple[Skip, ...]) -> None:
        self.waiting = {skip.module: skip for skip in skips}

    def find_spec(self, fullname, path, target=None):
        skip = self.waiting.pop(fullname, None)
        if skip is None:
            return None
        if not self.waiting:
            uninstall()
        spec = importlib.machinery.PathFinder.find_spec(fullname, path, target)
        if spec is None or spec.loader is None:
            return spec
        run_module = spec.loader.exec_module
        spec.loader.exec_module = lambda module: run_skipping(skip, run_module, module)  # type: ignore[method-assign]
        return spec


def install() -> None:
    """Put the finder first on ``sys.meta_path`` for the modules of :data:`SKIPS` not imported yet
    (one already imported could only be answered too late), unless the finder is there."""
    waiting = tuple(skip for skip in SKIPS if skip.module not in sys.modules)
    if not waiting or any(isinstance(f, _SkipWhileImporting) for f in sys.meta_path):
        return
    sys.meta_path.insert(0, _SkipWhileImporting(waiting))


def uninstall() -> None:
    """Take the finder off ``sys.meta_path`` (a no-op when it is not there)."""
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _SkipWhileImporting)]
