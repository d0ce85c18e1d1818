"""What ppoflow build this is: the package version and, in a git checkout, the commit.

Both are printed by ``ppoflow --version`` and tag every MLflow run, so a dashboard says which
code produced a curve.
"""

from __future__ import annotations

import functools
import subprocess
from importlib import metadata
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]


@functools.cache
def ppoflow_version() -> str:
    """The installed package's version (``pyproject.toml``), or ``unknown`` when not installed."""
    try:
        return metadata.version("ppoflow")
    except metadata.PackageNotFoundError:
        return "unknown"


@functools.cache
def source_commit() -> str | None:
    """The checkout's commit (short hash, ``+dirty`` with uncommitted changes to tracked files),
    or None outside a git checkout (e.g. an installed wheel)."""
    if not (REPO_ROOT / ".git").exists():
        return None
    try:
        commit = _git("rev-parse", "--short=12", "HEAD")
        dirty = _git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError):
        return None
    return commit + ("+dirty" if dirty else "")


def version_line() -> str:
    """``ppoflow 0.1.0 (commit 1a2b3c4d5e6f)``."""
    commit = source_commit()
    return f"ppoflow {ppoflow_version()}" + (f" (commit {commit})" if commit else "")


def _git(*args: str) -> str:
    done = subprocess.run(
        ["git", "-C", str(REPO_ROOT), *args], capture_output=True, text=True, timeout=10, check=True
    )
    return done.stdout.strip()


__all__ = ["ppoflow_version", "source_commit", "version_line"]
