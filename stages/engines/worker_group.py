"""Worker groups: one role (actor, critic, reference …) scaled over data-parallel ranks.

A role worker is any object built by a picklable ``factory(**kwargs)`` in the rank's own process,
whose methods take a DataProto (plus plain keyword arguments) and return a DataProto, with
optional ``meta_info["metrics"]`` (``dict[str, Metric | float]``). The group dispatches a batch
over its ranks (``stages.engines.dispatch``), runs the method on every rank at once and returns
one DataProto for the whole batch. The models stay resident in the workers between calls; only
batches and metrics cross process boundaries.

Backends (``WORKER_BACKENDS``, each a :class:`WorkerBackendSpec` that declares whether its ranks
run in the driver process, its largest world size and how to check its dependencies):

- ``local`` (:class:`LocalWorkerGroup`): one rank, the worker lives in the driver process — the
  embedded default. The engine's process group is a single gloo/nccl rank.
- ``ray`` (:class:`RayWorkerGroup` in ``worker_group_ray``): one Ray actor per rank; the ranks form
  one torch.distributed group, DeepSpeed runs inside each actor. Needs ``pip install 'ppoflow[ray]'``.

Example:
    >>> import torch
    >>> from dataproto import DataProto
    >>> class Doubler:
    ...     def double(self, batch):
    ...         return DataProto.from_dict({"y": batch.batch["x"] * 2}, meta_info={"metrics": {"n": len(batch)}})
    >>> with make_worker_group("local", Doubler, 1) as group:
    ...     out = group.call("double", DataProto.from_dict({"x": torch.arange(3)}))
    >>> out.batch["y"].tolist(), out.meta_info["metrics"]
    ([0, 2, 4], {'n': 3.0})
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from dataproto import DataProto
from stages.engines.dispatch import collect_from_ranks, split_for_ranks
from stages.registry import Registry


class WorkerGroup(Protocol):
    """What the flow needs from a group of ranks for one role."""

    world_size: int

    def call(
        self,
        method: str,
        batch: DataProto,
        *,
        allow_padding: bool = True,
        ranks_per_chunk: int = 1,
        **kwargs: Any,
    ) -> DataProto:
        """Split ``batch`` over the ranks, run ``worker.method(chunk, **kwargs)``, join.
        ``ranks_per_chunk``: consecutive ranks that get one chunk together (an engine spanning
        them; ``stages.engines.dispatch``)."""
        ...

    def call_all(self, method: str, **kwargs: Any) -> list[Any]:
        """Run ``worker.method(**kwargs)`` on every rank (no data); one result per rank."""
        ...

    def close(self) -> None:
        """Release the workers (and anything the group started)."""
        ...


def check_method(worker: object, method: str, rank: int = 0) -> Callable[..., Any]:
    """The bound ``worker.method``; a clear ``AttributeError`` when the worker has none."""
    if not isinstance(method, str) or method.startswith("_"):
        raise ValueError(f"method must be the name of a public worker method, got {method!r}")
    bound = getattr(worker, method, None)
    if not callable(bound):
        public = sorted(n for n in dir(worker) if not n.startswith("_"))
        raise AttributeError(
            f"rank {rank}: worker {type(worker).__name__} has no method {method!r}; "
            f"its public attributes: {public}"
        )
    return bound


class LocalWorkerGroup:
    """World size 1: the worker is built and called in the driver process.

    The batch still goes through dispatch and collect, so the worker sees the same ``is_pad``
    column (all False) and the metrics come back combined exactly as from a Ray group.
    """

    world_size = 1

    def __init__(self, factory: Callable[..., Any], **kwargs: Any) -> None:
        if not callable(factory):
            raise TypeError(f"factory must be callable, got {type(factory).__name__}")
        self.worker = factory(**kwargs)
        self._closed = False

    def call(
        self,
        method: str,
        batch: DataProto,
        *,
        allow_padding: bool = True,
        ranks_per_chunk: int = 1,
        **kwargs: Any,
    ) -> DataProto:
        chunks, pad_size = split_for_ranks(
            batch, 1, allow_padding=allow_padding, ranks_per_chunk=ranks_per_chunk
        )
        return collect_from_ranks([self._method(method)(chunks[0], **kwargs)], pad_size)

    def call_all(self, method: str, **kwargs: Any) -> list[Any]:
        return [self._method(method)(**kwargs)]

    def close(self) -> None:
        """Drop the worker (its engine is freed with it)."""
        self._closed = True
        self.worker = None

    def _method(self, method: str) -> Callable[..., Any]:
        if self._closed:
            raise RuntimeError("this worker group is closed; build a new one")
        return check_method(self.worker, method)

    def __enter__(self) -> LocalWorkerGroup:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class SpanningEngineMethods:
    """A worker group whose named methods run on engines that each span several ranks.

    ``ranks_per_chunk``: method → the ranks one engine spans (e.g. the actor's
    ``generate_sequences`` → ``rollout.tensor_model_parallel_size``: a vLLM engine sharded over
    that many consecutive ranks). Those methods are dispatched with ``ranks_per_chunk`` (each
    engine's ranks get one chunk together, one output per engine is kept); every other method,
    and ``call_all``, as the group does.

    Example:
        >>> import torch
        >>> from dataproto import DataProto
        >>> class Echo:
        ...     def echo(self, batch): return batch
        >>> group = SpanningEngineMethods(LocalWorkerGroup(Echo), {"echo": 1})
        >>> group.call("echo", DataProto.from_dict({"x": torch.arange(3)})).batch["x"].tolist()
        [0, 1, 2]
    """

    def __init__(self, group: WorkerGroup, ranks_per_chunk: dict[str, int]) -> None:
        self.group = group
        self.world_size = group.world_size
        self.ranks_per_chunk = dict(ranks_per_chunk)

    def call(
        self, method: str, batch: DataProto, *, allow_padding: bool = True, **kwargs: Any
    ) -> DataProto:
        return self.group.call(
            method,
            batch,
            allow_padding=allow_padding,
            ranks_per_chunk=self.ranks_per_chunk.get(method, 1),
            **kwargs,
        )

    def call_all(self, method: str, **kwargs: Any) -> list[Any]:
        return self.group.call_all(method, **kwargs)

    def close(self) -> None:
        self.group.close()


def _local_group(factory: Callable[..., Any], world_size: int, **kwargs: Any) -> WorkerGroup:
    if world_size != 1:
        raise ValueError(
            f"the local worker backend runs one rank in this process, got world_size="
            f"{world_size}; set ppoflow.workers.backend=ray for more ranks, or "
            "trainer.nnodes=1 and trainer.n_gpus_per_node=1"
        )
    return LocalWorkerGroup(factory, **kwargs)


def _ray_group(factory: Callable[..., Any], world_size: int, **kwargs: Any) -> WorkerGroup:
    from stages.engines.worker_group_ray import RayWorkerGroup  # Ray is imported on use only

    return RayWorkerGroup(factory, world_size, **kwargs)


def _no_requirement() -> None:
    """The local backend needs nothing beyond ppoflow itself."""


def _ray_installed() -> None:
    from stages.engines.worker_group_ray import import_ray

    import_ray()  # an ImportError saying how to install the ray extra


@dataclass(frozen=True)
class WorkerBackendSpec:
    """One ``WORKER_BACKENDS`` entry: how a role's ranks are started, and what that implies.

    Attributes:
        make_group: ``make_group(factory, world_size, **kwargs) -> WorkerGroup``.
        ranks_in_driver: the ranks are objects in the driver process (no process boundary; an
            engine beside the actor, such as vLLM's, can live there too).
        max_world_size: the most ranks per role it can run; None = any.
        check_available: raises ``ImportError`` (saying what to install) when the backend's
            dependencies are missing.
    """

    make_group: Callable[..., WorkerGroup]
    ranks_in_driver: bool
    max_world_size: int | None
    check_available: Callable[[], None]


#: ``ppoflow.workers.backend`` → :class:`WorkerBackendSpec`
WORKER_BACKENDS = Registry[WorkerBackendSpec]("worker backend")
WORKER_BACKENDS.add(
    "local",
    WorkerBackendSpec(
        make_group=_local_group,
        ranks_in_driver=True,
        max_world_size=1,
        check_available=_no_requirement,
    ),
)
WORKER_BACKENDS.add(
    "ray",
    WorkerBackendSpec(
        make_group=_ray_group,
        ranks_in_driver=False,
        max_world_size=None,
        check_available=_ray_installed,
    ),
)


def make_worker_group(
    backend: str, factory: Callable[..., Any], world_size: int, **kwargs: Any
) -> WorkerGroup:
    """A worker group for ``ppoflow.workers.backend`` (a name in :data:`WORKER_BACKENDS`).

    ``local`` needs ``world_size == 1`` (one rank in this process); ``ray`` starts ``world_size``
    ranks (``trainer.nnodes × trainer.n_gpus_per_node``). ``kwargs`` go to the group's
    constructor: the factory's arguments, and for ``ray`` also ``num_cpus_per_rank``,
    ``num_gpus_per_rank``, ``env``, ``ray_init`` … (see ``RayWorkerGroup``), so a factory cannot
    take arguments of those names. An unknown backend raises ``KeyError`` listing the known ones.
    """
    return WORKER_BACKENDS.get(backend).make_group(factory, world_size, **kwargs)
