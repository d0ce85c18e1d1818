"""Export the actor of a checkpoint as a plain Hugging Face model directory: ``ppoflow export``.

A LoRA run's checkpoint (adapters only, ``flows/export_lora.py``) exports as a PEFT adapter
directory (``adapter_config.json`` + ``adapter_model.safetensors``, written by PEFT's
``save_pretrained``, plus the tokenizer), or with ``merged`` as the merged model, a model
directory as below; ``merged`` on a full-training checkpoint changes nothing (its weights are
the model already).

The output directory holds ``model.safetensors``, ``config.json``, ``generation_config.json``
and the tokenizer files, written with the transformers API (``PreTrainedModel.save_pretrained``
— transformers 5 writes safetensors only, so there is no ``safe_serialization`` switch left to
set — and ``tokenizer.save_pretrained``), plus ``ppoflow_export.json`` naming what it came from.
``AutoModelForCausalLM.from_pretrained(OUT)``, vLLM and ``actor_rollout_ref.model.path=OUT``
load it as they load any model directory.

Where the weights are: a run's checkpoints are under its config's ``trainer.default_local_dir``
(``flows/runs/checkpoints.py``): ``global_step_<K>/actor`` is the actor engine's directory
(``stages/engines/checkpoint.py``), whose ``state/`` holds DeepSpeed's files. The architecture
(``config.json``), the generation config and the tokenizer come from the run's
``actor_rollout_ref.model.path`` and ``tokenizer_path``: a checkpoint holds weights only. Given
a checkpoint directory instead of a run, the base model directory is passed as ``base``.

Checked before it is read: the step's manifest (``stages/engines/checkpoint_manifest.py``)
must list the actor's files with their sizes and BLAKE3 digests, and every file must match
(``verify="full"``, the default; ``"fast"`` checks sizes only), else one
``CheckpointIntegrityError`` line names the file.

Reading DeepSpeed's files without running code from them. They are torch pickles, and a pickle
can name any Python callable. Everything here is read with ``torch.load(weights_only=True)``
(``stages/engines/safe_load.py``), whose unpickler builds only tensors, containers, plain values
and the three DeepSpeed classes its optimizer state holds, and refuses any other global, naming
the file and the global:

- ZeRO 0–2: ``state/mp_rank_00_model_states.pt`` holds the whole model (``module``) in the
  compute dtype — the weights the engine generates with. It loads as it is (memory-mapped, so
  the optimizer state in the same file is not read).
- ZeRO 3: each rank's model file holds placeholders; the parameters are the fp32 partitions in
  the ``*_optim_states.pt`` files, which DeepSpeed's documented
  ``deepspeed.utils.zero_to_fp32.get_fp32_state_dict_from_zero_checkpoint`` joins. That
  function (DeepSpeed 0.19) calls ``torch.load(weights_only=False)``, so it runs with its
  module's ``torch.load`` replaced by the weights-only reader (``weights_only_torch``).

The weights are then cast to the export dtype (default: the run's
``actor_rollout_ref.model.dtype``; for a bare checkpoint, the compute dtype in its DeepSpeed
config) and put into a model built from the base config on the ``meta`` device (no random init,
no second copy), tied embeddings re-tied. ZeRO 0–2 store the compute-dtype weights, so
``float32`` from a ``bfloat16`` run is the bf16 weights widened; ZeRO 3 stores fp32 masters.

Every kind of export writes ``ppoflow_export.json``: the run, step, checkpoint, ZeRO stage,
base model and dtype, ``kind`` (``model``, ``adapter`` or ``merged``) and for LoRA the adapter's
settings and the base model's fingerprint, which the export checks before reading a weight.

The directory is written as ``.<OUT>.partial-<pid>`` beside OUT and renamed into place; an
existing OUT is replaced only when it is empty or with ``force``.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from flows.export_errors import ExportError
from flows.runs.index import is_run_dir, working_dir
from stages.engines.checkpoint import MANIFEST, STATE_TAG, checkpoint_steps
from stages.engines.checkpoint_manifest import STEP_DIR, CheckpointVerify, verify_checkpoint
from stages.engines.safe_load import weights_only_load, weights_only_torch

ACTOR_ROLE = "actor"
EXPORT_FILE = "ppoflow_export.json"
LM_PREFIX = "lm."  # ResponseLogProbModel keeps the Hugging Face model as .lm
ZERO_MODEL_FILE = "mp_rank_00_model_states.pt"  # ZeRO 0–2: the whole module, rank 0
EXPORT_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


# --- where the weights are ----------------------------------------------------------------------


@dataclass(frozen=True)
class ActorCheckpoint:
    """An actor engine checkpoint directory (``…/global_step_<step>/actor``) and its manifest;
    ``adapter``: the manifest's LoRA record (settings and base fingerprint), None for full
    training."""

    directory: Path
    step: int
    zero_stage: int
    world_size: int
    adapter: dict[str, Any] | None = None

    @classmethod
    def at(cls, path: str | os.PathLike, verify: CheckpointVerify = "full") -> ActorCheckpoint:
        """The actor checkpoint at ``path``: a ``global_step_<K>`` folder or its ``actor``,
        checked against the step's manifest (module docstring)."""
        path = Path(path)
        directory = path / ACTOR_ROLE if STEP_DIR.fullmatch(path.name) else path
        match = STEP_DIR.fullmatch(directory.parent.name)
        if directory.name != ACTOR_ROLE or match is None:
            raise ExportError(
                f"{path} is neither a run directory (config.json) nor a checkpoint folder; "
                "expected a run directory or …/global_step_<K> (or …/global_step_<K>/actor)"
            )
        step = int(match.group(1))
        verify_checkpoint(directory.parent.parent, step, (ACTOR_ROLE,), verify)
        manifest_file = directory / MANIFEST
        if not manifest_file.is_file():
            raise ExportError(
                f"{directory} holds no {MANIFEST}: not a complete actor checkpoint written by "
                "ppoflow train"
            )
        manifest = json.loads(manifest_file.read_text(encoding="utf-8"))
        return cls(
            directory, step, manifest["zero_stage"], manifest["world_size"], manifest.get("adapter")
        )

    def compute_dtype(self) -> str:
        """The dtype the engine computed in (its DeepSpeed config: bf16 enabled or not)."""
        state = self._load(self.model_files()[0])
        return "bfloat16" if state["ds_config"].get("bf16", {}).get("enabled") else "float32"

    def model_files(self) -> list[Path]:
        """DeepSpeed's model-state files: rank 0's (ZeRO 0–2) or every rank's (ZeRO 3)."""
        state = self.directory / STATE_TAG
        if self.zero_stage < 3:
            return [state / ZERO_MODEL_FILE]
        return sorted(state.glob("*_model_states.pt"))

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The weights the checkpoint holds, names without the ``lm.`` wrapper prefix, read as
        the module docstring says: the Hugging Face model's, or with LoRA the adapter
        parameters under the PEFT model's names (``base_model.model.….lora_A.default.weight``)."""
        if self.zero_stage < 3:
            module = self._load(self.model_files()[0])["module"]
        else:
            module = self._zero3_fp32_weights()
        prefixed = [name for name in module if not name.startswith(LM_PREFIX)]
        if prefixed:
            raise ExportError(
                f"{self.directory} is not an actor checkpoint: {prefixed[0]!r} lies outside "
                f"the {LM_PREFIX!r} language model (a critic checkpoint?)"
            )
        return {name.removeprefix(LM_PREFIX): tensor for name, tensor in module.items()}

    def _zero3_fp32_weights(self) -> dict[str, torch.Tensor]:
        from deepspeed.utils import zero_to_fp32

        progress = io.StringIO()  # its progress lines and bars
        with (
            weights_only_torch(zero_to_fp32),
            contextlib.redirect_stdout(progress),
            contextlib.redirect_stderr(progress),
        ):
            joined = zero_to_fp32.get_fp32_state_dict_from_zero_checkpoint(
                str(self.directory), STATE_TAG
            )
        return dict(joined)

    def _load(self, file: Path) -> dict[str, Any]:
        if not file.is_file():
            raise ExportError(f"{self.directory} is incomplete: {file.name} is missing")
        return weights_only_load(file, "cpu", mmap=True)


