"""Fingerprints of the code a stage runs: its module's import closure, by file content.

A stage's output depends on the code that computes it, so its cache key holds a fingerprint of
that code (flows/cache/keys.py). The granularity is the **import closure of the stage's
module** within ppoflow's computing packages (``dataproto``, ``stages``) and the user's plugin
modules (``ppoflow.plugins``):

* start from the module that defines the stage's function; a stage that reads or writes weights
  also starts from every module of ``stages.engines`` (the engines it calls are built by the
  flow, not imported by the stage module);
* follow every ``import`` / ``from … import`` of a first-party module anywhere in a module's
  source (function-level lazy imports included), every quoted string that names a
  first-party module (``importlib.import_module`` tables), and every parent package's
  ``__init__`` (Python runs it on import). The source is scanned as text, not parsed: an
  import written in a docstring counts too, which can only add files;
* the plugin modules enter every stage's closure: a plugin may register into any registry.

``flows/`` (orchestration) is not covered: it decides what runs and where results go, not what
a stage computes from its inputs, config and weights. An edit there (a CLI message, a log
line) therefore keeps every cache entry. Nor is ``stages.config`` (the typed config: loading,
validation, defaults): what a stage reads of the config enters its key as *values*
(``config_keys``), so a changed default is a changed value there, while a reworded error
message changes nothing.

The fingerprint is ``sha256("ppoflow-code-v1" | for each file, sorted: name \\t BLAKE3(bytes))``
where ``name`` is the file's path relative to the directory holding its top-level package
(``stages/algos/advantages_group.py``), so a copied checkout with the same files gives the same
fingerprint. The closure is found once per process and the files are hashed once per process,
so the per-step cost is a dictionary lookup.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import re
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

from flows.cache.user_files import file_blake3

CODE_FORMAT = "ppoflow-code-v1"
#: the packages whose code computes a stage's output (``flows`` only orchestrates)
COMPUTING_PACKAGES = ("dataproto", "stages")
#: where a weight-reading or -writing stage's engine code starts
ENGINE_PACKAGE = "stages.engines"
#: packages left out of every closure (module docstring): config values are keyed by value
EXCLUDED_PACKAGES = ("stages.config",)


def _is_first_party(name: str, roots: Sequence[str]) -> bool:
    excluded = any(name == pkg or name.startswith(pkg + ".") for pkg in EXCLUDED_PACKAGES)
    return name.split(".", 1)[0] in roots and not excluded


@functools.lru_cache(maxsize=16)
def _package_dir(top: str) -> Path | None:
    """The directory of top-level package ``top`` (found once; it is imported already)."""
    module = sys.modules.get(top)
    paths = list(getattr(module, "__path__", []) or []) if module is not None else []
    if not paths:
        spec = importlib.util.find_spec(top)
        paths = list(spec.submodule_search_locations or []) if spec is not None else []
    return Path(paths[0]).resolve() if paths else None


@functools.lru_cache(maxsize=4096)
def module_file(name: str) -> Path | None:
    """The source file of first-party module ``name`` (a package's ``__init__.py``), or None
    when no such file exists. Found on disk below its top-level package, without importing
    anything (``importlib.util.find_spec`` would import the parent packages)."""
    top, *rest = name.split(".")
    base = _package_dir(top)
    if base is None:
        return None
    target = base.joinpath(*rest)
    for candidate in (target / "__init__.py", target.with_suffix(".py")):
        if candidate.is_file():
            return candidate
    return None


def package_modules(name: str) -> list[str]:
    """``name`` and, when it is a package, every module below it (from the files on disk)."""
    path = module_file(name)
    if path is None or path.name != "__init__.py":
        return [name]
    found = [name]
    for file in sorted(path.parent.rglob("*.py")):
        parts = file.relative_to(path.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        if parts and all(part.isidentifier() for part in parts):
            found.append(".".join([name, *parts]))
    return found


def _parents(name: str) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


_IMPORT = re.compile(r"^[ \t]*import[ \t]+([\w. \t,]+)", re.MULTILINE)
_FROM_IMPORT = re.compile(
    r"^[ \t]*from[ \t]+(\.*)([\w.]*)[ \t]+import[ \t]+(\([^)]*\)|[^\n#;]*)", re.MULTILINE
)
_QUOTED_NAME = re.compile(r"""["']([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+)["']""")


def _imported_names(source: str, module: str, is_package: bool) -> set[str]:
    r"""Module names ``source`` imports (``import a.b``, ``from .x import y`` with ``y`` maybe a
    submodule; relative imports resolved against ``module``) or names in a quoted string.

    A scan of the text, not a parse (parsing every module would cost more than the scan): an
    import line inside a docstring counts too, which can only add files to the closure.

    >>> sorted(_imported_names("from . import b\nimport c.d as e\nT = {'x': 'f.g'}", "p.a", False))
    ['c.d', 'f.g', 'p', 'p.b']
    """
    names: set[str] = set()
    package = module if is_package else module.rpartition(".")[0]
    for match in _IMPORT.finditer(source):
        names.update(part.split()[0] for part in match.group(1).split(",") if part.strip())
    for match in _FROM_IMPORT.finditer(source):
        dots, base, imported = match.groups()
        if dots:
            parts = package.split(".")
            anchor = parts[: len(parts) - len(dots) + 1]
            base = ".".join([*anchor, base] if base else anchor)
        names.add(base)
        for part in imported.strip("() \t\n").replace("\n", ",").split(","):
            words = part.split()
            if words and words[0].isidentifier():
                names.add(f"{base}.{words[0]}")
    names.update(_QUOTED_NAME.findall(source))
    return names


@functools.lru_cache(maxsize=4096)
def _imports_of(name: str, path: Path) -> frozenset[str]:
    source = path.read_text(encoding="utf-8")
    return frozenset(_imported_names(source, name, path.name == "__init__.py"))


@functools.lru_cache(maxsize=256)
def _closure(starts: tuple[str, ...], roots: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
    """((module name, file path), …) of every first-party module reachable from ``starts``."""
    seen: dict[str, Path] = {}
    pending = [name for start in starts for name in (*_parents(start), start)]
    while pending:
        name = pending.pop()
        if name in seen or not _is_first_party(name, roots):
            continue
        path = module_file(name)
        if path is None:
            continue
        seen[name] = path
        for found in _imports_of(name, path):
            if _is_first_party(found, roots) and found not in seen:
                pending.extend([*_parents(found), found])
    return tuple(sorted((name, str(path)) for name, path in seen.items()))


def _display_name(module: str, path: Path) -> str:
    """``stages/algos/advantages_group.py``: the path below the top-level package's parent."""
    depth = len(module.split(".")) + (1 if path.name == "__init__.py" else 0)
    return "/".join(path.parts[-depth:])


def stage_modules(fn_module: str | None, uses_engines: bool) -> tuple[str, ...]:
    """The module names a stage's closure starts from (module docstring)."""
    engines = package_modules(ENGINE_PACKAGE) if uses_engines else []
    return tuple(sorted({*([fn_module] if fn_module else []), *engines}))


def function_module(fn: Any) -> str | None:
    """The module defining ``fn`` (through ``functools.partial``), or None."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    return getattr(fn, "__module__", None)


def outside_module_file(module: str | None) -> dict[str, Path]:
    """{``module:<name>``: its file} for a stage function defined outside ``dataproto`` /
    ``stages`` (a user's own stage, a test's), so its own source is covered too."""
    if module is None or _is_first_party(module, COMPUTING_PACKAGES):
        return {}
    origin = getattr(sys.modules.get(module), "__file__", None)
    if origin is None or not origin.endswith(".py") or not Path(origin).is_file():
        return {}
    return {f"module:{module}": Path(origin)}


def code_files(starts: Iterable[str], plugins: Mapping[str, Path] | None = None) -> dict[str, str]:
    """{display name: BLAKE3 of the file} for the closure of ``starts`` plus the plugin files.

    Args:
        starts: module names the closure starts from (module docstring).
        plugins: display name → file of each plugin module (``plugin:<module>`` names).
    """
    files = {
        _display_name(name, Path(path)): file_blake3(path)
        for name, path in _closure(tuple(sorted(starts)), COMPUTING_PACKAGES)
    }
    files.update({name: file_blake3(path) for name, path in (plugins or {}).items()})
    return files


def code_fingerprint(files: Mapping[str, str]) -> str:
    """The fingerprint of a set of files (module docstring) from :func:`code_files`' mapping.

    >>> code_fingerprint({"a.py": "0" * 64}) == code_fingerprint({"a.py": "0" * 64})
    True
    >>> code_fingerprint({"a.py": "0" * 64}) != code_fingerprint({"a.py": "1" * 64})
    True
    """
    text = "\n".join(f"{name}\t{files[name]}" for name in sorted(files))
    return hashlib.sha256(f"{CODE_FORMAT}\n{text}".encode()).hexdigest()


def changed_files(old: Mapping[str, str], new: Mapping[str, str]) -> list[str]:
    """The names whose digest differs, or that exist on one side only, sorted.

    >>> changed_files({"a.py": "1", "b.py": "2"}, {"a.py": "1", "b.py": "3", "c.py": "4"})
    ['b.py', 'c.py']
    """
    return sorted(name for name in set(old) | set(new) if old.get(name) != new.get(name))


@dataclass(frozen=True)
class StageCode:
    """The code a stage runs: {file name: BLAKE3 digest} and their :func:`code_fingerprint`."""

    fingerprint: str
    files: Mapping[str, str]


@functools.lru_cache(maxsize=256)
def _own_code(fn_module: str | None, uses_engines: bool) -> Mapping[str, str]:
    files = code_files(stage_modules(fn_module, uses_engines), outside_module_file(fn_module))
    return MappingProxyType(files)


def plugin_files(plugins: Sequence[str]) -> dict[str, str]:
    """{``plugin:<path>``: BLAKE3} of the plugin modules' files, where they are found now (a
    plugin re-imported from elsewhere is seen), re-hashed when a file's size or mtime changes."""
    if not plugins:
        return {}
    from stages.plugins import plugin_source_files

    return {f"plugin:{path}": file_blake3(path) for path in plugin_source_files(list(plugins))}


def stage_code(stage: Any, plugins: Sequence[str] = ()) -> StageCode:
    """The code ``stage`` runs (module docstring). ppoflow's own files are found and hashed once
    per process: the process runs the code it imported, so an edit on disk after that is not
    what it runs. The plugins' files are looked up on every call."""
    uses_engines = bool(stage.reads_weights or stage.writes_weights)
    files = {**_own_code(function_module(stage.fn), uses_engines), **plugin_files(plugins)}
    return _stage_code(tuple(sorted(files.items())))


@functools.lru_cache(maxsize=1024)
def _stage_code(items: tuple[tuple[str, str], ...]) -> StageCode:
    files = dict(items)
    return StageCode(code_fingerprint(files), MappingProxyType(files))


def run_code(stages: Iterable[Any], plugins: Sequence[str] = ()) -> StageCode:
    """The union of the code of ``stages`` (a training's whole step): what a checkpoint records,
    so a resume can say that the code changed since."""
    files: dict[str, str] = {}
    for stage in stages:
        files.update(stage_code(stage, plugins).files)
    return StageCode(code_fingerprint(files), MappingProxyType(files))


def code_change_notice(saved: Mapping[str, str] | None, current: Mapping[str, str]) -> str | None:
    """One line saying which files changed since a checkpoint's code, or None when none did
    (or the checkpoint predates code manifests).

    >>> code_change_notice({"a.py": "1"}, {"a.py": "2"})
    'the code changed since this checkpoint (a.py): stages whose code changed recompute'
    >>> code_change_notice({"a.py": "1"}, {"a.py": "1"}) is None
    True
    """
    if not saved:
        return None
    changed = changed_files(saved, current)
    if not changed:
        return None
    shown = ", ".join(changed[:4]) + (f" and {len(changed) - 4} more" if len(changed) > 4 else "")
    return f"the code changed since this checkpoint ({shown}): stages whose code changed recompute"
