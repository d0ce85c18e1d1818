"""DeepSpeed ZeRO engines for the actor, critic and reference roles.

One process is one data-parallel rank. Without a launcher (the embedded default) the process group
is a single gloo rank on 127.0.0.1; under torchrun, Ray or the deepspeed launcher the RANK /
WORLD_SIZE / MASTER_* variables they set are used as they are.

Gradient accumulation is owned by the caller: each micro-batch's loss is already a partial sum
with global denominators (``stages.algos.aggregation``), so ``backward`` must not divide it by the
accumulation count (``scale_wrt_gas=False``) and the boundary is set explicitly — the number of
micro-batches can change from one mini-batch to the next under a token budget.
"""

from __future__ import annotations

import hashlib
import math
import os
import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
from torch import nn

from stages.engines.rendezvous_dir import rendezvous_dir

DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
}


@dataclass(frozen=True)
class EngineSettings:
    """How one role's model is trained (or, for the reference, held).

    zero_stage: ZeRO stage 0–3 (3 partitions the parameters themselves).
    dtype: float32 or bfloat16 (fp16 is not supported on CPU by DeepSpeed).
    lr, weight_decay, betas, eps: AdamW hyper-parameters.
    clip_grad: global gradient-norm clip (0 = off).
    lr_scheduler: "constant" or "cosine", both after ``warmup_steps`` linear warm-up steps.
    total_steps: training steps the cosine schedule spans (the schedule advances once per training
        step, i.e. per update call, as in verl — not per optimizer step).
    min_lr_ratio: the cosine schedule's floor as a fraction of lr.
    num_cycles: cosine waves over the schedule (0.5: one half-cosine decay from lr to the floor).
    offload_optimizer / offload_param: ZeRO offload of optimizer state / parameters to CPU memory.
    """

    zero_stage: int = 0
    dtype: Literal["float32", "fp32", "bfloat16", "bf16"] = "float32"
    lr: float = 1e-6
    weight_decay: float = 0.01
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    clip_grad: float = 1.0
    lr_scheduler: Literal["constant", "cosine"] = "constant"
    warmup_steps: int = 0
    total_steps: int = 1
    min_lr_ratio: float = 0.0
    num_cycles: float = 0.5
    offload_optimizer: bool = False
    offload_param: bool = False

    def __post_init__(self) -> None:
        if self.zero_stage not in (0, 1, 2, 3):
            raise ValueError(f"zero_stage must be 0, 1, 2 or 3, got {self.zero_stage}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {self.dtype!r}")
        if self.lr_scheduler not in ("constant", "cosine"):
            raise ValueError(
                f"lr_scheduler must be 'constant' or 'cosine', got {self.lr_scheduler!r}"
            )
        if not self.num_cycles > 0:
            raise ValueError(f"num_cycles must be > 0 (cycles), got {self.num_cycles}")
        if (self.offload_optimizer or self.offload_param) and self.zero_stage == 0:
            raise ValueError(
                "optimizer/parameter offload needs zero_stage ≥ 1 (param offload needs 3)"
            )
        if self.offload_param and self.zero_stage != 3:
            raise ValueError(f"offload_param needs zero_stage 3, got {self.zero_stage}")

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]


