"""Reading checkpoint files without running code from them: ``torch.load(weights_only=True)``.

A ``.pt`` file is a pickle, and a pickle can name any Python callable, which ``torch.load``
with ``weights_only=False`` calls. DeepSpeed 0.19 loads its own files that way
(``TorchCheckpointEngine.load``, ``deepspeed.utils.zero_to_fp32``), so ppoflow reads every
checkpoint file through :func:`weights_only_load` instead: torch's restricted unpickler builds
tensors, containers and plain values, plus exactly the DeepSpeed classes its state files hold
(:func:`deepspeed_state_types`, found by saving ZeRO 0 / 1 / 2 / 3 checkpoints of an actor and a
critic in float32 and bfloat16 and loading each file: the model-state files need none, the
optimizer-state files of ZeRO 1–3 the stage enum and the loss scaler, those of ZeRO 1–2 also a
tensor fragment's address). An enum member is pickled by the enum's ``__reduce_ex__``: by value,
``ZeroStageEnum(2)``, in CPython 3.11.7 and 3.12, but by name, ``getattr(ZeroStageEnum,
'optimizer_states')``, in early 3.11 releases (Debian bookworm's 3.11.2 among them); so the
global ``builtins.getattr`` is allowed as :func:`enum_member_by_name`, which builds exactly a
member, by its name, of an enum class among those types and refuses every other ``getattr``.
Any other global is refused before it is built, with one
:class:`~stages.engines.checkpoint_manifest.CheckpointIntegrityError` line naming the file and
the global and saying that the file holds a pickled object safe loading refuses (a crafted
checkpoint whose manifest was re-recorded passes the digest check and stops here); torch's own
advice to load such a file unsafely is never passed on.

- :func:`install_weights_only_loader` wraps a DeepSpeed engine's checkpoint engine in a
  :class:`WeightsOnlyCheckpointEngine` (DeepSpeed's own torch engine with a weights-only
  ``load``), so ``engine.load_checkpoint`` reads through it;
- :func:`weights_only_torch` makes a module's ``torch.load`` weights-only for the length of a
  block (``deepspeed.utils.zero_to_fp32``, which the ZeRO-3 export calls).
"""

from __future__ import annotations

import enum
import os
import pickle
import re
import types
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from stages.engines.checkpoint_manifest import CheckpointIntegrityError

#: torch's weights-only unpickler names the global it refuses in one of two ways: "Unsupported
#: global: GLOBAL x.y was not an allowed global by default" and "Trying to load unsupported GLOBAL
#: x.y whose module x is blocked"
_GLOBAL = re.compile(r"(?:Unsupported global: GLOBAL|unsupported GLOBAL) (\S+)")
#: its other refusals of an object it will not build (a class or call the file names)
_REFUSED = re.compile(
    r"(Can only (?:build|create new object|append|extend|set)[^\n]*|Trying to call reduce for "
    r"unrecognized function[^\n]*|\S+ must be imported to load[^\n]*)"
)
_REASON = re.compile(r"WeightsUnpickler error:\s*(\S[^\n]*)")
#: torch's advice to load the file unsafely, cut from every line ppoflow prints
_UNSAFE = re.compile(r"weights_only|arbitrary code|trusted source", re.IGNORECASE)


def deepspeed_state_types() -> list[type]:
    """The DeepSpeed classes its state files hold (module docstring): the ZeRO stage enum, the
    loss scaler's plain attributes, a tensor fragment's (start, numel) address."""
    from deepspeed.runtime.fp16.loss_scaler import LossScaler
    from deepspeed.runtime.zero.config import ZeroStageEnum
    from deepspeed.utils.tensor_fragment import fragment_address

    return [ZeroStageEnum, LossScaler, fragment_address]


def enum_member_by_name(cls: Any, name: Any) -> enum.Enum:
    """``builtins.getattr`` as an enum member's pickle calls it (module docstring):
    ``cls[name]`` when ``cls`` is an enum class among :func:`deepspeed_state_types` and ``name``
    one of its members' names.

    Raises:
        pickle.UnpicklingError: any other ``getattr`` (another object, an attribute that is
            not a member); the message names the global as torch's own refusals do.
    """
    allowed = [t for t in deepspeed_state_types() if isinstance(t, enum.EnumMeta)]
    if cls in allowed and isinstance(name, str) and name in cls.__members__:
        return cls[name]
    target = str(getattr(cls, "__qualname__", type(cls).__qualname__))
    raise pickle.UnpicklingError(
        f"Unsupported global: GLOBAL builtins.getattr (called on {target[:80]} with "
        f"{str(name)[:80]!r}; only a member of an allowed enum class is built by name)"
    )


def _allowed_globals() -> list[Any]:
    """What :func:`weights_only_load` allows beyond torch's own list."""
    return [*deepspeed_state_types(), (enum_member_by_name, "builtins.getattr")]


