"""Every collective of the update loop runs on the batch's device (the engine's): NCCL refuses
CPU tensors, so a tensor built on the host there fails only on a GPU. CPU shows it with tensors
on the ``meta`` device and a recording ``all_reduce`` in place of a process group of two."""

from __future__ import annotations

import pytest
import torch

from stages.engines import batching


class ReachedCollective(Exception):
    """Raised by the fake all_reduce where the caller would read the result: a meta tensor has
    no value."""


@pytest.fixture
def two_ranks(monkeypatch):
    """A pretend process group of two ranks; returns the devices all_reduce was called with. A
    reduction with an ``op`` (a MAX, read back at once) of a meta tensor stops the caller."""
    devices: list[torch.device] = []

    def all_reduce(tensor, op=None):
        devices.append(tensor.device)
        if op is not None and tensor.device.type == "meta":
            raise ReachedCollective

    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.distributed, "get_world_size", lambda group=None: 2)
    monkeypatch.setattr(torch.distributed, "all_reduce", all_reduce)
    return devices


def test_the_micro_batch_count_is_agreed_on_the_engines_device(two_ranks):
    with pytest.raises(ReachedCollective):
        batching._max_over_ranks(3, torch.device("meta"))
    assert two_ranks == [torch.device("meta")]


def test_the_token_budget_plan_agrees_on_the_masks_device(two_ranks):
    mask = torch.ones(4, 6, dtype=torch.long)
    plan = batching.MicroBatching(use_dynamic_bsz=True, max_token_len=12).plan(mask)
    assert sorted(i for rows in plan for i in rows) == [0, 1, 2, 3]
    assert two_ranks == [mask.device]


def test_the_token_count_is_summed_on_the_masks_device(two_ranks):
    info = batching.global_batch_info(torch.ones(4, 6, dtype=torch.long, device="meta"))
    assert two_ranks == [torch.device("meta")]
    assert (info.dp_size, info.global_batch_size) == (2, 8)