#: what a launcher (torchrun, deepspeed, a Ray rank) sets; RANK alone may be inherited from a
#: parent ppoflow process's single rank (below), which is not a launcher
LAUNCHER_ENV = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def ensure_process_group(backend: str | None = None) -> None:
    """Initialise torch.distributed through DeepSpeed once per process (gloo on CPU, nccl on CUDA).

    Under a launcher (all of :data:`LAUNCHER_ENV` set, e.g. a Ray rank) its rendezvous is used.
    Without one this process is the only rank, and the group meets through a file store in a
    fresh temp directory (``stages.engines.rendezvous_dir``: removed when the process exits, or
    by the next single rank when it was killed) rather than a TCP port (a port picked as free can
    be taken before the store binds it, and a port in the environment may be one a parent
    process still holds).

    A process may start a second world after the first was torn down (a second run in one
    process, after vLLM's clean-up destroyed the first): DeepSpeed's handles on the old world's
    groups are dropped first (:func:`_forget_deepspeed_groups`).
    """
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return
    _prepare_new_world()
    import deepspeed

    dist_backend = backend or _default_backend()
    if all(name in os.environ for name in LAUNCHER_ENV):
        with _shared_memory_op_for(int(os.environ["WORLD_SIZE"])):
            deepspeed.init_distributed(dist_backend=dist_backend)
        return
    os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1")
    store = rendezvous_dir() / "store"
    with _shared_memory_op_for(1):
        deepspeed.init_distributed(
            dist_backend=dist_backend,
            auto_mpi_discovery=False,  # it would look for MASTER_ADDR / MASTER_PORT, then MPI
            init_method=store.as_uri(),
            rank=0,
            world_size=1,
        )


def join_process_group(
    store: torch.distributed.Store, rank: int, world_size: int, backend: str | None = None
) -> None:
    """Join a world of ``world_size`` ranks through ``store``, the rendezvous store one rank
    opened (``torch.distributed.TCPStore``); gloo on CPU, nccl on CUDA. DeepSpeed engines built
    afterwards use this world (:func:`ensure_process_group` then leaves it as it is).

    Raises:
        RuntimeError: when this process is already in a world.
    """
    if torch.distributed.is_initialized():
        raise RuntimeError(
            f"rank {rank} is already in a torch.distributed world; a process joins one world"
        )
    _prepare_new_world()
    torch.distributed.init_process_group(
        backend or _default_backend(), store=store, rank=rank, world_size=world_size
    )


def _prepare_new_world() -> None:
    """Before this process starts a world: DeepSpeed's accelerator set to the CPU when there is no
    CUDA device (before DeepSpeed is first imported: it picks its accelerator then), its C++ ops
    built in this environment's own directory (:func:`extensions_dir`), and its handles on an
    earlier world's groups dropped."""
    if not torch.cuda.is_available():
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(extensions_dir()))
    _forget_deepspeed_groups()


def extensions_dir(prefix: str = sys.prefix) -> Path:
    """Where torch builds DeepSpeed's JIT ops for the Python environment at ``prefix``, unless
    ``TORCH_EXTENSIONS_DIR`` says: ``~/.cache/torch_extensions/ppoflow-<name>-<8 hex of the
    prefix's sha256>``. torch's default directory is one per user, so two environments with
    different torch builds (a vLLM or a benchmark venv beside the main one) rebuild each other's
    ops (minutes each time); one directory per environment builds each op once."""
    tag = hashlib.sha256(str(Path(prefix).resolve()).encode()).hexdigest()[:8]
    return Path.home() / ".cache" / "torch_extensions" / f"ppoflow-{Path(prefix).name}-{tag}"


#: DeepSpeed's CPU all-reduce over shared memory, a C++ op built on first use
SHARED_MEMORY_OP = "deepspeed_shm_comm"


@contextmanager
def _shared_memory_op_for(world_size: int) -> Iterator[None]:
    """DeepSpeed's communication backend builds (a JIT compile, once per environment) and
    loads :data:`SHARED_MEMORY_OP` for every world it starts, whatever its size. A world of one
    rank has no peer to share memory with, so while DeepSpeed starts it the op is marked
    incompatible in DeepSpeed's table of ops (``deepspeed.ops.__compatible_ops__``, probed once
    per process, kept editable), and restored after; larger worlds build and use it."""
    if world_size > 1:
        yield
        return
    import deepspeed.ops

    compatible = deepspeed.ops.__compatible_ops__
    before = compatible.get(SHARED_MEMORY_OP, False)
    compatible[SHARED_MEMORY_OP] = False
    try:
        yield
    finally:
        compatible[SHARED_MEMORY_OP] = before


