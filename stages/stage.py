"""The stage contract: what a stage of the PPO step reads, writes, and when it runs.

A stage is a plain function ``fn(batch, ctx) -> DataProto`` that returns ONLY the keys it
produces (a delta) and never mutates its input. The flow (``flows/``) derives the step DAG from
these declarations: it checks before any work that every enabled stage's ``requires`` are produced
upstream, selects the required keys, calls the stage, stores the delta as an artifact and unions it
into the step batch. Nothing here knows about Prefect.
"""

from __future__ import annotations

import hashlib
import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from dataproto import DataProto

Layer = Literal["batch", "non_tensor_batch", "meta_info"]


@dataclass(frozen=True)
class KeyRef:
    """One key of one DataProto layer, e.g. ``KeyRef("batch", "responses")``."""

    layer: Layer
    name: str

    def __str__(self) -> str:
        return f"{self.layer}.{self.name}"


def tensor(name: str) -> KeyRef:
    return KeyRef("batch", name)


def non_tensor(name: str) -> KeyRef:
    return KeyRef("non_tensor_batch", name)


def meta(name: str) -> KeyRef:
    return KeyRef("meta_info", name)


@dataclass
class StageContext:
    """What a stage may use besides its input batch.

    config: the run config (``stages.config.PPORunConfig``); a stage reads only its own slice.
    engines: role → engine (actor, critic, ref, rollout, reward_model), owned by the run.
    step: the global step this stage runs in (1-based).
    metrics: the stage adds scalar metrics here (``area/name`` → float); the flow logs them.
    """

    config: Any
    engines: dict[str, Any] = field(default_factory=dict)
    step: int = 0
    metrics: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class DerivedKey:
    """A tensor a stage produces that its artifact need not store: ``build`` makes it again from
    other tensors (of the stage's inputs or of its own delta), so it is rebuilt when the delta is
    loaded.

    needs: the tensor keys ``build`` reads, each required by or produced by the stage.
    build: ``build(tensors) -> Tensor``, ``tensors`` the needed keys by name; a pure function.
    """

    needs: tuple[KeyRef, ...]
    build: Callable[[Mapping[str, Any]], Any]


