"""Engine checkpoints (save / load / prune) and the plain Hugging Face export, all atomic.

Layout (verl's): ``root/global_step_{N}/{actor,critic}`` per role and ``root/
latest_checkpointed_iteration.txt`` = N. One role's checkpoint directory holds:

- ``state/`` — DeepSpeed's own files (``engine.save_checkpoint``): weights and optimizer state,
  ZeRO partitions of every rank (plus DeepSpeed's ``zero_to_fp32.py``);
- ``lr_scheduler.pt`` — the per-training-step LR schedule (``engine.ppoflow_lr_scheduler``, which
  DeepSpeed does not own, see ``deepspeed_setup.initialize_engine``), plain values only;
- ``rng_state_rank{r}.pt`` — python / numpy / torch CPU / CUDA generator states of rank r, tensors
  and plain numbers only (read back with ``torch.load(weights_only=True)``);
- ``client_state.json`` — the caller's small state (step counters, data-loader position, …);
- ``ppoflow_checkpoint.json`` — the role's manifest (format, world size, ZeRO stage; with LoRA
  the ``adapter`` record: its settings and the base model's fingerprint), written last.

With LoRA adapters (``stages.engines.adapters``) ``state/`` holds the adapter parameters (and a
critic's value head) and their optimizer state only: the frozen base is not saved
(DeepSpeed's ``exclude_frozen_parameters``), it is the model directory the engine is built from,
and a load checks that the engine's adapter record — the base model's fingerprint included — is
the checkpoint's.

The step above the roles gets its own manifest, the digest of every file of every role
(``stages/engines/checkpoint_manifest.py``), which the flows check before a load
(``flows/runs/checkpoints.py``). Loading here reads no file with ``torch.load(weights_only=False)``:
the engine's DeepSpeed files go through a weights-only checkpoint engine, the LR schedule and RNG
states through ``weights_only_load`` (``stages/engines/safe_load.py``); a file that names any
other Python global is refused with one line naming it, and so is an exception DeepSpeed's load
raises (a damaged file, or an engine built with other settings).

Atomicity: everything is written into ``.{name}.partial`` beside the final directory, then renamed
into place; an existing checkpoint is renamed aside to ``.{name}.old`` first and deleted after the
new one is in (and renamed back if the new one cannot be). A failure leaves no directory under the
final name other than the previous, intact one, and no ``.partial``; the tracker is written to a
``.partial`` file and replaced, so a failed write leaves the old tracker. With several ranks every
rank calls these functions (DeepSpeed's save is collective); rank 0 does the renames between
barriers, so the directory must be on a file system all ranks share.

A full disk (``dataproto.artifact_store.DISK_FULL_ERRNOS``) raises its ``OSError`` naming the
file being written. ``torch.save`` to a path would raise an opaque ``RuntimeError`` ("unexpected
pos …") instead, so every torch file, DeepSpeed's included (:func:`_python_file_writes`), is
written through a Python file object (:func:`save_torch_file`).
"""

from __future__ import annotations

import json
import os
import random
import shutil
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from dataproto.artifact_store import naming_failed_writes
from stages.engines.checkpoint_manifest import (
    STEP_DIR,
    CheckpointIntegrityError,
    fsync_dir,
    step_directory,
)
from stages.engines.critic import ValueModel
from stages.engines.logprob import ResponseLogProbModel
from stages.engines.safe_load import install_weights_only_loader, weights_only_load

FORMAT_VERSION = 1
STATE_TAG = "state"
MANIFEST = "ppoflow_checkpoint.json"
CLIENT_STATE = "client_state.json"
LR_SCHEDULER = "lr_scheduler.pt"
LATEST_FILE = "latest_checkpointed_iteration.txt"  # verl's tracker name


# --- paths and the latest-step tracker ---


def checkpoint_dir(root: str | Path, step: int, role: str) -> Path:
    """``root/global_step_{step}/{role}`` (role: actor, critic, …)."""
    if not role or "/" in role or role.startswith("."):
        raise ValueError(f"role must be a plain directory name such as 'actor', got {role!r}")
    return step_directory(root, step) / role