def weights_only_load(
    path: str | os.PathLike, map_location: Any = None, *, mmap: bool = False
) -> Any:
    """``torch.load(path, weights_only=True)`` allowing :func:`deepspeed_state_types` and
    their enum members pickled by name (:func:`enum_member_by_name`).

    Raises:
        CheckpointIntegrityError: the file holds a pickled object safe loading refuses (the
            global it names is named), or is not a torch file at all (damaged or truncated).
            Neither line advises loading the file unsafely.
    """
    try:
        with torch.serialization.safe_globals(_allowed_globals()):
            return torch.load(path, map_location=map_location, weights_only=True, mmap=mmap)
    except pickle.UnpicklingError as err:
        refused = _refused_object(str(err))
        if refused is None:
            raise _unreadable(path, err) from None
        raise CheckpointIntegrityError(
            f"refusing to read {os.fspath(path)}: {refused}; the checkpoint holds a pickled "
            "object that safe loading refuses (ppoflow never builds what a checkpoint names "
            "beyond tensors, plain values and DeepSpeed's state classes, which is all a "
            "checkpoint it wrote holds), so this file was crafted or written by another "
            "program: restore it from a copy you trust, or resume from another checkpoint"
        ) from None
    except OSError:
        raise
    except Exception as err:  # any other failure of a pure read: bytes torch cannot parse
        raise _unreadable(path, err) from None


def _refused_object(message: str) -> str | None:
    """What torch's weights-only unpickler refused to build, from its error message: ``it names
    x.y`` (the global the file names), or its own words for another refused object; None when
    the message is not a refusal (the bytes do not parse).

    >>> _refused_object("Unsupported global: GLOBAL os.getenv was not an allowed global by default.")
    'it names os.getenv'
    >>> _refused_object("Trying to load unsupported GLOBAL posix.system whose module posix is blocked.")
    'it names posix.system'
    >>> _refused_object("Unsupported operand 149") is None
    True
    """
    named = _GLOBAL.search(message)
    if named is not None:
        return f"it names {named.group(1)}"
    other = _REFUSED.search(message)
    return None if other is None else f"torch says: {other.group(1).strip()[:200]}"


def _unreadable(path: str | os.PathLike, err: Exception) -> CheckpointIntegrityError:
    """One line for a file torch cannot parse; torch's long weights-only preamble (and its
    advice to load the file unsafely) is cut to the unpickler's own reason."""
    text = str(err)
    reason = _REASON.search(text)
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    safe = [line for line in lines if not _UNSAFE.search(line)]
    what = reason.group(1) if reason else (safe or ["no reason given"])[0]
    return CheckpointIntegrityError(
        f"checkpoint file {os.fspath(path)} cannot be read as a torch file "
        f"({type(err).__name__}: {what[:200]}); it is damaged or truncated"
    )


def _load_ignoring_weights_only(
    f: Any, map_location: Any = None, *, weights_only: bool | None = None, mmap: bool = False
) -> Any:
    """A ``torch.load`` stand-in for DeepSpeed's readers: weights-only whatever they ask."""
    return weights_only_load(f, map_location, mmap=mmap)


class WeightsOnlyCheckpointEngine:
    """A DeepSpeed checkpoint engine whose ``load`` is :func:`weights_only_load`; everything else
    (``save``, ``commit``, …) is the wrapped engine's own."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def load(self, path: str, map_location: Any = None) -> Any:
        return weights_only_load(path, map_location)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def install_weights_only_loader(engine: Any) -> None:
    """Make ``engine.load_checkpoint`` read its files with :func:`weights_only_load`: the
    engine's ``TorchCheckpointEngine`` (what ppoflow's DeepSpeed config selects) is wrapped in a
    :class:`WeightsOnlyCheckpointEngine`. Idempotent.

    Raises:
        TypeError: the engine uses another checkpoint engine (DeepSpeed's fast / decoupled /
            DataStates writers), whose reads this module does not cover.
    """
    from deepspeed.runtime.checkpoint_engine.torch_checkpoint_engine import TorchCheckpointEngine

    current = engine.checkpoint_engine
    if isinstance(current, WeightsOnlyCheckpointEngine):
        return
    if type(current) is not TorchCheckpointEngine:
        raise TypeError(
            f"the engine reads checkpoints with {type(current).__name__}; ppoflow loads "
            "checkpoints only through DeepSpeed's TorchCheckpointEngine (weights-only reads)"
        )
    engine.checkpoint_engine = WeightsOnlyCheckpointEngine(current)


@contextmanager
def weights_only_torch(module: types.ModuleType) -> Iterator[None]:
    """Within the block, ``module.torch.load`` is :func:`weights_only_load` (every other
    attribute is torch's); for DeepSpeed readers that call ``torch.load(weights_only=False)``
    themselves. Only ``module``'s global name ``torch`` changes, and only meanwhile."""
    original = module.torch
    proxy = types.ModuleType("torch", "torch, with weights-only torch.load")
    proxy.__getattr__ = lambda name: getattr(torch, name)  # type: ignore[method-assign]
    proxy.load = _load_ignoring_weights_only  # type: ignore[attr-defined]
    module.torch = proxy
    try:
        yield
    finally:
        module.torch = original


__all__ = [
    "deepspeed_state_types",
    "enum_member_by_name",
    "install_weights_only_loader",
    "weights_only_load",
    "weights_only_torch",
]
