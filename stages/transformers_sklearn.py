"""transformers answers "scikit-learn is not installed" in ppoflow's processes.

``transformers.generation.candidate_generator``, imported by every causal-LM class (through
``GenerationMixin``), runs ``from sklearn.metrics import roc_curve`` when
``transformers.utils.import_utils.is_sklearn_available()`` is true. MLflow installs
scikit-learn, so that one line imports scikit-learn, SciPy's statistics and pandas: 1.4–1.7 s of a
run's start on a 2-core machine. transformers uses ``roc_curve`` only to tune the confidence
threshold of assisted (speculative) generation, which ppoflow never runs.

:func:`install` adds a finder to ``sys.meta_path`` that waits for
``transformers.utils.import_utils`` to be imported. Right after that module runs,
``is_sklearn_available()`` is asked once with ``sys.modules["sklearn"]`` set to ``None`` (which
makes ``importlib.util.find_spec`` answer "not installed"). The function is ``lru_cache``d, so
transformers keeps that answer for the process. ``sys.modules`` is then restored, so user code (a
reward function, a test) still imports scikit-learn as usual. The finder removes itself after that
one module; it never changes how any other module is found or loaded.

``stages/__init__.py`` installs it, so it is in place in every process that imports a ppoflow
stage before transformers (the command line, Ray workers, vLLM's in-process engine).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from types import ModuleType

#: the module whose ``is_sklearn_available`` is answered "no" right after it is imported
IMPORT_UTILS = "transformers.utils.import_utils"


def answer_sklearn_absent(import_utils: ModuleType) -> None:
    """Ask ``import_utils.is_sklearn_available()`` once with scikit-learn hidden, so its cached
    answer is False; scikit-learn itself stays importable (a module already imported is left)."""
    hide = "sklearn" not in sys.modules
    if hide:
        sys.modules["sklearn"] = None  # type: ignore[assignment]  # find_spec: "not installed"
    try:
        import_utils.is_sklearn_available()
    finally:
        if hide:
            del sys.modules["sklearn"]


class _AnswerAfterImport(importlib.abc.MetaPathFinder):
    """Finds :data:`IMPORT_UTILS` as the path finder would, with :func:`answer_sklearn_absent`
    run after the module's own code; declines every other name."""

    def find_spec(self, fullname, path, target=None):
        if fullname != IMPORT_UTILS:
            return None
        uninstall()
        spec = importlib.machinery.PathFinder.find_spec(fullname, path, target)
        if spec is None or spec.loader is None:
            return spec
        run_module = spec.loader.exec_module

        def exec_module(module: ModuleType) -> None:
            run_module(module)
            answer_sklearn_absent(module)

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def install() -> None:
    """Put the finder first on ``sys.meta_path``, unless transformers is already imported (then
    :func:`answer_sklearn_absent` could only come too late or be undone) or it is there."""
    if IMPORT_UTILS in sys.modules or any(isinstance(f, _AnswerAfterImport) for f in sys.meta_path):
        return
    sys.meta_path.insert(0, _AnswerAfterImport())


def uninstall() -> None:
    """Take the finder off ``sys.meta_path`` (a no-op when it is not there)."""
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _AnswerAfterImport)]
