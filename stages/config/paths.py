"""Where run configs are found: a file path, or a name in the repository's ``configs/``.

Kept apart from the loader so that a command line can check a config's path (and answer a
missing one in one line) before it imports the schema, its registries and torch.
"""

from __future__ import annotations

from pathlib import Path

from stages.config.errors import ConfigError

REPO_ROOT = Path(__file__).resolve().parents[2]
CONFIGS_DIR = REPO_ROOT / "configs"


def resolve_config_path(name: str | Path) -> Path:
    """A config file path, or a name in the repo's configs/ ('grpo' or 'grpo.yaml').

    Raises:
        ConfigError: neither a file nor a name in configs/ (the message lists the packaged ones).
    """
    path = Path(name).expanduser()
    if path.is_file():
        return path
    for candidate in (CONFIGS_DIR / str(name), CONFIGS_DIR / f"{name}.yaml"):
        if candidate.is_file():
            return candidate
    known = sorted(p.stem for p in CONFIGS_DIR.glob("*.yaml"))
    raise ConfigError(
        [
            f"config file not found: {str(name)!r} (not a file here, nor in {CONFIGS_DIR}; "
            f"packaged configs: {known})"
        ],
        str(name),
    )