def write_latest_step(root: str | Path, step: int) -> None:
    """Atomically write ``root/latest_checkpointed_iteration.txt`` = step (temp file + replace)."""
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError(f"step must be an int ≥ 0, got {step!r}")
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    partial = root / f".{LATEST_FILE}.partial"
    try:
        with naming_failed_writes(partial), open(partial, "w", encoding="utf-8") as handle:
            handle.write(str(step))
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(partial, root / LATEST_FILE)
    except BaseException:  # a full disk included: the previous tracker stays
        partial.unlink(missing_ok=True)
        raise
    fsync_dir(root)


def read_latest_step(root: str | Path) -> int | None:
    """The step in ``root/latest_checkpointed_iteration.txt``; None when there is no tracker."""
    path = Path(root) / LATEST_FILE
    if not path.is_file():
        return None
    text = path.read_text(encoding="utf-8").strip()
    if not text.isdigit():
        raise ValueError(f"{path} should hold a non-negative step number, got {text!r}")
    return int(text)


def checkpoint_steps(root: str | Path) -> list[int]:
    """Steps of the ``global_step_N`` directories under ``root``, ascending."""
    root = Path(root)
    if not root.is_dir():
        return []
    matches = (STEP_DIR.fullmatch(entry.name) for entry in root.iterdir() if entry.is_dir())
    return sorted(int(m.group(1)) for m in matches if m)


def prune_checkpoints(root: str | Path, keep_last: int | None) -> list[Path]:
    """Delete all but the ``keep_last`` newest ``global_step_N`` directories (None = keep all).

    The step named by the latest tracker is always kept. Returns the deleted directories.
    """
    if keep_last is None:
        return []
    if isinstance(keep_last, bool) or not isinstance(keep_last, int) or keep_last < 1:
        raise ValueError(f"keep_last must be an int ≥ 1 or None (keep all), got {keep_last!r}")
    steps = checkpoint_steps(root)
    keep = set(steps[-keep_last:]) | {read_latest_step(root)}
    removed = [Path(root) / f"global_step_{s}" for s in steps if s not in keep]
    for path in removed:
        shutil.rmtree(path)
    return removed


# --- engine state ---


def save_engine_checkpoint(
    engine,
    directory: str | Path,
    *,
    client_state: dict[str, Any] | None = None,
    adapter: dict[str, Any] | None = None,
) -> Path:
    """Save weights, optimizer, LR scheduler, RNG states and ``client_state`` (JSON-serialisable)
    to ``directory`` atomically, replacing an existing checkpoint there. Returns ``directory``.

    ``adapter``: the engine trains LoRA adapters (``roles.adapter_record``): only its trainable
    parameters are saved, and the manifest records it."""
    directory = Path(directory)
    client_json = _client_state_json(client_state)
    rng_state = capture_rng_state()  # before DeepSpeed's save can touch any generator
    rank, world_size = _rank(), _world_size()
    partial = _sibling(directory, "partial")
    if rank == 0:
        directory.parent.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(partial, ignore_errors=True)  # a leftover of an interrupted save
    _barrier()
    try:
        trainable_only = _trainable_state_only(engine) if adapter is not None else nullcontext()
        with naming_failed_writes(partial), _python_file_writes(engine), trainable_only:
            engine.save_checkpoint(
                str(partial),
                tag=STATE_TAG,
                client_state={},
                save_latest=False,
                exclude_frozen_parameters=adapter is not None,
            )
        save_torch_file(rng_state, partial / _rng_file(rank))
        if rank == 0:
            _write_text(partial / CLIENT_STATE, client_json)
            scheduler = _lr_scheduler(engine)
            if scheduler is not None:
                save_torch_file(scheduler.state_dict(), partial / LR_SCHEDULER)
            manifest = {
                "format": FORMAT_VERSION,
                "world_size": world_size,
                "zero_stage": int(engine.zero_optimization_stage()),
                "deepspeed_tag": STATE_TAG,
                "lr_scheduler": scheduler is not None,
                "adapter": adapter,
            }
            _barrier()  # every rank's files are in before the manifest marks the save complete
            _write_text(partial / MANIFEST, json.dumps(manifest, indent=2))
            _replace_dir(partial, directory)
        else:
            _barrier()
    except BaseException:
        if rank == 0:
            shutil.rmtree(partial, ignore_errors=True)
        raise
    _barrier()
    return directory