@dataclass(frozen=True)
class ExportSource:
    """What an export reads: the actor checkpoint, the base model (architecture, generation
    config, tokenizer) and the default dtype; ``run_dir`` when it came from a run."""

    checkpoint: ActorCheckpoint
    base_model: str
    tokenizer: str
    dtype: str
    trust_remote_code: bool = False
    run_dir: str | None = None

    def path(self, path: str) -> str:
        """A path of the run's config as this process can open it (:func:`run_path`); for a
        bare checkpoint, ``path`` itself."""
        return run_path(self.run_dir, path) if self.run_dir is not None else path

    def describe(self) -> str:
        """``step K of RUN (checkpoint …)`` or ``checkpoint … (step K)``, with the ZeRO stage
        and the base model."""
        ckpt = self.checkpoint
        details = f"ZeRO-{ckpt.zero_stage}, base {self.base_model}"
        if self.run_dir is not None:
            return f"step {ckpt.step} of {self.run_dir} (checkpoint {ckpt.directory}, {details})"
        return f"checkpoint {ckpt.directory} (step {ckpt.step}, {details})"


def run_config(run_dir: str | os.PathLike) -> Any:
    """The run's resolved config (``config.json``) as a ``PPORunConfig``."""
    from flows.runs.store import CONFIG_FILE, RunStore
    from stages.config import validate_config

    if not is_run_dir(Path(run_dir)):
        raise ExportError(
            f"{run_dir} is not a run directory: it has no config.json and step journals written "
            "by ppoflow train (expected a directory printed by ppoflow train or ppoflow runs)"
        )
    store = RunStore(run_dir)
    return validate_config(store.load_config(), f"{store.root}/{CONFIG_FILE}")


