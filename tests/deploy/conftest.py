"""Fixtures of the deployment checks: the compose file (raw and interpolated with .env.example),
Compose's variable interpolation, and .dockerignore matching — all without a Docker engine.

Interpolation follows the Compose Specification: ``$$`` is a literal ``$``; ``$VAR`` and
``${VAR}``; ``${VAR:-default}`` / ``${VAR-default}`` (default when unset-or-empty / unset),
``${VAR:?message}`` / ``${VAR?message}`` (error), ``${VAR:+alt}`` / ``${VAR+alt}``; operands may
nest (``${A:-${B:-x}}``). It applies to values, not keys.
"""

from __future__ import annotations

import re
import shutil
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
DOCKER = REPO / "docker"
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class InterpolationError(ValueError):
    """A ``${VAR:?message}`` whose variable is missing, or a malformed expression."""


def _braced_end(text: str, start: int) -> int:
    """Index of the ``}`` closing the ``${`` at ``start`` (nested braces counted)."""
    depth, i = 0, start
    while i < len(text):
        if text.startswith("${", i):
            depth, i = depth + 1, i + 2
            continue
        if text[i] == "}":
            depth -= 1
            if depth == 0:
                return i
        i += 1
    raise InterpolationError(f"unclosed '${{' at offset {start} in {text!r}")


def _braced(expr: str, env: Mapping[str, str]) -> str:
    match = _NAME.match(expr)
    if match is None:
        raise InterpolationError(f"invalid variable expression '${{{expr}}}'")
    name, rest = match.group(), expr[match.end() :]
    value = env.get(name)
    if rest == "":
        return value or ""
    for op in (":-", ":?", ":+", "-", "?", "+"):
        if rest.startswith(op):
            operand = interpolate(rest[len(op) :], env)
            is_set = value is not None and (value != "" or ":" not in op)
            if op.endswith("-"):
                return value if is_set else operand
            if op.endswith("?"):
                if not is_set:
                    raise InterpolationError(f"required variable {name} is missing: {operand}")
                return value
            return operand if is_set else ""
    raise InterpolationError(f"unsupported operator in '${{{expr}}}'")


def interpolate(text: str, env: Mapping[str, str]) -> str:
    """``text`` with every Compose variable expression replaced from ``env``."""
    out, i = [], 0
    while i < len(text):
        if text.startswith("$$", i):
            out.append("$")
            i += 2
        elif text.startswith("${", i):
            end = _braced_end(text, i)
            out.append(_braced(text[i + 2 : end], env))
            i = end + 1
        elif text[i] == "$" and (match := _NAME.match(text, i + 1)):
            out.append(env.get(match.group(), ""))
            i = match.end()
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


def interpolate_tree(node: Any, env: Mapping[str, str]) -> Any:
    """Interpolate every string value of a parsed YAML tree (keys are left alone)."""
    if isinstance(node, dict):
        return {key: interpolate_tree(value, env) for key, value in node.items()}
    if isinstance(node, list):
        return [interpolate_tree(value, env) for value in node]
    return interpolate(node, env) if isinstance(node, str) else node


def read_env_file(path: Path) -> dict[str, str]:
    """``KEY=VALUE`` lines of a dotenv file (comments and blank lines skipped, no quoting)."""
    env = {}
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        if not sep or not _NAME.fullmatch(key):
            raise ValueError(f"{path}:{number}: not a KEY=VALUE line: {line!r}")
        env[key] = value
    return env


def dockerignore_regex(pattern: str) -> re.Pattern[str]:
    """A .dockerignore pattern (Go filepath.Match plus ``**``) as a regex over /-paths."""
    pattern = pattern.strip("/")
    parts, i = [], 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            parts.append("(?:.*/)?")
            i += 3
        elif pattern.startswith("**", i):
            parts.append(".*")
            i += 2
        elif pattern[i] == "*":
            parts.append("[^/]*")
            i += 1
        elif pattern[i] == "?":
            parts.append("[^/]")
            i += 1
        else:
            parts.append(re.escape(pattern[i]))
            i += 1
    return re.compile("".join(parts) + r"\Z")


def dockerignore_excludes(patterns: list[str], path: str) -> bool:
    """Whether the build context leaves out ``path``: a pattern matches it or a parent folder
    (the last matching pattern wins; ``!`` patterns re-include)."""
    parts = path.strip("/").split("/")
    prefixes = ["/".join(parts[: n + 1]) for n in range(len(parts))]
    excluded = False
    for raw in patterns:
        negate = raw.startswith("!")
        regex = dockerignore_regex(raw[1:] if negate else raw)
        if any(regex.match(prefix) for prefix in prefixes):
            excluded = not negate
    return excluded


def find_tool(name: str) -> str | None:
    """A console script installed next to this Python (the venv), else on PATH."""
    local = Path(sys.executable).parent / name
    return str(local) if local.exists() else shutil.which(name)


@pytest.fixture(scope="session")
def compose_raw() -> dict[str, Any]:
    return yaml.safe_load((DOCKER / "compose.yaml").read_text(encoding="utf-8"))


@pytest.fixture(scope="session")
def env_example() -> dict[str, str]:
    return read_env_file(DOCKER / ".env.example")


@pytest.fixture(scope="session")
def compose(compose_raw: dict[str, Any], env_example: dict[str, str]) -> dict[str, Any]:
    """The compose file as `docker compose config` sees it with .env.example as .env (YAML
    merge keys are already resolved by the YAML loader)."""
    return interpolate_tree(compose_raw, env_example)


@pytest.fixture(scope="session")
def interpolator() -> Callable[[str, Mapping[str, str]], str]:
    return interpolate


@pytest.fixture(scope="session")
def tree_interpolator() -> Callable[[Any, Mapping[str, str]], Any]:
    return interpolate_tree


@pytest.fixture(scope="session")
def dockerignore() -> Callable[[str], bool]:
    lines = (REPO / ".dockerignore").read_text(encoding="utf-8").splitlines()
    patterns = [line.strip() for line in lines if line.strip() and not line.startswith("#")]
    return lambda path: dockerignore_excludes(patterns, path)


@pytest.fixture(scope="session")
def tool() -> Callable[[str], str | None]:
    return find_tool