def load_engine_checkpoint(
    engine, directory: str | Path, *, adapter: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Restore what :func:`save_engine_checkpoint` wrote into ``engine`` (built with the same
    settings and world size, and the same ``adapter`` record: the same LoRA settings on the same
    base model) and this process's RNG states; returns the client_state."""
    directory = Path(directory)
    manifest = _read_manifest(directory)
    saved = (manifest.get("world_size"), manifest.get("zero_stage"), manifest.get("lr_scheduler"))
    here = (_world_size(), int(engine.zero_optimization_stage()), _lr_scheduler(engine) is not None)
    if saved != here:
        raise ValueError(
            f"checkpoint {directory} was saved with (world_size, zero_stage, lr_scheduler)="
            f"{saved}; this engine has {here}. Load it into an engine built with the same settings."
        )
    check_adapter_record(directory, manifest.get("adapter"), adapter)
    _load_deepspeed_state(engine, directory, manifest["deepspeed_tag"], adapter is not None)
    scheduler = _lr_scheduler(engine)
    if scheduler is not None:
        scheduler.load_state_dict(weights_only_load(directory / LR_SCHEDULER))
    client_state = json.loads((directory / CLIENT_STATE).read_text(encoding="utf-8"))
    restore_rng_state(weights_only_load(directory / _rng_file(_rank())))
    return client_state


def check_adapter_record(
    directory: Path, saved: dict[str, Any] | None, here: dict[str, Any] | None
) -> None:
    """The checkpoint's adapter record is the engine's: both full training, or the same LoRA
    settings on a base model with the same fingerprint (one line naming what differs)."""
    if saved == here:
        return
    if saved is None or here is None:
        kinds = ("full weights", "LoRA adapters")
        raise ValueError(
            f"checkpoint {directory} holds {kinds[saved is not None]}, but this engine trains "
            f"{kinds[here is not None]}; load it with the LoRA keys of the run that saved it"
        )
    differ = sorted(k for k in {*saved, *here} if saved.get(k) != here.get(k))
    if "base_model" in differ:
        raise ValueError(
            f"checkpoint {directory} holds LoRA adapters trained on another base model "
            f"(fingerprint {saved.get('base_model')}; this model.path has {here.get('base_model')}); "
            "build the run on the base model it was trained on"
        )
    raise ValueError(
        f"checkpoint {directory} holds LoRA adapters with other settings "
        f"({', '.join(f'{k}: {saved.get(k)!r} there, {here.get(k)!r} here' for k in differ)}); "
        "load it with the LoRA keys of the run that saved it"
    )


def _load_deepspeed_state(engine, directory: Path, tag: str, adapters_only: bool) -> None:
    """``engine.load_checkpoint`` through the weights-only reader; DeepSpeed's own failures
    (a bare ``StopIteration`` or ``KeyError`` from a damaged optimizer state) become one line.
    ``adapters_only``: the module file holds the trainable parameters only (the frozen base is
    the engine's own), so the module is loaded non-strictly."""
    install_weights_only_loader(engine)
    try:
        load_path, _ = engine.load_checkpoint(
            str(directory),
            tag=tag,
            load_module_strict=not adapters_only,
            load_optimizer_states=True,
            load_lr_scheduler_states=True,
        )
    except CheckpointIntegrityError:
        raise
    except Exception as err:
        message = " ".join(str(err).split()) or "no message"
        raise CheckpointIntegrityError(
            f"checkpoint {directory / tag}: DeepSpeed's load failed with {type(err).__name__} "
            f"({message[:300]}): its files are damaged, or this engine was built with other "
            "settings than the one that saved it"
        ) from err
    if load_path is None:
        raise FileNotFoundError(f"DeepSpeed found no engine state under {directory / tag}")


def _read_manifest(directory: Path) -> dict[str, Any]:
    """The manifest, after checking that every file this rank needs is present."""
    if not directory.is_dir():
        old = _sibling(directory, "old")
        hint = (
            f"; an interrupted overwrite left the previous checkpoint at {old}"
            if old.is_dir()
            else ""
        )
        raise FileNotFoundError(f"no checkpoint directory at {directory}{hint}")
    manifest_path = directory / MANIFEST
    manifest = (
        json.loads(manifest_path.read_text(encoding="utf-8")) if manifest_path.is_file() else {}
    )
    needed = [MANIFEST, CLIENT_STATE, STATE_TAG, _rng_file(_rank())]
    needed += [LR_SCHEDULER] if manifest.get("lr_scheduler") else []
    missing = [name for name in needed if not (directory / name).exists()]
    if missing:
        raise FileNotFoundError(
            f"checkpoint {directory} is incomplete: missing {missing} (expected a directory "
            "written by save_engine_checkpoint)"
        )
    if manifest.get("format") != FORMAT_VERSION:
        raise ValueError(
            f"checkpoint {directory} has format {manifest.get('format')!r}; this version of "
            f"ppoflow reads format {FORMAT_VERSION}"
        )
    return manifest


def _lr_scheduler(engine):
    """The engine's per-training-step LR schedule (None for an engine without one)."""
    return getattr(engine, "ppoflow_lr_scheduler", None)


def _client_state_json(client_state: dict[str, Any] | None) -> str:
    try:
        return json.dumps(client_state or {}, indent=2, sort_keys=True, allow_nan=True)
    except (TypeError, ValueError) as error:
        raise TypeError(
            f"client_state must be JSON-serialisable (numbers, strings, lists, dicts): {error}"
        ) from None


# --- RNG states ---


def capture_rng_state() -> dict[str, Any]:
    """Python, numpy, torch CPU (and CUDA) generator states as tensors and plain numbers, so they
    round-trip through ``torch.load(weights_only=True)``."""
    version, internal, gauss_next = random.getstate()
    kind, keys, position, has_gauss, cached = np.random.get_state()
    state = {
        "python": [version, torch.tensor(internal, dtype=torch.int64), gauss_next],
        "numpy": [kind, torch.from_numpy(keys.astype(np.int64)), position, has_gauss, cached],
        "torch_cpu": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["torch_cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng_state(state: dict[str, Any]) -> None:
    """Set every generator :func:`capture_rng_state` recorded (CUDA only where present)."""
    version, internal, gauss_next = state["python"]
    random.setstate((version, tuple(int(x) for x in internal.tolist()), gauss_next))
    kind, keys, position, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), position, has_gauss, cached))
    torch.set_rng_state(state["torch_cpu"])
    if "torch_cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["torch_cuda"])