def run_path(run_dir: str | os.PathLike, path: str) -> str:
    """A path of the run's config as this process can open it: a relative one is read from
    the directory the run started in (``flows.runs.index.working_dir``) when it exists there; a
    hub id (nothing there) is left as it is.

    >>> run_path("/no/such/run", "/abs/model")
    '/abs/model'
    """
    if os.path.isabs(path):
        return path
    candidate = working_dir(run_dir) / path
    return str(candidate) if candidate.exists() else path


def run_checkpoint(run_dir: str | os.PathLike, step: int | None) -> ActorCheckpoint:
    """The actor checkpoint of ``step`` under the run's ``trainer.default_local_dir``; without
    a step, or for a step without one, an :class:`ExportError` listing the saved steps."""
    configured = run_config(run_dir).trainer.default_local_dir
    root = Path(configured) if os.path.isabs(configured) else working_dir(run_dir) / configured
    saved = [s for s in checkpoint_steps(root) if (root / f"global_step_{s}" / ACTOR_ROLE).is_dir()]
    if step is None or step not in saved:
        asked = "pass --step K" if step is None else f"no checkpoint of step {step}"
        raise ExportError(
            f"{run_dir}: {asked}; steps with a checkpoint under {root}: "
            f"{saved or 'none (train with trainer.save_freq > 0)'}"
        )
    return ActorCheckpoint.at(root / f"global_step_{step}")


