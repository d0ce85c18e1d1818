"""The step DAG, derived from the stage declarations and checked before any work is done.

The stages of a step form a chain in declaration order; each enabled stage reads keys that the
step's input batch holds or that an earlier enabled stage produces. :func:`plan_step` evaluates
every stage's ``when(config)``, keeps the enabled ones in order, records why the others are
skipped, and proves that every enabled stage's ``requires`` will be there when it runs: a
misconfigured pipeline fails at start-up with the stage and the key named.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from stages.stage import KeyRef, Stage


@dataclass(frozen=True)
class StepPlan:
    """The enabled stages in run order, and ``{stage name: reason}`` for the skipped ones."""

    stages: tuple[Stage, ...]
    skipped: dict[str, str]

    @property
    def names(self) -> list[str]:
        return [stage.name for stage in self.stages]


def batch_keys(batch: Any) -> set[KeyRef]:
    """Every key a DataProto holds, as KeyRefs of its three layers."""
    keys = {KeyRef("non_tensor_batch", name) for name in batch.non_tensor_batch}
    keys |= {KeyRef("meta_info", name) for name in batch.meta_info}
    if batch.batch is not None:
        keys |= {KeyRef("batch", name) for name in batch.batch.keys()}  # noqa: SIM118 (iter walks rows)
    return keys


def skip_reason(stage: Stage) -> str:
    """Why a stage whose ``when(config)`` is False does not run, naming its condition."""
    condition = getattr(stage.when, "__name__", "when")
    if condition == "<lambda>":
        condition = "when"
    arguments = "config, step" if stage.needs_step else "config"
    return f"disabled: {condition}({arguments}) is False"


def _check_names(stages: Sequence[Stage]) -> None:
    seen: set[str] = set()
    for stage in stages:
        if not isinstance(stage, Stage):
            raise TypeError(f"plan_step expects Stage objects, got {type(stage).__name__}")
        if stage.name in seen:
            raise ValueError(f"stage name {stage.name!r} appears twice; stage names are unique")
        seen.add(stage.name)


def _enabled(stage: Stage, config: Any, step: int | None) -> bool:
    decision = stage.enabled(config, step)
    if not isinstance(decision, bool):
        raise TypeError(
            f"stage {stage.name!r}: when(config) returned {type(decision).__name__} "
            f"{decision!r}; it must return a bool"
        )
    return decision


def _missing_message(stage: Stage, missing: list[KeyRef], producers: dict[KeyRef, str]) -> str:
    parts = []
    for key in missing:
        where = producers.get(key)
        parts.append(
            f"{key} (produced by stage {where!r}, which is disabled)"
            if where
            else f"{key} (no stage produces it and the input batch lacks it)"
        )
    return (
        f"stage {stage.name!r} requires {', '.join(parts)}; fix the config or the stage list "
        "before the step starts"
    )


def plan_step(
    stages: Sequence[Stage], config: Any, initial_keys: Iterable[KeyRef], step: int | None = None
) -> StepPlan:
    """Enabled stages in order, checked: every required key is available when the stage runs.

    Args:
        stages: every stage of the step, in run order.
        config: the run config handed to each ``when``.
        initial_keys: the keys of the step's input batch (:func:`batch_keys`).
        step: the global step, for conditions ``when(config, step)`` (required by those).

    Raises:
        KeyError: an enabled stage requires a key that neither the input batch nor an earlier
            enabled stage provides (names the stage, the key, and a disabled producer if any).
        ValueError: two stages share a name, or a key would be produced twice (by two enabled
            stages, or by a stage while the input batch already holds it): union keeps the
            first value, so the second producer would silently not take effect.
    """
    _check_names(stages)
    available = {key: "the input batch" for key in initial_keys}
    all_producers = {key: stage.name for stage in stages for key in stage.produces}
    enabled, skipped = [], {}
    for stage in stages:
        if not _enabled(stage, config, step):
            skipped[stage.name] = skip_reason(stage)
            continue
        missing = [key for key in stage.requires if key not in available]
        if missing:
            raise KeyError(_missing_message(stage, missing, all_producers))
        produced = [key for key in stage.produces if key.name != stage.reorders]
        for key in produced:
            if key in available:
                raise ValueError(
                    f"stage {stage.name!r} produces {key}, which {available[key]} already "
                    "provides; a key has exactly one producer in a step"
                )
            available[key] = f"stage {stage.name!r}"
        enabled.append(stage)
    return StepPlan(stages=tuple(enabled), skipped=skipped)


def stages_between(stages: Sequence[Stage], start: str, stop: str | None = None) -> list[str]:
    """Names of the stages from ``start`` through ``stop`` (inclusive; the end when None).

    For ``ppoflow rerun --from START --to STOP``: the stages to recompute.
    """
    names = [stage.name for stage in stages]
    for name in (start, stop):
        if name is not None and name not in names:
            raise KeyError(f"no stage named {name!r}; stages: {names}")
    first = names.index(start)
    last = len(names) - 1 if stop is None else names.index(stop)
    if last < first:
        raise ValueError(f"stage {stop!r} runs before {start!r}; --to must not precede --from")
    return names[first : last + 1]
