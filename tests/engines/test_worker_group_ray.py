"""Two DeepSpeed ranks on Ray actors (gloo) against one rank in this process.

The test of the global denominators: the same global mini-batches give the same updated weights
on 2 ranks (ZeRO-2, ZeRO-3; each rank walks its half in micro-batches of one row) as on 1 rank.
Dispatch order: rank k gets rows [k·B/2, (k+1)·B/2) and takes its mini-batches in order, so
global mini-batch j is rank 0's j-th pair plus rank 1's j-th pair; the 1-rank run gets the rows
in that order. Log-probs of a batch that needs padding match the 1-rank result, padded rows cut.

The worker (``ray_toy_worker``) is found by the actors through PYTHONPATH (``env``) and loaded
here from the same file under the same module name.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

from stages.engines.worker_group import LocalWorkerGroup
from stages.engines.worker_group_ray import RayWorkerGroup

pytestmark = pytest.mark.slow
ray = pytest.importorskip(
    "ray", reason="the ray extra is not installed: pip install 'ppoflow[ray]'"
)

TOY_DIR = Path(__file__).parent
#: global mini-batch j (rows 2j, 2j+1 of rank 0's half and of rank 1's half) in 1-rank order
ONE_RANK_ORDER = [0, 1, 4, 5, 2, 3, 6, 7]


def load_toy_module():
    if "ray_toy_worker" not in sys.modules:
        spec = importlib.util.spec_from_file_location(
            "ray_toy_worker", TOY_DIR / "ray_toy_worker.py"
        )
        module = importlib.util.module_from_spec(spec)
        sys.modules["ray_toy_worker"] = module
        spec.loader.exec_module(module)
    return sys.modules["ray_toy_worker"]


@pytest.fixture(scope="module")
def ray_group(tiny_model_dir):
    toy = load_toy_module()
    ray_was_running = ray.is_initialized()
    group = RayWorkerGroup(
        toy.ToyActorWorker,
        2,
        env={"PYTHONPATH": str(TOY_DIR)},
        ray_init={"object_store_memory": 200 * 1024**2},
        failure_grace_s=30,
        model_dir=str(tiny_model_dir),
    )
    yield group
    group.close()
    assert ray.is_initialized() == ray_was_running  # shut down only if the group started it


def local_reference(tiny_model_dir, **kwargs) -> LocalWorkerGroup:
    return LocalWorkerGroup(
        load_toy_module().ToyActorWorker, model_dir=str(tiny_model_dir), **kwargs
    )


@pytest.mark.parametrize("zero_stage", [2, 3])
def test_two_ranks_update_like_one_rank(ray_group, tiny_model_dir, zero_stage, make_rollout_batch):
    batch = make_rollout_batch([3, 5, 1, 4, 2, 5, 5, 1], [4, 2, 1, 3, 4, 0, 1, 4], P=5, R=4, seed=1)
    assert ray_group.call_all(
        "reset", zero_stage=zero_stage, mini_batch_size=2, micro_batch_size=1
    ) == [2, 2]  # both actors are in one 2-rank process group
    two = ray_group.call("update_actor", batch, allow_padding=False)
    rank_weights = ray_group.call_all("gathered_weights")

    one_group = local_reference(tiny_model_dir, zero_stage=zero_stage, mini_batch_size=4)
    initial = one_group.call_all("gathered_weights")[0]
    one = one_group.call("update_actor", batch.select_idxs(ONE_RANK_ORDER), allow_padding=False)
    expected = one_group.call_all("gathered_weights")[0]
    one_group.close()

    assert max((expected[n] - initial[n]).abs().max() for n in expected) > 1e-3  # it trained
    for name in expected:
        torch.testing.assert_close(rank_weights[0][name], rank_weights[1][name], atol=0, rtol=0)
        torch.testing.assert_close(
            rank_weights[0][name], expected[name], atol=2e-6, rtol=1e-5, msg=name
        )
    # Loss terms are partial sums under global denominators, so they match; clip fractions are
    # means of per-micro-batch fractions and depend on the micro-batch split, so they are not compared.
    for key in ("actor/pg_loss", "actor/grad_norm", "actor/lr"):
        assert two.meta_info["metrics"][key] == pytest.approx(
            one.meta_info["metrics"][key], rel=1e-4, abs=1e-6
        ), key


def test_log_probs_of_a_padded_batch_match_one_rank(ray_group, tiny_model_dir, make_rollout_batch):
    batch = make_rollout_batch(
        [3, 5, 1, 4, 2], [4, 2, 3, 3, 4], P=5, R=4, seed=3
    )  # 5 rows → 2 ranks
    ray_group.call_all("reset", zero_stage=3, mini_batch_size=1, micro_batch_size=None)
    two = ray_group.call("compute_log_prob", batch)

    one_group = local_reference(tiny_model_dir, zero_stage=3)
    one = one_group.call("compute_log_prob", batch)
    one_group.close()

    assert len(two) == 5 and "is_pad" not in two.non_tensor_batch
    assert not two.batch["echo_is_pad"].any()  # the one duplicated row was cut
    assert two.meta_info["metrics"]["toy/pad_rows"] == 0.5  # rank 0: no pad row, rank 1: one
    real = batch.batch["response_mask"].bool()  # each rank's forward runs at its rows' width
    torch.testing.assert_close(
        two.batch["old_log_probs"][real], one.batch["old_log_probs"][real], atol=1e-5, rtol=1e-5
    )


def test_a_worker_error_reaches_the_driver(ray_group, make_rollout_batch):
    batch = make_rollout_batch([3, 5], [4, 2], P=5, R=4)
    with pytest.raises(AttributeError, match="has no method 'no_such_method'"):
        ray_group.call("no_such_method", batch)
    assert ray_group.call_all("reset", zero_stage=2, mini_batch_size=1, micro_batch_size=None) == [
        2,
        2,
    ]  # the group is still usable


def test_two_ranks_sharing_a_chunk_return_one_result(ray_group):
    """ranks_per_chunk=2: both ranks get the whole (padded-to-1) batch and one output is kept,
    with rank 0's metrics; ranks that disagree are refused."""
    from dataproto import DataProto

    batch = DataProto.from_dict({"x": torch.arange(3)})
    out = ray_group.call("echo_rows", batch, ranks_per_chunk=2)
    assert out.batch["x"].tolist() == [0, 1, 2]
    assert out.meta_info["metrics"] == {"toy/rank": 0.0}
    apart = ray_group.call("echo_rows", batch)  # one chunk per rank: rows 0-1 | 2 + a copy of 0
    assert apart.batch["x"].tolist() == [0, 1, 2] and apart.meta_info["metrics"] == {
        "toy/rank": 0.5
    }
    with pytest.raises(RuntimeError, match="ranks 0 and 1 share one engine"):
        ray_group.call("echo_rows", batch, ranks_per_chunk=2, skew_rank=1)


