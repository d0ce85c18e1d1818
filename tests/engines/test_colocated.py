"""Several roles in one rank's process (stages/engines/colocated.py): each role's view dispatches
like a group of its own, closing frees a role on every rank (its worker closed), the last role
closes the group too."""

from __future__ import annotations

import pytest
import torch

from dataproto import DataProto
from stages.engines.colocated import ColocatedRoles, ColocatedWorker
from stages.engines.worker_group import LocalWorkerGroup


class Scaler:
    """A role worker: multiplies ``x``; remembers being closed."""

    def __init__(self, k: int, closed: list[int]) -> None:
        self.k, self.closed = k, closed

    def scale(self, batch: DataProto, offset: int = 0) -> DataProto:
        y = batch.batch["x"] * self.k + offset
        return DataProto.from_dict({"y": y}, meta_info={"metrics": {"rows": len(batch)}})

    def name(self) -> str:
        return f"scaler×{self.k}"

    def close(self) -> None:
        self.closed.append(self.k)


class CountingGroup(LocalWorkerGroup):
    """A local group that counts its closes and can be made to fail its calls."""

    def __init__(self, factory) -> None:
        super().__init__(factory)
        self.closes, self.broken = 0, False

    def call_all(self, method, **kwargs):
        if self.broken:
            raise RuntimeError("rank 1 died")
        return super().call_all(method, **kwargs)

    def close(self) -> None:
        self.closes += 1
        super().close()


@pytest.fixture
def colocated():
    closed: list[int] = []
    group = CountingGroup(
        lambda: ColocatedWorker({"actor": Scaler(2, closed), "ref": Scaler(3, closed)})
    )
    return ColocatedRoles(group, ["actor", "ref"]), group, closed


def test_each_role_is_called_like_a_group_of_its_own(colocated):
    roles, group, _ = colocated
    x = DataProto.from_dict({"x": torch.arange(4)})
    actor, ref = roles.role("actor"), roles.role("ref")
    assert actor.call("scale", x, offset=1).batch["y"].tolist() == [1, 3, 5, 7]
    out = ref.call("scale", x)
    assert out.batch["y"].tolist() == [0, 3, 6, 9] and out.meta_info["metrics"] == {"rows": 4.0}
    assert ref.call_all("name") == ["scaler×3"] and actor.world_size == group.world_size == 1
    with pytest.raises(AttributeError, match="has no method 'step'"):
        actor.call("step", x)


def test_closing_frees_a_role_and_the_last_closes_the_group(colocated):
    roles, group, closed = colocated
    roles.role("ref").close()
    assert closed == [3] and group.closes == 0, "the actor still runs on these ranks"
    assert group.worker.workers.keys() == {"actor"}
    with pytest.raises(RuntimeError, match="the ref role is closed"):
        roles.role("ref").call_all("name")
    roles.role("ref").close()  # twice is fine
    roles.role("actor").close()
    # the last role's worker is closed on its ranks before the group goes (what it holds
    # outside the process, e.g. a vLLM engine's shared memory, is released by its close)
    assert closed == [3, 2] and group.closes == 1 and roles.open_roles == []


def test_a_broken_group_is_closed_whole(colocated):
    roles, group, _ = colocated
    group.broken = True
    with pytest.raises(RuntimeError, match="rank 1 died"):
        roles.role("actor").close()
    assert group.closes == 1 and roles.open_roles == []


def test_a_rank_names_the_roles_it_holds():
    worker = ColocatedWorker({"actor": Scaler(2, [])})
    with pytest.raises(KeyError, match=r"holds no 'critic' worker \(it holds \['actor'\]\)"):
        worker.call_role_all(role_name="critic", role_method="name")
    with pytest.raises(ValueError, match="at least one role"):
        ColocatedWorker({})