def export_source(
    path: str | os.PathLike, step: int | None = None, base: str | None = None
) -> ExportSource:
    """What to export from ``path``: a run directory (with ``step``) or a checkpoint folder
    (with ``base``, the model directory the run started from)."""
    if base is not None:
        check_base(base, "--base", "pass the model directory the run started from")
    if is_run_dir(Path(path)):
        model = run_config(path).actor_rollout_ref.model
        checkpoint = run_checkpoint(path, step)
        if base is None:
            check_base(
                run_path(path, model.path),
                "the run's actor_rollout_ref.model.path",
                "pass --base MODEL_DIR, the model directory the run started from",
            )
        return checked_base(
            ExportSource(
                checkpoint=checkpoint,
                base_model=base or run_path(path, model.path),
                tokenizer=base or run_path(path, model.tokenizer_path or model.path),
                dtype=model.dtype,
                trust_remote_code=model.trust_remote_code,
                run_dir=str(Path(path).absolute()),
            )
        )
    if not Path(path).exists():
        raise ExportError(missing_source(Path(path)))
    checkpoint = ActorCheckpoint.at(path)
    if step is not None and step != checkpoint.step:
        raise ExportError(
            f"--step {step} disagrees with the checkpoint folder {path} (step {checkpoint.step})"
        )
    if base is None:
        raise ExportError(
            f"{path} is a checkpoint folder, which holds weights only; pass --base MODEL_DIR, "
            "the model directory the run started from (its actor_rollout_ref.model.path)"
        )
    return checked_base(ExportSource(checkpoint, base, base, checkpoint.compute_dtype()))


def checked_base(source: ExportSource) -> ExportSource:
    """``source``, after checking that a LoRA checkpoint's base model is the one its adapters
    were trained on (``flows.export_lora.check_adapter_base``)."""
    if source.checkpoint.adapter is not None:
        from flows.export_lora import check_adapter_base

        check_adapter_base(source)
    return source


def check_base(base: str, what: str, advice: str) -> None:
    """Refuse a local ``base`` that is not a model directory; a hub id (``name`` or
    ``namespace/name`` with nothing there) is left to transformers."""
    path = Path(base)
    looks_local = path.is_absolute() or base.startswith(".") or path.exists() or base.count("/") > 1
    if looks_local and not (path / "config.json").is_file():
        state = "does not exist" if not path.exists() else "has no config.json"
        raise ExportError(f"{what} {base} is not a model directory: it {state}; {advice}")


def missing_source(path: Path) -> str:
    """The error for an export source that does not exist, with the checkpoints beside it.

    >>> missing_source(Path("/no/ckpt/global_step_7"))
    '/no/ckpt/global_step_7 does not exist; expected a run directory or …/global_step_<K> (or …/global_step_<K>/actor)'
    """
    folder = path.parent if path.name == ACTOR_ROLE else path
    steps = checkpoint_steps(folder.parent) if folder.parent.is_dir() else []
    beside = f"; steps with a checkpoint under {folder.parent}: {steps}" if steps else ""
    return (
        f"{path} does not exist; expected a run directory or …/global_step_<K> "
        f"(or …/global_step_<K>/actor){beside}"
    )


# --- writing the model directory ----------------------------------------------------------------


def check_output(out: Path, source: ExportSource, force: bool) -> None:
    """Refuse a non-empty ``out`` unless ``force``, and always one that holds what is read."""
    reads = [source.checkpoint.directory, Path(source.base_model), Path(source.tokenizer)]
    for path in reads:
        if path.exists() and out.exists() and path.resolve().is_relative_to(out.resolve()):
            raise ExportError(f"{out} holds {path}, which the export reads; choose another OUT")
    if out.is_file():
        raise ExportError(f"{out} is a file; OUT must be a new or empty directory")
    if out.is_dir() and any(out.iterdir()) and not force:
        raise ExportError(
            f"{out} is not empty; choose a new directory or pass --force to replace it"
        )