# --- Hugging Face export ---


def hf_model_of(engine_or_module) -> nn.Module:
    """The plain Hugging Face model inside an engine or wrapper: ``ResponseLogProbModel.lm`` (actor,
    reference), ``ValueModel.backbone`` (critic), or the model itself."""
    module = engine_or_module
    if hasattr(module, "save_checkpoint") and isinstance(
        getattr(module, "module", None), nn.Module
    ):
        module = module.module  # a DeepSpeed engine
    if isinstance(module, ResponseLogProbModel):
        return module.lm
    if isinstance(module, ValueModel):
        return module.backbone
    if hasattr(module, "save_pretrained") and isinstance(module, nn.Module):
        return module
    raise TypeError(
        f"cannot export {type(engine_or_module).__name__}: expected a DeepSpeed engine, a "
        "ResponseLogProbModel, a ValueModel or a Hugging Face PreTrainedModel"
    )


def export_hf_model(engine_or_module, directory: str | Path, tokenizer=None) -> Path:
    """Write a plain Hugging Face model directory (``from_pretrained`` loads it) atomically.

    ZeRO-3 partitions are gathered first (on every rank — call this on every rank); rank 0 writes.
    The critic is saved as its token-classification model (``load_value_model`` restores it).
    """
    import deepspeed

    model = hf_model_of(engine_or_module)
    directory = Path(directory)
    params = list(model.parameters())
    with deepspeed.zero.GatheredParameters(params, modifier_rank=None):
        state_dict = {
            name: tensor.detach().cpu().clone() for name, tensor in model.state_dict().items()
        }
    if _rank() == 0:
        partial = _sibling(directory, "partial")
        shutil.rmtree(partial, ignore_errors=True)
        try:
            model.save_pretrained(partial, state_dict=state_dict)
            if tokenizer is not None:
                tokenizer.save_pretrained(partial)
            _replace_dir(partial, directory)
        except BaseException:
            shutil.rmtree(partial, ignore_errors=True)
            raise
    _barrier()
    return directory


# --- file-system and process-group helpers ---


