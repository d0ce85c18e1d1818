"""A local Ray instance that ppoflow starts listens on loopback only (docs/reliability.md,
"Services on loopback").

Slow (~20 s on 2 loaded cores): Ray started the way the flow starts it — the ``ray`` worker
backend's group of the demo config's 2 ranks, ``ray.init`` arguments from ``ray_init_options`` —
and then every listening TCP socket and every unconnected UDP socket of the driver and of every
process under it (GCS, raylet, dashboard and its agent, runtime-env agent, autoscaler monitor,
the rank actors with their rendezvous store and gloo sockets, idle workers) is on 127.0.0.1 or
::1. It fails, too, if a Ray upgrade stops honouring the internal switch ppoflow sets
(``ray._private.ray_constants.ENABLE_RAY_CLUSTER``): the local instance then takes a routable
node address and its servers listen on every interface.

Fast: the switch is set only while Ray starts and only for a local instance, Ray still resolves
a loopback node address under it, a refused node address, the rank-0 rendezvous store on
127.0.0.1, gloo kept on the loopback interface.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from types import SimpleNamespace

import pytest

from flows.engines import ray_init_options
from stages.config import load_config
from stages.engines.worker_group import make_worker_group
from stages.engines.worker_group_ray import (
    RAY_CLUSTER_SWITCH,
    RayWorkerGroup,
    _RankHost,
    check_loopback_node,
    gloo_on_loopback,
    is_loopback,
    loopback_interface,
    loopback_node,
)

ray = pytest.importorskip(
    "ray", reason="the ray extra is not installed: pip install 'ppoflow[ray]'"
)
psutil = pytest.importorskip("psutil")  # after Ray, which ships it

REPO = Path(__file__).resolve().parents[2]
LOOPBACK = {"127.0.0.1", "::1"}


def listeners(pids: set[int]) -> set[tuple[int, str, str, int]]:
    """(pid, "tcp"/"udp", ip, port) of each listening TCP and unconnected UDP socket of ``pids``;
    an IPv4-mapped address (an IPv6 socket bound to 127.0.0.1) as its IPv4 form."""
    found = set()
    for conn in psutil.net_connections(kind="inet"):
        if conn.pid not in pids or not conn.laddr:
            continue
        is_tcp = conn.type == socket.SOCK_STREAM
        if (is_tcp and conn.status != psutil.CONN_LISTEN) or (not is_tcp and conn.raddr):
            continue
        ip = conn.laddr.ip.removeprefix("::ffff:")
        found.add((conn.pid, "tcp" if is_tcp else "udp", ip, conn.laddr.port))
    return found


def process_name(pid: int) -> str:
    """``driver``, ``gcs_server``, ``raylet``, ``ray::_RankHost``, ``monitor.py``, …"""
    if pid == os.getpid():
        return "driver"
    try:
        args = " ".join(psutil.Process(pid).cmdline()).split()
    except psutil.Error:
        return "?"
    is_python = len(args) > 1 and os.path.basename(args[0]).startswith("python")
    scripts = [a for a in args[1:] if a.endswith(".py")] if is_python else []
    return os.path.basename(scripts[0] if scripts else args[0]) if args else "?"


@pytest.mark.slow
def test_every_process_of_the_local_ray_instance_listens_on_loopback_only(monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert not ray.is_initialized()
    config = load_config(
        REPO / "configs" / "demo-cpu.yaml",
        ["ppoflow.workers.backend=ray", "trainer.n_gpus_per_node=2"],
    )
    driver = os.getpid()
    before = listeners({driver})  # this test process's own, from other tests
    group = make_worker_group(
        "ray",
        dict,  # a trivial worker: each rank still joins the 2-rank gloo world
        config.derived.dp_size,
        num_cpus_per_rank=config.ppoflow.workers.num_cpus_per_rank,
        num_gpus_per_rank=0,
        ray_init=ray_init_options(config, 0),
    )
    try:
        pids = {driver, *(p.pid for p in psutil.Process(driver).children(recursive=True))}
        found = listeners(pids) - before
        names = {pid: process_name(pid) for pid, *_ in found}
    finally:
        group.close()
    assert not ray.is_initialized()

    def show(sockets):
        return sorted(f"{names[pid]}[{pid}] {kind} {ip}:{port}" for pid, kind, ip, port in sockets)

    shown = show(found)
    assert {"gcs_server", "raylet", "ray::RuntimeEnvAgent"} <= set(names.values()), shown
    ranks = [pid for pid, name in names.items() if name == "ray::_RankHost"]
    assert len(ranks) == 2, shown  # each: its core worker's server and gloo; rank 0: the store
    assert show(s for s in found if s[2] not in LOOPBACK) == [], shown
    assert RAY_CLUSTER_SWITCH not in os.environ  # the driver's environment is restored


def test_ray_still_resolves_a_loopback_node_address_under_the_switch(monkeypatch):
    """The Ray-upgrade canary of the fast suite: the names ppoflow sets still exist and a local
    node address resolves to loopback under them (a local ``ray.init`` takes it)."""
    from ray._private import ray_constants, services

    if ray.is_initialized():
        pytest.skip("Ray is running in this process: it answers with its node's address")
    monkeypatch.delenv(RAY_CLUSTER_SWITCH, raising=False)
    assert ray_constants.ENABLE_RAY_CLUSTERS_ENV_VAR == RAY_CLUSTER_SWITCH
    assert hasattr(ray_constants, "ENABLE_RAY_CLUSTER")
    outside = ray_constants.ENABLE_RAY_CLUSTER
    with loopback_node(ray):
        assert os.environ[RAY_CLUSTER_SWITCH] == "0"
        assert is_loopback(services.get_node_ip_address())
        assert is_loopback(services.resolve_ip_for_localhost("127.0.0.1"))
    assert RAY_CLUSTER_SWITCH not in os.environ
    assert ray_constants.ENABLE_RAY_CLUSTER is outside


def test_the_switch_is_set_only_while_a_local_instance_starts(monkeypatch):
    from ray._private import ray_constants

    seen = []
    fake = SimpleNamespace(
        is_initialized=lambda: False,
        init=lambda **kw: seen.append(
            (kw, os.environ.get(RAY_CLUSTER_SWITCH), ray_constants.ENABLE_RAY_CLUSTER)
        ),
        util=SimpleNamespace(get_node_ip_address=lambda: "127.0.0.1"),
        __version__="test",
    )
    group = object.__new__(RayWorkerGroup)
    group._ray, group.world_size, group.ranks_per_node = fake, 2, 2
    monkeypatch.setenv(RAY_CLUSTER_SWITCH, "1")  # a value of the user's: restored afterwards
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    group._start_ray(2, 0, {"object_store_memory": 1})
    assert seen.pop() == (  # address "local": never the cluster of Ray's last-cluster file
        {"address": "local", "num_cpus": 2, "include_dashboard": False, "object_store_memory": 1},
        "0",
        False,
    )
    assert os.environ[RAY_CLUSTER_SWITCH] == "1"
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")  # a cluster is joined as it is
    group._start_ray(2, 0, {"object_store_memory": 1})
    assert seen.pop() == ({"object_store_memory": 1}, "1", ray_constants.ENABLE_RAY_CLUSTER)


def test_a_local_instance_on_a_routable_address_is_refused():
    fake = SimpleNamespace(
        util=SimpleNamespace(get_node_ip_address=lambda: "192.0.2.2"), __version__="9.9"
    )
    with pytest.raises(RuntimeError, match=r"\(Ray 9\.9\) took 192\.0\.2\.2 .* RAY_ADDRESS"):
        check_loopback_node(fake)
    check_loopback_node(SimpleNamespace(util=SimpleNamespace(get_node_ip_address=lambda: "::1")))


def test_rank_zero_opens_the_rendezvous_store_on_loopback_for_a_loopback_node(monkeypatch):
    monkeypatch.setattr(ray.util, "get_node_ip_address", lambda: "127.0.0.1")
    host = _RankHost(0, 2, dict, {}, timeout_s=30)
    ip, port = host.placement()
    assert ip == "127.0.0.1" and port > 0
    assert {(kind, a) for _, kind, a, p in listeners({os.getpid()}) if p == port} == {
        ("tcp", "127.0.0.1")
    }
    with socket.create_connection(("127.0.0.1", port), timeout=5):
        pass  # the store accepts there
    host._store = None


def test_gloo_stays_on_the_loopback_interface_when_every_rank_is_on_this_node():
    interface = loopback_interface()
    assert interface  # "lo" on Linux
    assert gloo_on_loopback("127.0.0.1", {}) == {"GLOO_SOCKET_IFNAME": interface}
    assert gloo_on_loopback("127.0.0.1", {"GLOO_SOCKET_IFNAME": "eth1"}) == {}  # the user's
    assert gloo_on_loopback("10.0.0.5", {}) == {}  # ranks on several nodes