@dataclass(frozen=True)
class Stage:
    """A named, versioned unit of the PPO step.

    name: the stage's name and its timer name (``timing_s/<name>``), e.g. ``"old_log_prob"``.
    version: bump when the stage's output for the same inputs changes (invalidates caches).
    requires / produces: the keys it reads / adds.
    when: ``when(config) -> bool`` or ``when(config, step) -> bool`` (the global step, 1-based),
        the stage's condition (e.g. values only with a critic, update_actor after critic_warmup).
    config_keys: dotted config paths the stage reads (part of its cache key).
    file_keys: dotted config paths naming files or directories the stage reads (a reward file,
        a tokenizer or reward-model directory); their *contents'* digests enter the cache key,
        in place of the paths (a path listed here need not be in ``config_keys``).
    seeded: the stage's output depends on random sampling, seeded per step from
        ``trainer.seed`` and the global step (:func:`step_seed`); both enter its cache key, so a
        cache hit and a recomputation agree.
    reads_weights / writes_weights: whether it depends on or changes model state.
    fn: ``fn(batch, ctx) -> DataProto``, returning only ``produces``.
    optional: keys passed to the stage when the batch holds them (no error when absent); the
        present ones are part of the cache key (e.g. the reward stage's ``extra_info``).
    extra_outputs: layers in which the delta may hold keys beyond ``produces``, named at run time
        (the reward extras of the reward stage). Later stages cannot require them.
    engine: the ``ctx.engines`` role whose weights the stage reads or writes (``"actor"``), for
        the weights fingerprint of its cache key.
    reorders: the name of a (B,) int64 permutation key in ``produces``: the step flow reorders
        the whole step batch by it after the stage (row i becomes row ``perm[i]``) and drops the
        key from the batch (the artifact keeps it). The balance stage uses it.
    derived: produced tensor key name → :class:`DerivedKey`: keys the artifact leaves out when
        they equal what ``build`` makes of its inputs and the stored keys (checked on every
        save), rebuilt on load (the rollout's ``input_ids`` from the prompts and responses).
    code_modules: ``code_modules(config) -> module names`` whose source files the stage runs
        although it does not import them (the rollout's tool classes, imported in the tool
        sandbox): their files join the stage's code fingerprint, as plugins' do.
    keys_for_config: ``keys_for_config(config) -> (config keys, file keys)`` the stage reads
        under that config only, beyond ``config_keys`` / ``file_keys`` (the rollout reads the
        reward's settings when it scores the trajectories itself): part of its cache key then,
        and only then.
    """

    name: str
    version: int
    requires: tuple[KeyRef, ...]
    produces: tuple[KeyRef, ...]
    fn: Callable[[DataProto, StageContext], DataProto]
    when: Callable[[Any], bool] = lambda config: True
    config_keys: tuple[str, ...] = ()
    file_keys: tuple[str, ...] = ()
    seeded: bool = False
    reads_weights: bool = False
    writes_weights: bool = False
    optional: tuple[KeyRef, ...] = ()
    extra_outputs: tuple[Layer, ...] = ()
    engine: str | None = None
    reorders: str | None = None
    derived: Mapping[str, DerivedKey] = field(default_factory=dict)
    code_modules: Callable[[Any], tuple[str, ...]] = lambda config: ()
    keys_for_config: Callable[[Any], tuple[tuple[str, ...], tuple[str, ...]]] = lambda config: (
        (),
        (),
    )

    def config_keys_of(self, config: Any) -> tuple[str, ...]:
        """``config_keys`` and the config keys ``keys_for_config`` adds for ``config``."""
        return (*self.config_keys, *self.keys_for_config(config)[0])

    def file_keys_of(self, config: Any) -> tuple[str, ...]:
        """``file_keys`` and the file keys ``keys_for_config`` adds for ``config``."""
        return (*self.file_keys, *self.keys_for_config(config)[1])

    def __post_init__(self) -> None:
        if self.reorders is not None and tensor(self.reorders) not in self.produces:
            raise ValueError(
                f"stage {self.name!r}: reorders={self.reorders!r} must name a tensor key it "
                f"produces (produces: {[str(k) for k in self.produces]})"
            )
        readable = (set(self.requires) | set(self.produces)) - {tensor(n) for n in self.derived}
        for name, derivation in self.derived.items():
            if tensor(name) not in self.produces or not set(derivation.needs) <= readable:
                raise ValueError(
                    f"stage {self.name!r}: derived key {name!r} must be a tensor it produces, "
                    f"built from keys it requires or stores (needs: "
                    f"{[str(k) for k in derivation.needs]})"
                )

    @property
    def needs_step(self) -> bool:
        """Whether ``when`` takes the global step as its second argument."""
        try:
            params = inspect.signature(self.when).parameters.values()
        except (TypeError, ValueError):
            return False
        positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        return len(positional) >= 2

    def enabled(self, config: Any, step: int | None = None) -> Any:
        """``when(config)`` or ``when(config, step)``; a step-dependent condition needs ``step``."""
        if not self.needs_step:
            return self.when(config)
        if step is None:
            raise ValueError(
                f"stage {self.name!r}: its condition depends on the global step; pass step="
            )
        return self.when(config, step)

    def missing_inputs(self, batch: DataProto) -> list[KeyRef]:
        """The required keys ``batch`` does not hold (empty when the stage can run)."""
        present = {
            "batch": set(batch.batch.keys()) if batch.batch is not None else set(),
            "non_tensor_batch": set(batch.non_tensor_batch),
            "meta_info": set(batch.meta_info),
        }
        return [ref for ref in self.requires if ref.name not in present[ref.layer]]

    def check_inputs(self, batch: DataProto) -> None:
        """Raise ``KeyError`` naming the stage and every missing key, before any work is done."""
        missing = self.missing_inputs(batch)
        if missing:
            names = ", ".join(str(ref) for ref in missing)
            raise KeyError(
                f"stage {self.name!r} requires {names}, which the batch does not hold; "
                f"an upstream stage must produce it (batch has: {sorted(_all_keys(batch))})"
            )


def step_seed(seed: int, step: int, purpose: str) -> int:
    """A 63-bit seed for ``purpose`` (a stage name) in global step ``step`` of a run seeded
    ``seed``: the same in every process and every resume, different for each step and purpose.

    >>> step_seed(42, 1, "rollout") == step_seed(42, 1, "rollout") != step_seed(42, 2, "rollout")
    True
    """
    text = f"ppoflow-step-seed-v1\n{int(seed)}\n{int(step)}\n{purpose}".encode()
    return int.from_bytes(hashlib.sha256(text).digest()[:8], "big") >> 1


def round_purpose(purpose: str, batch: DataProto) -> str:
    """``purpose`` in generation round ``meta_info["gen_round"]`` of a step with dynamic sampling
    (DAPO): unchanged in round 1 (or without the key), ``<purpose>/round<r>`` after, so each
    round of a step samples with its own seed (:func:`step_seed`).

    >>> round_purpose("rollout", DataProto.from_dict(meta_info={"gen_round": 2}))
    'rollout/round2'
    """
    gen_round = int(batch.meta_info.get("gen_round", 1))
    return purpose if gen_round == 1 else f"{purpose}/round{gen_round}"


def _all_keys(batch: DataProto) -> set[str]:
    keys = set(batch.non_tensor_batch) | set(batch.meta_info)
    if batch.batch is not None:
        keys |= set(batch.batch.keys())
    return keys