def save_torch_file(obj: Any, path: str | Path, **kwargs: Any) -> None:
    """``torch.save(obj, …, **kwargs)`` through a Python file object, so a failed write (a full
    disk) raises its ``OSError`` naming ``path``; ``torch.save`` to a path raises
    ``RuntimeError("… unexpected pos …")`` with no errno."""
    with naming_failed_writes(path), open(path, "wb") as handle:
        try:
            torch.save(obj, handle, **kwargs)
        except RuntimeError as err:  # torch's writer hides the file object's OSError here
            failed = err.__context__
            if not isinstance(failed, OSError):
                raise
            raise OSError(failed.errno, failed.strerror, os.fspath(path)) from err


class _PythonFileCheckpointEngine:
    """DeepSpeed's ``TorchCheckpointEngine`` (possibly inside ``safe_load``'s weights-only
    wrapper) with ``save`` = :func:`save_torch_file`; everything else is the wrapped engine's."""

    def __init__(self, inner: Any, zipfile_serialization: bool) -> None:
        self.inner, self.zipfile_serialization = inner, zipfile_serialization

    def save(self, state_dict: Any, path: str) -> None:
        save_torch_file(state_dict, path, _use_new_zipfile_serialization=self.zipfile_serialization)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


@contextmanager
def _trainable_state_only(engine) -> Iterator[None]:
    """Within the block ``engine``'s module state dict holds its trainable parameters only.
    DeepSpeed's ``exclude_frozen_parameters`` drops the frozen ones it finds by name in
    ``named_parameters()``, which lists a tied parameter once: the tied output head
    (``lm_head.weight``, the frozen embedding matrix) would stay in every adapter checkpoint."""
    module_state_dict = engine.module_state_dict

    def trainable(*args: Any, **kwargs: Any) -> Any:
        state = module_state_dict(*args, **kwargs)
        params = engine.module.named_parameters(remove_duplicate=False)
        frozen = {name for name, param in params if not param.requires_grad}
        return type(state)((name, value) for name, value in state.items() if name not in frozen)

    engine.module_state_dict = trainable
    try:
        yield
    finally:
        del engine.module_state_dict  # the class's method again


@contextmanager
def _python_file_writes(engine) -> Iterator[None]:
    """Within the block ``engine``'s DeepSpeed files are written by :func:`save_torch_file`
    (module docstring); another checkpoint engine than DeepSpeed's torch one is left as it is."""
    from deepspeed.runtime.checkpoint_engine.torch_checkpoint_engine import TorchCheckpointEngine

    current = getattr(engine, "checkpoint_engine", None)
    torch_engine = getattr(current, "inner", current)  # safe_load's wrapper keeps it in .inner
    if type(torch_engine) is not TorchCheckpointEngine:
        yield
        return
    engine.checkpoint_engine = _PythonFileCheckpointEngine(
        current, bool(torch_engine.zipfile_serialization)
    )
    try:
        yield
    finally:
        engine.checkpoint_engine = current


def _write_text(path: Path, text: str) -> None:
    with naming_failed_writes(path), open(path, "w", encoding="utf-8") as handle:
        handle.write(text)


def _sibling(directory: Path, suffix: str) -> Path:
    return directory.parent / f".{directory.name}.{suffix}"


def _replace_dir(new: Path, final: Path) -> None:
    """Rename ``new`` to ``final``; an existing ``final`` is renamed aside first, deleted after."""
    old = _sibling(final, "old")
    shutil.rmtree(old, ignore_errors=True)
    had_final = final.exists()
    if had_final:
        os.rename(final, old)
    try:
        os.rename(new, final)
    except BaseException:
        if had_final:  # the previous checkpoint goes back under its name
            os.rename(old, final)
        raise
    fsync_dir(final.parent)
    shutil.rmtree(old, ignore_errors=True)


def _rng_file(rank: int) -> str:
    return f"rng_state_rank{rank}.pt"


def _distributed() -> bool:
    return torch.distributed.is_available() and torch.distributed.is_initialized()


def _rank() -> int:
    return torch.distributed.get_rank() if _distributed() else 0


def _world_size() -> int:
    return torch.distributed.get_world_size() if _distributed() else 1


def _barrier() -> None:
    if _world_size() > 1:
        torch.distributed.barrier()
