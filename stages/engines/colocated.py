"""Several model roles in one rank's process: one worker group, a view of it per role.

verl's colocated workers: on every device one process holds that device's actor and, when the run
uses them, its reference and critic, so N devices run GRPO with a KL loss rather than 2N. The
roles of a rank share the rank's device and its ``torch.distributed`` world (each role's DeepSpeed
engine uses the same default group: the roles' collectives never interleave, as the flow calls one
role at a time).

Rank side: :class:`ColocatedWorker` holds ``{role: worker}`` and runs ``worker.method`` for the
role a call names. Driver side: :class:`ColocatedRoles` owns the one worker group and hands out a
:class:`ColocatedRole` per role, called like a worker group (``call``, ``call_all``, ``close``); the
dispatch is the group's own (pad to the rank count, chunk, collect, un-pad), so a role's batches
and metrics are exactly those of a group of its own. Closing a role frees its worker on every rank
(its ``close()``); closing the last one then closes the group (its processes and anything it
started).

Example:
    >>> import torch
    >>> from dataproto import DataProto
    >>> from stages.engines.worker_group import make_worker_group
    >>> class Adder:
    ...     def __init__(self, k): self.k = k
    ...     def add(self, batch): return DataProto.from_dict({"y": batch.batch["x"] + self.k})
    >>> group = make_worker_group("local", lambda: ColocatedWorker({"a": Adder(1), "b": Adder(10)}), 1)
    >>> roles = ColocatedRoles(group, ["a", "b"])
    >>> x = DataProto.from_dict({"x": torch.arange(3)})
    >>> roles.role("a").call("add", x).batch["y"].tolist(), roles.role("b").call("add", x).batch["y"].tolist()
    ([1, 2, 3], [10, 11, 12])
    >>> roles.close_all()
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from dataproto import DataProto
from stages.engines.worker_group import WorkerGroup, check_method


class ColocatedWorker:
    """The role workers of one rank, by role name (rank side)."""

    def __init__(self, workers: dict[str, Any]) -> None:
        if not workers:
            raise ValueError("a colocated worker needs at least one role")
        self.workers = dict(workers)

    def call_role(
        self, batch: DataProto, *, role_name: str, role_method: str, **kwargs: Any
    ) -> DataProto:
        """``workers[role_name].role_method(batch, **kwargs)``."""
        return check_method(self._worker(role_name), role_method)(batch, **kwargs)

    def call_role_all(self, *, role_name: str, role_method: str, **kwargs: Any) -> Any:
        """``workers[role_name].role_method(**kwargs)`` (no data: checkpoint save / load …)."""
        return check_method(self._worker(role_name), role_method)(**kwargs)

    def close_role(self, *, role_name: str) -> None:
        """Release one role's worker (its ``close()`` first when it has one)."""
        worker = self.workers.pop(role_name, None)
        close = getattr(worker, "close", None)
        if callable(close):
            close()

    def _worker(self, role: str) -> Any:
        if role not in self.workers:
            raise KeyError(
                f"this rank holds no {role!r} worker (it holds {sorted(self.workers)}); the role "
                "was closed or never built here"
            )
        return self.workers[role]


class ColocatedRole:
    """One role of a :class:`ColocatedRoles` group, with the worker-group call signature."""

    def __init__(self, owner: ColocatedRoles, role: str) -> None:
        self._owner, self.role = owner, role
        self.world_size = owner.group.world_size

    def call(
        self,
        method: str,
        batch: DataProto,
        *,
        allow_padding: bool = True,
        ranks_per_chunk: int = 1,
        **kwargs: Any,
    ) -> DataProto:
        """The group's dispatch of ``batch`` to this role's ``method`` on every rank."""
        return self._owner.open_group(self.role).call(
            "call_role",
            batch,
            allow_padding=allow_padding,
            ranks_per_chunk=ranks_per_chunk,
            role_name=self.role,
            role_method=method,
            **kwargs,
        )

    def call_all(self, method: str, **kwargs: Any) -> list[Any]:
        """This role's ``method(**kwargs)`` on every rank; one result per rank."""
        return self._owner.open_group(self.role).call_all(
            "call_role_all", role_name=self.role, role_method=method, **kwargs
        )

    def close(self) -> None:
        """Free this role on every rank (the group closes with its last role)."""
        self._owner.close_role(self.role)


class ColocatedRoles:
    """The driver's side of one worker group whose ranks each hold ``roles``."""

    def __init__(self, group: WorkerGroup, roles: Iterable[str]) -> None:
        self.group = group
        self.open_roles = list(roles)
        self._views = {role: ColocatedRole(self, role) for role in self.open_roles}

    def role(self, name: str) -> ColocatedRole:
        return self._views[name]

    def open_group(self, role: str) -> WorkerGroup:
        if role not in self.open_roles:
            raise RuntimeError(f"the {role} role is closed; the run's engines were released")
        return self.group

    def close_role(self, role: str) -> None:
        """Free ``role`` on every rank (its worker's ``close()``, which releases what the
        worker holds outside its process, e.g. a vLLM engine's shared memory); close the group
        once no role is left. Safe to repeat."""
        if role not in self.open_roles:
            return
        self.open_roles.remove(role)
        try:
            self.group.call_all("close_role", role_name=role)
        except BaseException:  # a broken group: release it all (processes, Ray), then report
            self.open_roles.clear()
            self.group.close()
            raise
        if not self.open_roles:
            self.group.close()

    def close_all(self) -> None:
        for role in list(self.open_roles):
            self.close_role(role)