def test_a_rank_left_in_a_collective_closes_the_group(ray_group):
    """Last in this module: it closes the shared group."""
    ray_group.failure_grace_s = 2
    with pytest.raises(
        RuntimeError, match=r"rank 1 failed in 'fail_on_rank' and ranks \[0\]"
    ) as info:
        ray_group.call_all("fail_on_rank", failing_rank=1)
    assert isinstance(info.value.__cause__, ValueError)
    with pytest.raises(RuntimeError, match="closed"):
        ray_group.call_all("reset", zero_stage=0, mini_batch_size=1, micro_batch_size=None)


def test_rank_zero_holds_the_rendezvous_port_from_the_moment_it_reports_it():
    """The port rank 0 reports is its store's, bound by then: no other process can take it
    before the ranks meet (before: a port seen free, released, and bound again later)."""
    import errno
    import socket

    from stages.engines.worker_group_ray import _RankHost

    host = _RankHost(0, 2, dict, {}, timeout_s=30)
    _, port = host.placement()
    assert port > 0
    with socket.socket() as probe, pytest.raises(OSError) as taken:
        probe.bind(("", port))
    assert taken.value.errno == errno.EADDRINUSE
    assert _RankHost(1, 2, dict, {}, timeout_s=30).placement()[1] == 0


def test_the_ranks_take_one_strict_spread_placement_group_removed_on_close():
    """After the shared group closed (Ray shut down): 2 ranks on the private instance (one
    node) → one placement group, STRICT_SPREAD, with one bundle of both ranks' CPUs, ready while
    the group lives and removed when it closes (tests/engines/test_ray_cluster.py: two nodes)."""
    from ray.util import placement_group_table

    assert not ray.is_initialized()
    with pytest.raises(
        ValueError, match=r"ranks_per_node must be an int ≥ 1 dividing world_size=2"
    ):
        RayWorkerGroup(dict, 2, ranks_per_node=3)
    group = RayWorkerGroup(dict, 2, num_cpus_per_rank=0.5)
    try:
        pg = placement_group_table(group._placement_group)
        assert (pg["strategy"], pg["state"], pg["bundles"]) == (
            "STRICT_SPREAD",
            "CREATED",
            {0: {"CPU": 1.0}},
        )
        group.close()
        assert not ray.is_initialized()  # the group started Ray and shut it down
    finally:
        group.close()
    assert group._placement_group is None
