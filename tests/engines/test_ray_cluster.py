"""Where the Ray worker group's Ray comes from, and where its ranks land.

Fast: the connection to ``RAY_ADDRESS`` is bounded by ``connect_timeout_s`` (a stand-in Ray whose
``init`` blocks), a connection abandoned at the deadline is shut down when it completes, and a
private instance (one node) refuses ranks that span nodes.

Slow: the private instance is started with ``address="local"``, so a last-cluster file naming a
silent address is not joined; a real ``ray.init`` to a silent ``RAY_ADDRESS`` gives up at the
deadline with one line (in a process of its own: the abandoned connection attempt runs on there);
on a two-node ``ray.cluster_utils.Cluster`` (a head and a worker node, 2 CPUs each, on loopback)
one rank per node puts the two ranks on both nodes, two per node puts them on one, and three
nodes of ranks wait and then say what is missing.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace

import pytest

from stages.engines.worker_group_ray import RayWorkerGroup, connect_within

ray = pytest.importorskip(
    "ray", reason="the ray extra is not installed: pip install 'ppoflow[ray]'"
)

REPO = Path(__file__).resolve().parents[2]


@contextmanager
def silent_address() -> Iterator[str]:
    """``127.0.0.1:port`` of a socket that accepts connections (the kernel's backlog) and never
    says a word: a Ray GCS that does not answer."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        yield f"127.0.0.1:{listener.getsockname()[1]}"


@pytest.fixture
def ray_tmpdir(monkeypatch) -> Iterator[Path]:
    """RAY_TMPDIR of this test's own (short: Ray's socket paths must stay short), so Ray's
    last-cluster file here is nobody else's."""
    path = Path(tempfile.mkdtemp(prefix="rayt", dir="/tmp"))
    monkeypatch.setenv("RAY_TMPDIR", str(path))
    yield path
    shutil.rmtree(path, ignore_errors=True)


# --- fast ------------------------------------------------------------------------------------------


def test_a_connection_past_its_deadline_fails_and_is_shut_down_when_it_completes(monkeypatch):
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")
    release, shut_down = threading.Event(), threading.Event()
    fake = SimpleNamespace(init=lambda **kw: release.wait(30), shutdown=shut_down.set)
    started = time.monotonic()
    with pytest.raises(TimeoutError) as error:
        connect_within(fake, {}, timeout_s=0.2)
    assert time.monotonic() - started < 5
    assert str(error.value) == (
        "error: the Ray cluster at RAY_ADDRESS=10.0.0.1:6379 did not answer within 0.2 s "
        "(connect_timeout_s): set RAY_ADDRESS to the head's GCS address (host:port of "
        "`ray start --head`, `ray status` there) reachable from this machine, or unset it to "
        "start a private Ray instance"
    )
    release.set()  # the abandoned ray.init completes: its thread disconnects again
    assert shut_down.wait(10)


def test_a_failed_connection_names_the_address(monkeypatch):
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")

    def refuse(**options):
        raise ConnectionError("Failed to connect to Ray cluster at 10.0.0.1:6379")

    fake = SimpleNamespace(init=refuse, shutdown=lambda: pytest.fail("nothing to shut down"))
    with pytest.raises(ConnectionError, match=r"^error: could not connect .* RAY_ADDRESS=10\."):
        connect_within(fake, {"namespace": "x"}, timeout_s=5)
    seen = []
    connect_within(SimpleNamespace(init=lambda **kw: seen.append(kw)), {"namespace": "x"}, 5)
    assert seen == [{"namespace": "x"}]


def test_a_private_instance_is_one_node(monkeypatch):
    if ray.is_initialized():
        pytest.skip("Ray is running in this process: the group would use it")
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    with pytest.raises(
        ValueError,
        match=r"^error: ranks_per_node=1 puts the 2 ranks on 2 nodes, .* private Ray instance, "
        r"which is one node: set RAY_ADDRESS to a cluster of 2 nodes, or ranks_per_node=2",
    ):
        RayWorkerGroup(dict, 2, ranks_per_node=1)
    assert not ray.is_initialized()  # refused before Ray started


# --- slow: a private instance, a silent cluster -----------------------------------------------------


@pytest.mark.slow
@pytest.mark.timeout(240)  # before address="local": ray.init joined the file's address, for minutes
def test_the_private_instance_never_joins_the_last_cluster_file(ray_tmpdir, monkeypatch):
    assert not ray.is_initialized()
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    with silent_address() as address:
        (ray_tmpdir / "ray").mkdir()
        (ray_tmpdir / "ray" / "ray_current_cluster").write_text(address)
        group = RayWorkerGroup(ray.get_runtime_context, 1)
        try:
            own = ray.get_runtime_context().gcs_address
            nodes = group.call_all("get_node_id")
        finally:
            group.close()
    assert own != address and own.startswith("127.0.0.1:")  # a private instance, on loopback
    assert len(nodes) == 1
    assert not ray.is_initialized()


@pytest.mark.slow
def test_a_silent_ray_address_fails_at_the_deadline_with_one_line(ray_tmpdir):
    """In a process of its own: the abandoned attempt goes on there until Ray gives up."""
    code = (
        "import time\n"
        "from stages.engines.worker_group_ray import RayWorkerGroup\n"
        "started = time.monotonic()\n"
        "try:\n"
        "    RayWorkerGroup(dict, 1, connect_timeout_s=3)\n"
        "except TimeoutError as error:\n"
        "    print(f'{time.monotonic() - started:.1f}')\n"
        "    print(error)\n"
    )
    with silent_address() as address:
        env = {
            **os.environ,
            "RAY_ADDRESS": address,
            "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",  # keep 127.0.0.1: the silent socket's
        }
        done = subprocess.run(
            [sys.executable, "-c", code],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,  # before the deadline: Ray retried this address for a quarter hour
        )
    lines = done.stdout.splitlines()
    assert len(lines) == 2, done.stdout + done.stderr
    assert 3 <= float(lines[0]) < 10
    assert lines[1].startswith(f"error: the Ray cluster at RAY_ADDRESS={address} did not answer ")
    assert "within 3 s (connect_timeout_s)" in lines[1]


# --- slow: a cluster of two nodes ---------------------------------------------------------------


def node_ids_of(resource: str) -> set[str]:
    return {n["NodeID"] for n in ray.nodes() if n["Alive"] and resource in n["Resources"]}


@pytest.mark.slow
@pytest.mark.parametrize(("ranks_per_node", "nodes"), [(1, 2), (2, 1)])
def test_each_node_of_ranks_lands_on_a_node_of_its_own(
    two_node_cluster, ranks_per_node, nodes, monkeypatch
):
    from ray.util import placement_group_table

    monkeypatch.setenv("RAY_ADDRESS", two_node_cluster.address)
    group = RayWorkerGroup(ray.get_runtime_context, 2, ranks_per_node=ranks_per_node)
    try:
        rank_nodes = group.call_all("get_node_id")
        table = placement_group_table(group._placement_group)
        cluster_nodes = node_ids_of("head_node") | node_ids_of("worker_node")
    finally:
        group.close()
    assert not ray.is_initialized()  # disconnected; the cluster runs on
    assert (table["strategy"], len(table["bundles"])) == ("STRICT_SPREAD", nodes)
    assert all(b == {"CPU": float(ranks_per_node)} for b in table["bundles"].values())
    assert len(cluster_nodes) == 2 and set(rank_nodes) <= cluster_nodes
    assert len(set(rank_nodes)) == nodes  # one node: both ranks together; two: one on each
    assert rank_nodes == [table["bundles_to_node_id"][r // ranks_per_node] for r in range(2)]


@pytest.mark.slow
def test_more_nodes_of_ranks_than_nodes_wait_and_say_so(two_node_cluster, monkeypatch):
    monkeypatch.setenv("RAY_ADDRESS", two_node_cluster.address)
    with pytest.raises(
        RuntimeError,
        match=r"no 3 distinct Ray node\(s\) with \{'CPU': 1\} free each \(the 3 ranks, 1 per node, "
        r"one STRICT_SPREAD placement group\) came up within 3 s; the cluster has 2 alive node",
    ):
        RayWorkerGroup(dict, 3, ranks_per_node=1, startup_timeout_s=3)
    assert not ray.is_initialized()  # the group disconnected when it failed
