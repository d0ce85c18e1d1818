"""Render the defaults as commented YAML: the source of ``configs/ppo_trainer.yaml``.

The defaults live in one place, the pydantic fields; this file is generated from them and a test
keeps the two equal. Regenerate with ``ppoflow config defaults > configs/ppo_trainer.yaml``.
"""

from __future__ import annotations

from pydantic import BaseModel
from pydantic_core import to_jsonable_python

from stages.config.errors import nested_model
from stages.config.loading import to_yaml
from stages.config.root import PPORunConfig

HEADER = """\
# ppoflow run config: every key with its default (verl 0.9.1's key names and values).
# GENERATED from the pydantic models in stages/config/ by render_default_yaml(); do not edit.
# Regenerate: ppoflow config defaults > configs/ppo_trainer.yaml
#
# Each key's comment says what it is and its unit in parentheses.
#   [ppoflow: ...]   the default or meaning differs from verl 0.9.1, and how
#   [ppoflow-only]   verl has no such key
#   "null = X"       the key inherits X when left null; `ppoflow config show` prints the resolved value
# Write your own config as a small file starting with `base: ppo_trainer.yaml` (see grpo.yaml),
# or override keys on the command line: ppoflow config show trainer.total_epochs=2.
# verl keys for features ppoflow does not have (fsdp_config, lora, multi_turn, use_v1, ...) are
# rejected with an error naming them rather than silently ignored.
"""


def render_default_yaml() -> str:
    """Every config key with its default value and its description as a comment above it."""
    return HEADER + "\n" + "\n".join(_render_model(PPORunConfig, indent=0, blank_between=True))


def _render_model(model: type[BaseModel], indent: int, blank_between: bool = False) -> list[str]:
    """The lines of ``model``'s fields at ``indent`` spaces, sections recursing."""
    pad, lines = " " * indent, []
    for name, field in model.model_fields.items():
        lines.append(f"{pad}# {field.description}")
        section = nested_model(field.annotation)
        if section is not None:
            lines.append(f"{pad}{name}:")
            lines.extend(_render_model(section, indent + 2))
        else:
            value = to_jsonable_python(field.get_default(call_default_factory=True))
            lines.append(pad + to_yaml({name: value}).rstrip("\n"))
        if blank_between:
            lines.append("")
    return lines