def _default_backend() -> str:
    return "nccl" if torch.cuda.is_available() else "gloo"


def _forget_deepspeed_groups() -> None:
    """Drop DeepSpeed's cached process-group handles; call only when no world is initialised.

    DeepSpeed keeps module-wide handles (a clone of the world group, data-parallel groups, …) and
    drops them only in its own ``destroy_process_group``. A world torn down by
    ``torch.distributed.destroy_process_group`` directly (vLLM's ``cleanup_dist_env_and_memory``
    does) leaves them pointing at dead groups, and the next engine's first broadcast fails with
    "Group … is not registered". With no world initialised every such handle is stale.
    """
    from deepspeed.utils import groups

    release = getattr(groups, "_release_process_group_references", None)
    if release is not None:  # what DeepSpeed's own destroy_process_group calls (0.19)
        release()
    else:
        groups._WORLD_GROUP = None


def deepspeed_config(
    settings: EngineSettings, micro_batch_size: int, world_size: int
) -> dict[str, Any]:
    """The DeepSpeed config dict for one role. Batch sizes are nominal: the caller sets the
    accumulation boundary itself, so ``gradient_accumulation_steps`` is 1."""
    zero: dict[str, Any] = {"stage": settings.zero_stage}
    if settings.zero_stage == 3:
        zero.update(
            stage3_param_persistence_threshold=0,
            stage3_max_live_parameters=int(1e8),
            stage3_prefetch_bucket_size=int(5e7),
            stage3_gather_16bit_weights_on_model_save=True,
        )
    if settings.offload_optimizer:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": torch.cuda.is_available()}
    if settings.offload_param:
        zero["offload_param"] = {"device": "cpu", "pin_memory": torch.cuda.is_available()}
    return {
        "train_micro_batch_size_per_gpu": micro_batch_size,
        "train_batch_size": micro_batch_size * world_size,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": settings.clip_grad,
        "zero_optimization": zero,
        "zero_allow_untested_optimizer": True,
        "bf16": {"enabled": settings.torch_dtype == torch.bfloat16},
        "steps_per_print": 1 << 30,
        "wall_clock_breakdown": False,
    }


def lr_lambda(settings: EngineSettings):
    """Multiplier of the base lr at optimizer step s: linear warm-up over ``warmup_steps``, then
    constant, or verl's ``get_cosine_schedule_with_warmup`` over the remaining
    ``total_steps − warmup_steps``:

        m(s) = floor + (1 − floor) · ½ · (1 + cos(2π · num_cycles · p)),
        p = min(1, (s − warmup) / (total − warmup)),  floor = min_lr_ratio

    so ``num_cycles = 0.5`` decays once from 1 to the floor, and ``num_cycles = 1`` comes back
    up to 1 at the end. (p stops at 1: a step past ``total_steps`` keeps the last value.)"""
    warmup, total, floor = (
        settings.warmup_steps,
        max(settings.total_steps, 1),
        settings.min_lr_ratio,
    )

    def multiplier(step: int) -> float:
        if step < warmup:
            return (step + 1) / (warmup + 1)
        if settings.lr_scheduler == "constant":
            return 1.0
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        wave = math.cos(2 * math.pi * settings.num_cycles * progress)
        return floor + (1 - floor) * 0.5 * (1 + wave)

    return multiplier


