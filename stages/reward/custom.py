"""Scorer references: which function scores a sample, in a form a worker process can re-import.

A :class:`ScorerRef` names a function by module or by Python file path plus its name. It is
picklable and cheap, so the reward loop's worker processes receive the reference and import the
scorer themselves (functions from a file, a ``__main__`` script or a closure cannot be pickled
by value across processes). This module imports only the standard library: worker processes
load it without torch.

A custom scorer (``reward.custom_reward_function.path`` + ``.name``, verl's signature
``compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs)``) is named by
:func:`scorer_ref` without importing it; the reward pool's zygote imports it when the run starts,
under a time bound, so a missing file, a file that fails to import or hangs, or a missing /
non-callable function fails at once, not at the first step. :func:`load_custom_scorer` validates
a file by importing it in the calling process (for tools and tests).
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DEFAULT_SCORER_MODULE = "stages.reward.scorers.registry"
DEFAULT_SCORER_NAME = "default_compute_score"


@dataclass(frozen=True)
class ScorerRef:
    """A scorer function by ``module`` (importable name) or ``path`` (a ``.py`` file), and ``name``.

    Exactly one of ``module`` / ``path`` is set. ``name`` may be dotted (``Class.method``).
    """

    name: str
    module: str | None = None
    path: str | None = None

    def __post_init__(self) -> None:
        if (self.module is None) == (self.path is None):
            raise ValueError(
                f"ScorerRef needs exactly one of module / path, got module={self.module!r}, "
                f"path={self.path!r}"
            )

    @property
    def label(self) -> str:
        return f"{self.path or self.module}:{self.name}"

    def resolve(self) -> Callable[..., Any]:
        """Import and return the function (raises ``FileNotFoundError`` / ``AttributeError`` / …)."""
        return self.lookup(self.load_module())

    def load_module(self) -> Any:
        return _import_file(Path(self.path)) if self.path else importlib.import_module(self.module)

    def lookup(self, module: Any) -> Callable[..., Any]:
        """``module.<name>``; a missing or non-callable attribute raises naming what exists."""
        obj: Any = module
        for part in self.name.split("."):
            if not hasattr(obj, part):
                public = sorted(n for n in dir(module) if not n.startswith("_"))
                raise AttributeError(
                    f"scorer {self.name!r} not found in {self.path or self.module}; "
                    f"it defines: {public}"
                )
            obj = getattr(obj, part)
        if not callable(obj):
            raise TypeError(f"scorer {self.label} is a {type(obj).__name__}, not a function")
        return obj

    @classmethod
    def of(cls, fn: Callable[..., Any]) -> ScorerRef:
        """The reference of a module-level function (a ``__main__`` function is referred to by file).

        Raises ``ValueError`` for lambdas, closures and other functions that cannot be re-imported.
        """
        qualname = getattr(fn, "__qualname__", "")
        module = getattr(fn, "__module__", None)
        if not module or "<" in qualname:
            raise ValueError(
                f"scorer {fn!r} cannot be re-imported by a worker process (a lambda, closure or "
                f"builtin); define it at module level or in a file"
            )
        if module == "__main__" or module.startswith(_FILE_MODULE_PREFIX):
            path = getattr(sys.modules[module], "__file__", None)
            if path is None:
                raise ValueError(
                    f"scorer {qualname!r} lives in an interactive __main__; use a file"
                )
            return cls(name=qualname, path=str(Path(path).resolve()))
        return cls(name=qualname, module=module)


DEFAULT_SCORER = ScorerRef(name=DEFAULT_SCORER_NAME, module=DEFAULT_SCORER_MODULE)
_FILE_MODULE_PREFIX = "ppoflow_custom_reward_"


def _import_file(path: Path) -> Any:
    """Import a ``.py`` file once per process under a name derived from its absolute path."""
    path = path.expanduser().resolve()
    if not path.is_file():
        raise FileNotFoundError(
            f"custom reward file {str(path)!r} does not exist "
            f"(set reward.custom_reward_function.path to an existing .py file)"
        )
    digest = hashlib.sha1(str(path).encode()).hexdigest()[:12]
    module_name = f"{_FILE_MODULE_PREFIX}{path.stem}_{digest}"
    if module_name in sys.modules:
        return sys.modules[module_name]
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"custom reward file {str(path)!r} is not an importable Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[module_name]
        raise
    return module


def load_custom_scorer(path: str | Path, name: str = "compute_score") -> ScorerRef:
    """Validate a custom scorer file now and return its reference.

    Raises:
        FileNotFoundError: ``path`` is not a file.
        ImportError: importing the file failed (the cause is chained).
        AttributeError / TypeError: ``name`` is missing or not callable.
    """
    ref = ScorerRef(name=name, path=str(Path(path).expanduser().resolve()))
    try:
        module = ref.load_module()
    except FileNotFoundError:
        raise
    except Exception as exc:
        raise ImportError(f"custom reward file {str(path)!r} failed to import: {exc!r}") from exc
    ref.lookup(module)
    return ref


def scorer_ref(path: str | Path | None, name: str = "compute_score") -> ScorerRef:
    """The reference of the custom scorer at ``path``, or the data_source router when None.

    Does not import the file: the reward pool's zygote does, under ``reward.startup_timeout_s``,
    so a file whose import hangs cannot stall this process. A missing file raises
    ``FileNotFoundError`` here.
    """
    if path is None:
        return DEFAULT_SCORER
    resolved = Path(path).expanduser().resolve()
    if not resolved.is_file():
        raise FileNotFoundError(
            f"custom reward file {str(path)!r} does not exist "
            f"(set reward.custom_reward_function.path to an existing .py file)"
        )
    return ScorerRef(name=name, path=str(resolved))


def is_async_scorer(fn: Callable[..., Any]) -> bool:
    """True for ``async def`` scorers (a worker awaits each call on its own event loop)."""
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
        getattr(fn, "__call__", None)  # noqa: B004 (callable objects with an async __call__)
    )


def wants_prompt(fn: Callable[..., Any]) -> bool:
    """True when the scorer's signature names a ``prompt_str`` parameter (it then gets the prompt)."""
    try:
        return "prompt_str" in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