def build_model(source: ExportSource, dtype: torch.dtype) -> Any:
    """The base architecture on the ``meta`` device with the checkpoint's weights assigned."""
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig

    config = AutoConfig.from_pretrained(
        source.base_model, trust_remote_code=source.trust_remote_code
    )
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(
            config, dtype=dtype, trust_remote_code=source.trust_remote_code
        )
    weights = source.checkpoint.state_dict()
    expected = set(model.state_dict())
    missing, unexpected = sorted(expected - set(weights)), sorted(set(weights) - expected)
    if missing or unexpected:
        raise ExportError(
            f"the checkpoint {source.checkpoint.directory} does not fit the model at "
            f"{source.base_model}: missing {missing[:3]}, unexpected {unexpected[:3]}; pass the "
            "model directory the run trained (--base)"
        )
    for name in weights:  # cast one tensor at a time: never two copies of the model
        weights[name] = weights[name].to(dtype)
    model.load_state_dict(weights, strict=True, assign=True)
    model.tie_weights()
    try:
        model.generation_config = GenerationConfig.from_pretrained(source.base_model)
    except OSError:  # the base has no generation_config.json: derive it as transformers does
        model.generation_config = GenerationConfig.from_model_config(config)
    return model


def export_kind(source: ExportSource, merged: bool) -> str:
    """What an export of ``source`` writes: ``model`` (a full-training checkpoint, ``merged``
    or not), ``adapter`` (a PEFT adapter directory) or ``merged`` (the merged model)."""
    if source.checkpoint.adapter is None:
        return "model"
    return "merged" if merged else "adapter"


def export_model(
    source: ExportSource,
    out: str | os.PathLike,
    dtype: str | None = None,
    force: bool = False,
    merged: bool = False,
) -> Path:
    """Write the export of ``source`` to ``out`` (module docstring); returns it.

    Args:
        dtype: ``float32``, ``bfloat16`` or ``float16``; default ``source.dtype``.
        force: replace a non-empty ``out``.
        merged: a LoRA checkpoint as the merged model instead of a PEFT adapter directory (a
            full-training checkpoint exports its model either way).
    """
    from transformers import AutoTokenizer

    from flows import export_lora

    name = dtype or source.dtype
    if name not in EXPORT_DTYPES:
        raise ExportError(f"--dtype {name!r} is not one of {sorted(EXPORT_DTYPES)}")
    out = Path(out).absolute()
    check_output(out, source, force)
    kind = export_kind(source, merged)
    builders = {
        "model": build_model,
        "adapter": export_lora.adapter_model,
        "merged": export_lora.merged_model,
    }
    model = builders[kind](source, EXPORT_DTYPES[name])
    tokenizer = AutoTokenizer.from_pretrained(
        source.tokenizer, trust_remote_code=source.trust_remote_code
    )
    partial = out.parent / f".{out.name}.partial-{os.getpid()}"
    shutil.rmtree(partial, ignore_errors=True)
    try:
        if kind == "adapter":
            export_lora.save_adapter(model, partial)
        else:
            model.save_pretrained(partial)
        tokenizer.save_pretrained(partial)
        provenance = {
            "run_dir": source.run_dir,
            "step": source.checkpoint.step,
            "checkpoint": str(source.checkpoint.directory.absolute()),
            "zero_stage": source.checkpoint.zero_stage,
            "base_model": source.base_model,
            "dtype": name,
            "kind": kind,
        }
        if source.checkpoint.adapter is not None:
            adapter = dict(source.checkpoint.adapter)
            provenance["base_fingerprint"] = adapter.pop("base_model")
            provenance["adapter"] = adapter
        (partial / EXPORT_FILE).write_text(json.dumps(provenance, indent=1), encoding="utf-8")
        _move_into_place(partial, out)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    return out


def _move_into_place(partial: Path, out: Path) -> None:
    """Rename ``partial`` to ``out``; an existing ``out`` is renamed aside first, then deleted."""
    old = out.parent / f".{out.name}.old-{os.getpid()}"
    if out.exists():
        os.rename(out, old)
    os.rename(partial, out)
    shutil.rmtree(old, ignore_errors=True)


__all__ = [
    "ActorCheckpoint",
    "ExportError",
    "ExportSource",
    "export_kind",
    "export_model",
    "export_source",
    "run_checkpoint",
    "run_config",
    "run_path",
]
