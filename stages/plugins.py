"""Plugin modules: user code named in ``ppoflow.plugins`` that registers estimators, losses, ….

A plugin is an importable module (or package) whose import registers entries with the registries'
decorators, for example::

    # my_estimators.py, on the PYTHONPATH
    from stages.algos.advantages import register_adv_est

    @register_adv_est("centered", group_based=True)
    def centered(token_level_rewards, response_mask, *, index=None, config=None, **_):
        ...  # (advantages (B, R), returns (B, R))

and a config selects it by name::

    ppoflow: {plugins: [my_estimators]}
    algorithm: {adv_estimator: centered}

The run config imports its plugins before it validates the registry names
(``stages.config.root``), and every Ray rank imports them again before it builds its worker
(``flows.engines.build_rank_worker``), since a rank is a process of its own. A plugin module must
be importable in both: installed, or on ``PYTHONPATH`` (:func:`plugin_roots` gives the directories
the driver found them under, which the Ray ranks get on their ``PYTHONPATH``).

:func:`plugin_source_files` lists the plugins' source files, for the stage cache keys.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Sequence
from importlib.machinery import ModuleSpec
from pathlib import Path
from types import ModuleType

#: the config key naming the plugin modules
PLUGINS_KEY = "ppoflow.plugins"


def import_plugins(names: Sequence[str]) -> list[ModuleType]:
    """Import each module named in ``names`` (in order; an imported module is not re-run).

    Raises:
        ImportError: one line naming the key, the module and the cause, for a module that cannot
            be imported (not found, or its code raised, e.g. a name registered twice).

    Example:
        >>> [m.__name__ for m in import_plugins(["json"])]
        ['json']
        >>> import_plugins(["no_such_plugin_xyz"])
        Traceback (most recent call last):
        ...
        ImportError: ppoflow.plugins[0]: cannot import module 'no_such_plugin_xyz': ModuleNotFoundError: No module named 'no_such_plugin_xyz'
    """
    modules = []
    for position, name in enumerate(names):
        _check_name(name, position)
        try:
            modules.append(importlib.import_module(name))
        except Exception as error:
            raise ImportError(_cannot_import(name, position, error)) from error
    return modules


def plugin_source_files(names: Sequence[str]) -> list[Path]:
    """The source files of the plugin modules, resolved and sorted: a module's own file, or
    every ``.py`` file under a package's directories. Found without running the plugins
    (a dotted name's parent packages are imported, as Python's import does).

    Raises:
        ImportError: as :func:`import_plugins`, for a module that cannot be found.

    Example:
        >>> [p.name for p in plugin_source_files(["json.decoder"])]
        ['decoder.py']
    """
    files: set[Path] = set()
    for position, name in enumerate(names):
        spec = _find_spec(name, position)
        if spec.submodule_search_locations is not None:  # a package, maybe a namespace package
            for location in spec.submodule_search_locations:
                files.update(p.resolve() for p in Path(location).rglob("*.py"))
        elif spec.origin is not None and Path(spec.origin).is_file():
            files.add(Path(spec.origin).resolve())
        else:
            raise ImportError(
                f"{PLUGINS_KEY}[{position}]: module {name!r} has no source file "
                f"(origin {spec.origin!r}); a plugin must be a .py module or a package"
            )
    return sorted(files)


def plugin_roots(names: Sequence[str]) -> list[str]:
    """The ``sys.path`` directories the plugin modules are found under, in order, without repeats:
    what another process (a Ray rank) needs on its ``PYTHONPATH`` to import them.

    Example:
        >>> import json
        >>> plugin_roots(["json.decoder"]) == [str(Path(json.__file__).resolve().parents[1])]
        True
    """
    roots: dict[str, None] = {}
    for position, name in enumerate(names):
        spec = _find_spec(name, position)
        depth = name.count(".")  # the module's file sits `depth` packages below its root
        if spec.submodule_search_locations is not None:
            location = Path(next(iter(spec.submodule_search_locations)))
            roots[str(location.resolve().parents[depth])] = None
        elif spec.origin is not None and Path(spec.origin).is_file():
            roots[str(Path(spec.origin).resolve().parents[depth])] = None
    return list(roots)


def _find_spec(name: str, position: int) -> ModuleSpec:
    _check_name(name, position)
    try:
        spec = importlib.util.find_spec(name)
    except Exception as error:  # a parent package that fails to import
        raise ImportError(_cannot_import(name, position, error)) from error
    if spec is None:
        raise ImportError(
            _cannot_import(name, position, ModuleNotFoundError(f"No module named {name!r}"))
        )
    return spec


def _check_name(name: object, position: int) -> None:
    if not isinstance(name, str) or not all(part.isidentifier() for part in name.split(".")):
        raise ImportError(
            f"{PLUGINS_KEY}[{position}]: got {name!r}; expected an importable module name such "
            "as 'my_plugins' or 'my_package.estimators'"
        )


def _cannot_import(name: str, position: int, error: BaseException) -> str:
    cause = " ".join(str(error).split())  # one line, whatever the cause's message
    return (
        f"{PLUGINS_KEY}[{position}]: cannot import module {name!r}: {type(error).__name__}: {cause}"
    )
