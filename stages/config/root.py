"""``PPORunConfig``: the whole run config, composed of one model per area.

The sections and their fields are declared in :class:`~stages.config.schema_run.RunSchema` (which
``verl_keys`` reads to tell ppoflow's keys from verl's); this module adds the validation.
Validation order: verl's keys are read as ppoflow's (``verl_keys``), the ``ppoflow.plugins`` modules are
imported (so the names they register pass the registry checks), every area validates its own fields,
then the "null = inherit" fields are filled (``derived.fill_inherited``) and the cross-field rules
run on the filled config (``checks``). Derived flags and sizes are read from ``cfg.derived``.

Build one with :func:`stages.config.load_config` / :func:`stages.config.validate_config`, which
turn pydantic's errors into one readable :class:`stages.config.ConfigError`.
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Mapping
from typing import Any

from pydantic import PrivateAttr, model_validator
from pydantic_core import PydanticCustomError

from stages.config.checks import cross_field_problems, cross_field_warnings
from stages.config.derived import DerivedConfig, compute_derived, fill_inherited
from stages.config.errors import ConfigNotice, ConfigWarning
from stages.config.schema_run import RunSchema
from stages.config.verl_keys import translate_verl_keys
from stages.plugins import import_plugins

CROSS_FIELD_ERROR = "cross_field"


class PPORunConfig(RunSchema):
    """One PPO-family training run: verl's areas plus ``ppoflow``'s own (the sections of
    :class:`~stages.config.schema_run.RunSchema`), validated as the module says."""

    # The input mapping this config was validated from (before filling), so overrides applied
    # later re-resolve the inherited keys instead of keeping stale copies.
    _source: dict[str, Any] = PrivateAttr(default_factory=dict)

    @model_validator(mode="wrap")
    @classmethod
    def _resolve_and_check(cls, data: Any, handler: Any) -> PPORunConfig:
        """Read verl keys as ppoflow's, import ``ppoflow.plugins``, validate fields, fill inherited
        keys, then run the cross-field rules."""
        if isinstance(data, PPORunConfig):
            return data
        data = _translate(data)
        _import_plugins(_raw_plugins(data))  # before the fields: their registry names are valid
        cfg = handler(data)  # `self` when called from __init__, so it is completed in place:
        # the filled sections are fresh copies and `cfg` is new, so no shared default is touched.
        _import_plugins(cfg.ppoflow.plugins)  # the validated list (a no-op when imported)
        cfg.__dict__.update(fill_inherited(cfg).__dict__)
        problems = cross_field_problems(cfg)
        if problems:
            raise PydanticCustomError(
                CROSS_FIELD_ERROR, "{problems}", {"problems": "\n".join(problems)}
            )
        for message in cross_field_warnings(cfg):
            warnings.warn(message, ConfigWarning, stacklevel=2)
        cfg._source = copy.deepcopy(dict(data)) if isinstance(data, Mapping) else {}
        return cfg

    def __eq__(self, other: object) -> bool:
        """Equal when every resolved value is equal (how each config was written is ignored)."""
        if not isinstance(other, PPORunConfig):
            return NotImplemented
        return self.__dict__ == other.__dict__

    __hash__ = None  # type: ignore[assignment]  # lists inside: not hashable

    @property
    def derived(self) -> DerivedConfig:
        """use_critic, use_reference_policy, use_rm, dp_size and the batch sizes in sequences."""
        return compute_derived(self, cross_field_warnings(self))

    @property
    def source(self) -> dict[str, Any]:
        """A copy of the mapping this config was validated from (its explicit settings)."""
        return copy.deepcopy(self._source)

    def steps_per_epoch(self, train_dataset_len: int) -> int:
        """Training steps in one epoch: ``len // data.gen_batch_size`` (the loader's batches; the
        last partial one is dropped, as verl's loader does). gen_batch_size is train_batch_size
        unless DAPO's dynamic sampling draws larger rounds; then, as in verl's DAPO recipe, an
        epoch counts its generation batches (a step may use several).

        >>> PPORunConfig().steps_per_epoch(2500)
        2
        """
        train, size = (
            self.data.train_batch_size,
            self.data.gen_batch_size or self.data.train_batch_size,
        )
        steps = train_dataset_len // size
        if steps < 1:
            key = "data.train_batch_size" if size == train else "data.gen_batch_size"
            raise ValueError(
                f"the training set has {train_dataset_len} rows, fewer than one batch of "
                f"{key} = {size}; lower the batch size or add data"
            )
        return steps

    def resolve_total_training_steps(self, train_dataset_len: int) -> int:
        """trainer.total_training_steps if set, else steps_per_epoch × trainer.total_epochs
        (verl's rule; this is also the length of the learning-rate schedules).

        >>> PPORunConfig().resolve_total_training_steps(2500)
        60
        """
        if self.trainer.total_training_steps is not None:
            return self.trainer.total_training_steps
        return self.steps_per_epoch(train_dataset_len) * self.trainer.total_epochs


def _translate(data: Any) -> Any:
    """``data`` in ppoflow's keys (a no-op for a tree :func:`stages.config.load_config` already
    translated); a verl feature ppoflow lacks is a config problem, a mapped key a notice."""
    if not isinstance(data, Mapping):
        return data
    translated = translate_verl_keys(data)
    if translated.problems:
        raise PydanticCustomError(
            CROSS_FIELD_ERROR, "{problems}", {"problems": "\n".join(translated.problems)}
        )
    for notice in translated.notices:
        warnings.warn(notice, ConfigNotice, stacklevel=4)
    return translated.tree


def _raw_plugins(data: Any) -> Any:
    """``ppoflow.plugins`` of the raw input, or None where the input has no such mapping."""
    section = data.get("ppoflow") if isinstance(data, Mapping) else None
    return section.get("plugins") if isinstance(section, Mapping) else None


def _import_plugins(plugins: Any) -> None:
    """Import the ``ppoflow.plugins`` modules when ``plugins`` is a list of names (a malformed
    value is left for the field's own validation to report); a failure is a config problem."""
    if not isinstance(plugins, list | tuple) or not all(isinstance(p, str) for p in plugins):
        return
    try:
        import_plugins(plugins)
    except ImportError as error:
        raise PydanticCustomError(
            CROSS_FIELD_ERROR, "{problems}", {"problems": str(error)}
        ) from None