def initialize_engine(
    module: nn.Module,
    settings: EngineSettings,
    *,
    micro_batch_size: int = 1,
    trainable: bool = True,
):
    """Wrap ``module`` in a DeepSpeed engine: AdamW (torch's on CPU, DeepSpeed's fused/CPU Adam
    where it applies on CUDA), the warm-up/cosine schedule, gradient clipping, ZeRO.

    A frozen role (``trainable=False``, the reference) gets no optimizer state: ZeRO-3 still
    partitions its parameters (offloaded to CPU memory with ``offload_param``), lower stages keep
    the plain module in eval mode.
    """
    import deepspeed

    ensure_process_group()
    world_size = torch.distributed.get_world_size()
    config = deepspeed_config(settings, micro_batch_size, world_size)
    module = module.to(settings.torch_dtype)
    if not trainable:
        module.requires_grad_(False).eval()
        if settings.zero_stage != 3:
            return module.to(_device())
        zero = {"stage": 3, "stage3_param_persistence_threshold": 0}
        if settings.offload_param:  # the parameters live in CPU memory between uses
            zero["offload_param"] = config["zero_optimization"]["offload_param"]
        config["zero_optimization"] = zero
        engine, *_ = deepspeed.initialize(model=module, config=config)
        return engine
    optimizer = _make_optimizer(module, settings)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(settings))
    engine, *_ = deepspeed.initialize(model=module, optimizer=optimizer, config=config)
    # Not handed to DeepSpeed, which would step it at every optimizer step: verl advances the
    # schedule once per training step (per update call), see step_lr_schedule.
    engine.ppoflow_lr_scheduler = scheduler
    return engine


def step_lr_schedule(engine) -> None:
    """Advance the engine's learning-rate schedule by one training step (after an update call)."""
    engine.ppoflow_lr_scheduler.step()


def _make_optimizer(module: nn.Module, settings: EngineSettings) -> torch.optim.Optimizer:
    params = [p for p in module.parameters() if p.requires_grad]
    kwargs = dict(
        lr=settings.lr, weight_decay=settings.weight_decay, betas=settings.betas, eps=settings.eps
    )
    if settings.offload_optimizer:
        from deepspeed.ops.adam import DeepSpeedCPUAdam

        return DeepSpeedCPUAdam(params, adamw_mode=True, **kwargs)
    if torch.cuda.is_available():
        from deepspeed.ops.adam import FusedAdam

        check_cuda_arch_list(os.environ.get("TORCH_CUDA_ARCH_LIST", ""))
        return FusedAdam(params, adam_w_mode=True, **kwargs)
    return torch.optim.AdamW(params, **kwargs)


_DEEPSPEED_ARCH = re.compile(r"\d+\.\d+(\+PTX)?")


def check_cuda_arch_list(arch_list: str) -> None:
    """Refuse a ``TORCH_CUDA_ARCH_LIST`` that DeepSpeed's JIT op builder cannot read, before it
    builds FusedAdam.

    DeepSpeed reads each entry (split on spaces and ``;``) as ``major.minor`` integers with an
    optional ``+PTX``: ``"9.0"``, ``"8.0;9.0+PTX"``. PyTorch's CUDA images set arch-specific
    entries such as ``"9.0a"``, on which DeepSpeed 0.19 fails deep inside with
    ``invalid literal for int() with base 10: '0a'`` (seen on an H200 image, 2026-12-04); a bare
    ``"9"`` fails the same way.

    >>> check_cuda_arch_list("8.0 9.0+PTX")
    >>> check_cuda_arch_list("9.0a")
    Traceback (most recent call last):
    ...
    ValueError: TORCH_CUDA_ARCH_LIST='9.0a': DeepSpeed cannot build FusedAdam for '9.0a'; set it to plain compute capabilities such as '9.0' (with an optional '+PTX'), or unset it to build for the visible GPUs
    """
    entries = [entry for entry in arch_list.replace(" ", ";").split(";") if entry]
    unreadable = [entry for entry in entries if not _DEEPSPEED_ARCH.fullmatch(entry)]
    if unreadable:
        raise ValueError(
            f"TORCH_CUDA_ARCH_LIST={arch_list!r}: DeepSpeed cannot build FusedAdam for "
            f"{', '.join(map(repr, unreadable))}; set it to plain compute capabilities such as "
            "'9.0' (with an optional '+PTX'), or unset it to build for the visible GPUs"
        )


def _device() -> torch.device:
    if torch.cuda.is_available():
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return torch.device("cpu")
