"""The base class of every config area: typed, frozen, and strict about unknown keys.

Conventions every area follows:

* each field carries ``Field(description="what it is (unit)")``; the description is the one place
  its meaning is written, and ``configs/ppo_trainer.yaml`` is rendered from it;
* a default that differs from verl 0.9.1 says so in the description with ``[ppoflow: …]``;
  a field verl does not have says ``[ppoflow-only]``;
* ``None`` on an "inherits" field means "take the value named in the description"; the root
  model fills it in (``stages.config.derived.fill_inherited``), so a validated config never
  holds an unresolved ``None`` there.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

# Choices shared by several areas (verl's spellings).
LossAggMode = Literal[
    "token-mean",
    "token-sum",
    "seq-mean-token-sum",
    "seq-mean-token-mean",
    "seq-mean-token-sum-norm",
]
Dtype = Literal["float32", "bfloat16", "float16"]


class ConfigModel(BaseModel):
    """A config area: unknown keys are errors, instances are immutable after validation.

    Make a changed copy with :func:`stages.config.apply_overrides` (re-validated), never by
    assigning to a field.
    """

    model_config = ConfigDict(
        extra="forbid", frozen=True, validate_assignment=True, coerce_numbers_to_str=True
    )
