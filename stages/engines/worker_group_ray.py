"""The Ray worker group: one Ray actor per data-parallel rank, one torch.distributed group.

Each rank is a Ray actor process (:class:`_RankHost`) that sets the launcher variables —
RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT — joins the ranks' one world (gloo on CPU,
nccl on CUDA; rendezvous below), and then builds the role worker with ``factory(**kwargs)``, whose
DeepSpeed engines use that world. The worker stays resident; each :meth:`RayWorkerGroup.call`
ships one chunk of the batch to each rank and the outputs back.

Rendezvous: rank 0's actor opens a ``torch.distributed.TCPStore`` on a port the OS assigns as it
binds (so no other process can take the port between choosing and binding it), and every rank
joins the world through that store before its worker is built
(``deepspeed_setup.join_process_group``); MASTER_ADDR / MASTER_PORT name it. When every rank runs
on one node (one machine, the usual case) MASTER_ADDR is 127.0.0.1; when the ranks span several
nodes of a Ray cluster it is rank 0's node IP (as Ray reports it), which the other nodes must be
able to reach on that port. LOCAL_RANK is the rank's index among the ranks on its node, or 0 when each rank holds
a GPU (Ray then restricts CUDA_VISIBLE_DEVICES to that one GPU, which is cuda:0 in the actor).
Placement: one Ray placement group per worker group, strategy STRICT_SPREAD, with one bundle
per node of ranks (``ranks_per_node`` × the rank's CPUs and GPU): rank r runs in bundle
r // ``ranks_per_node``. A bundle lies on one machine, so a node's ranks land together (their
NCCL traffic stays on NVLink), and STRICT_SPREAD puts every bundle on a different machine, so
``world_size / ranks_per_node`` nodes of ranks take as many distinct Ray nodes. The group waits
for such nodes and says so after ``startup_timeout_s``. The placement group is removed when the
group closes.

Environment of every actor, from process start (Ray ``runtime_env`` env_vars): OMP_NUM_THREADS =
``num_cpus_per_rank``, TORCH_EXTENSIONS_DIR passed through from the driver when set (DeepSpeed's
JIT-compiled ops are cached there), then ``env`` (e.g. PYTHONPATH for a factory defined outside
the installed packages). DS_ACCELERATOR=cpu is set in the actor when it sees no CUDA device.

Ray itself: ``ray.init`` is called only when Ray is not initialised yet, in one of two ways.
With no ``RAY_ADDRESS`` the group starts a private instance, ``ray.init(address="local")`` with
``world_size × num_cpus_per_rank`` CPUs and no dashboard: it never joins a cluster that Ray would
otherwise find through its last-cluster file (``<RAY_TMPDIR or /tmp>/ray/ray_current_cluster``,
written by ``ray start``). It is one node, so ranks spanning several nodes need a cluster. With
``RAY_ADDRESS`` set the group connects to that cluster, within ``connect_timeout_s``
(:func:`connect_within`). :meth:`RayWorkerGroup.close` kills the actors and calls
``ray.shutdown`` only if this group started Ray. Importing this module does not import Ray.

Loopback: every process of a local instance listens on loopback only (:func:`loopback_node`;
docs/reliability.md, "Services on loopback"), and so do the ranks' rendezvous store and, when
every rank is on one node, their gloo sockets. A cluster at ``RAY_ADDRESS``, or a Ray the caller
started, is used as it is.
"""

from __future__ import annotations

import importlib
import ipaddress
import math
import os
import socket
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

from dataproto import DataProto
from stages.engines.dispatch import check_divisor, collect_from_ranks, split_for_ranks
from stages.engines.worker_group import check_method
from stages.skipped_imports import install as install_skipped_imports

#: seconds to wait for every rank's actor to start (import torch/DeepSpeed, get scheduled)
DEFAULT_STARTUP_TIMEOUT_S = 600.0
#: after one rank fails, seconds the others get to finish before the group is declared broken
DEFAULT_FAILURE_GRACE_S = 60.0
#: seconds ``ray.init`` may take to connect to the cluster at ``RAY_ADDRESS``
DEFAULT_CONNECT_TIMEOUT_S = 60.0
#: Ray's single-machine switch: ``=0`` makes Ray take a loopback node address, as it does on
#: Windows and macOS (Ray documents ``=1``, multi-node clusters there); read when Ray is imported
RAY_CLUSTER_SWITCH = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


def import_ray():
    """``import ray``, or an ImportError that says how to install it."""
    try:
        import ray
    except ImportError as error:
        raise ImportError(
            "the 'ray' worker backend needs Ray, which is not installed: "
            "pip install 'ppoflow[ray]' (or set ppoflow.workers.backend=local)"
        ) from error
    return ray


def is_loopback(host: str) -> bool:
    """Whether ``host`` is a loopback address (an IPv4-mapped one too).

    Example:
        >>> [is_loopback(h) for h in ("127.0.0.1", "::1", "::ffff:127.0.0.1", "::", "192.0.2.2")]
        [True, True, True, False, False]
    """
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    return (getattr(address, "ipv4_mapped", None) or address).is_loopback


@contextmanager
def loopback_node(ray: Any) -> Iterator[None]:
    """While a local Ray instance starts: Ray takes a loopback node address, so every process it
    starts listens on loopback only; the driver's settings are restored afterwards.

    Ray (read in 2.60's source, checked by ``tests/engines/test_ray_loopback.py``) binds its
    servers by the node address: the GCS, the raylet (node and object manager), each worker's
    gRPC server, the dashboard and runtime-env agents and the metrics endpoints listen on every
    interface unless that address is localhost. On Linux Ray takes the machine's routable IP,
    and replaces a localhost one (``ray.init(_node_ip_address="127.0.0.1")``) by it, unless
    ``ray._private.ray_constants.ENABLE_RAY_CLUSTER`` is false. Ray sets that constant from
    :data:`RAY_CLUSTER_SWITCH` when it is imported — already done here — so the constant (an
    internal name; :func:`check_loopback_node` catches a Ray that drops it) is set as well as the
    variable, which the processes Ray starts inherit.
    """
    constants = importlib.import_module("ray._private.ray_constants")
    saved_constant = getattr(constants, "ENABLE_RAY_CLUSTER", None)
    saved_variable = os.environ.get(RAY_CLUSTER_SWITCH)
    constants.ENABLE_RAY_CLUSTER = False
    os.environ[RAY_CLUSTER_SWITCH] = "0"
    try:
        yield
    finally:
        constants.ENABLE_RAY_CLUSTER = saved_constant
        if saved_variable is None:
            os.environ.pop(RAY_CLUSTER_SWITCH, None)
        else:
            os.environ[RAY_CLUSTER_SWITCH] = saved_variable


def check_loopback_node(ray: Any) -> None:
    """Raise unless the running local Ray instance took a loopback node address."""
    node_ip = ray.util.get_node_ip_address()
    if not is_loopback(node_ip):
        raise RuntimeError(
            f"the local Ray instance (Ray {ray.__version__}) took {node_ip} as its node address, "
            "so its processes listen on every interface, unauthenticated; ppoflow keeps a local "
            f"instance on loopback through {RAY_CLUSTER_SWITCH}=0 (ray._private.ray_constants."
            "ENABLE_RAY_CLUSTER), which this Ray does not honour, or ray_init named a node "
            "address. Use a Ray that honours it (checked: 2.60), or start Ray yourself where "
            "its ports cannot be reached from other machines (a firewall, a network namespace) "
            "and set RAY_ADDRESS to it (docs/reliability.md, Services on loopback)"
        )


def loopback_interface() -> str | None:
    """The name of the network interface that holds 127.0.0.1 (``lo`` on Linux), or None."""
    import psutil  # a dependency of DeepSpeed (and shipped with Ray)

    for name, addresses in psutil.net_if_addrs().items():
        if any(a.family == socket.AF_INET and a.address == "127.0.0.1" for a in addresses):
            return name
    return None


def gloo_on_loopback(master_addr: str, environ: Mapping[str, str]) -> dict[str, str]:
    """``GLOO_SOCKET_IFNAME`` = the loopback interface when every rank is on this node
    (``master_addr`` 127.0.0.1) and ``environ`` does not set it; else nothing. Without it gloo
    listens on the address the host name resolves to, often the machine's routable one."""
    if master_addr != "127.0.0.1" or "GLOO_SOCKET_IFNAME" in environ:
        return {}
    interface = loopback_interface()
    return {"GLOO_SOCKET_IFNAME": interface} if interface else {}


def connect_within(ray: Any, options: dict[str, Any], timeout_s: float) -> None:
    """``ray.init(**options)`` to the cluster at ``RAY_ADDRESS``, or one error line after
    ``timeout_s`` seconds.

    Ray bounds no connection as a whole: read in 2.60's source (``ray._private.node.Node.
    _init_gcs_client``), a driver makes up to ``RAY_NUM_REDIS_GET_RETRIES`` (20) attempts on a
    GCS that does not answer, each waiting ``gcs_rpc_server_connect_timeout_s`` (5 s) for the
    GCS channel, as long for its pub-sub channel, then ``py_gcs_connect_timeout_s`` (30 s): a
    quarter of an hour. Those knobs are C++ config read once per process, so instead
    ``ray.init`` runs on a daemon thread and the caller waits for it ``timeout_s``. A
    connection abandoned at the deadline that still succeeds later is shut down by its thread,
    so Ray is never left initialised behind the error; until Ray gives it up the attempt runs
    on, so start Ray again in a new process, not in this one.

    Raises:
        TimeoutError: no connection within ``timeout_s``; the message names ``RAY_ADDRESS`` and
            ``connect_timeout_s``.
        ConnectionError: ``ray.init`` failed within the deadline (its error chained).
    """
    address = os.environ.get("RAY_ADDRESS", "")
    lock, outcome = threading.Lock(), {}

    def connect() -> None:
        try:
            ray.init(**options)
        except BaseException as error:  # handed to the waiting caller, never lost
            outcome["error"] = error
        with lock:
            outcome["done"] = True
            if outcome.get("abandoned") and "error" not in outcome:
                ray.shutdown()

    thread = threading.Thread(target=connect, name="ray-init", daemon=True)
    thread.start()
    thread.join(timeout_s)
    with lock:
        if not outcome.get("done"):
            outcome["abandoned"] = True
            raise TimeoutError(
                f"error: the Ray cluster at RAY_ADDRESS={address} did not answer within "
                f"{timeout_s:g} s (connect_timeout_s): set RAY_ADDRESS to the head's GCS "
                "address (host:port of `ray start --head`, `ray status` there) reachable from "
                "this machine, or unset it to start a private Ray instance"
            )
    if "error" in outcome:
        raise ConnectionError(
            f"error: could not connect to the Ray cluster at RAY_ADDRESS={address}: "
            f"{outcome['error']}"
        ) from outcome["error"]


class _RankHost:
    """One rank's actor: sets the rank's environment, builds the worker, runs its methods."""

    def __init__(
        self,
        rank: int,
        world_size: int,
        factory: Callable[..., Any],
        kwargs: dict[str, Any],
        timeout_s: float,
    ) -> None:
        self.rank = rank
        self.world_size = world_size
        self._factory = factory
        self._kwargs = kwargs
        self._timeout = timedelta(seconds=timeout_s)
        self._store: Any = None
        self.worker: Any = None
        install_skipped_imports()  # this rank's process imports the libraries after it

    def placement(self) -> tuple[str, int]:
        """(this node's IP as Ray sees it, the rendezvous port; 0 on ranks other than 0).

        Rank 0 opens the rendezvous store here and keeps it until the group closes: on
        127.0.0.1 when the node address is loopback (a local instance: every rank is on this
        machine), else on every interface (ranks on other nodes reach it at the node IP).
        """
        import ray
        from torch.distributed import TCPStore

        ip = ray.util.get_node_ip_address()
        if self.rank != 0:
            return ip, 0
        host, port, listen_fd = ip, 0, None
        if is_loopback(ip):
            listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            listener.bind(("127.0.0.1", 0))
            host, port, listen_fd = "127.0.0.1", listener.getsockname()[1], listener.detach()
        self._store = TCPStore(
            host,
            port,
            self.world_size,
            is_master=True,
            wait_for_workers=False,
            timeout=self._timeout,
            master_listen_fd=listen_fd,  # the store's server owns (and closes) the socket
        )
        return ip, self._store.port

    def build(self, env: dict[str, str]) -> None:
        """Set the launcher variables, join the world through rank 0's store, build the worker."""
        from torch.distributed import TCPStore

        from stages.engines.deepspeed_setup import join_process_group

        os.environ.update(env)
        os.environ.update(gloo_on_loopback(env["MASTER_ADDR"], os.environ))
        store = self._store or TCPStore(
            env["MASTER_ADDR"], int(env["MASTER_PORT"]), self.world_size, timeout=self._timeout
        )
        join_process_group(store, self.rank, self.world_size)
        self.worker = self._factory(**self._kwargs)

    def call(self, method: str, batch: DataProto, kwargs: dict[str, Any]) -> Any:
        return check_method(self.worker, method, self.rank)(batch, **kwargs)

    def call_all(self, method: str, kwargs: dict[str, Any]) -> Any:
        return check_method(self.worker, method, self.rank)(**kwargs)


def rank_environment(
    node_ips: Sequence[str], master_port: int, *, gpu_per_rank: bool
) -> list[dict[str, str]]:
    """The launcher variables of each rank, given the node IP each rank's actor runs on.

    Example:
        >>> [e["LOCAL_RANK"] + "@" + e["MASTER_ADDR"] for e in rank_environment(["a", "a"], 5, gpu_per_rank=False)]
        ['0@127.0.0.1', '1@127.0.0.1']
        >>> [e["LOCAL_RANK"] + "@" + e["MASTER_ADDR"] for e in rank_environment(["a", "b"], 5, gpu_per_rank=False)]
        ['0@a', '0@a']
    """
    master_addr = "127.0.0.1" if len(set(node_ips)) == 1 else node_ips[0]
    envs = []
    for rank, ip in enumerate(node_ips):
        local_rank = 0 if gpu_per_rank else list(node_ips[:rank]).count(ip)
        envs.append(
            {
                "RANK": str(rank),
                "LOCAL_RANK": str(local_rank),
                "WORLD_SIZE": str(len(node_ips)),
                "MASTER_ADDR": master_addr,
                "MASTER_PORT": str(master_port),
            }
        )
    return envs


def _check_env(env: dict[str, str] | None) -> dict[str, str]:
    env = dict(env or {})
    bad = {
        k: type(v).__name__
        for k, v in env.items()
        if not (isinstance(k, str) and isinstance(v, str))
    }
    if bad:
        raise TypeError(f"env must map str to str; these entries are not: {bad}")
    return env


class RayWorkerGroup:
    """``world_size`` ranks of one role, each a Ray actor holding a worker built by ``factory``.

    Args:
        factory: picklable callable building the worker in the rank's process (a class or a
            module-level function of a module the actors can import).
        world_size: number of data-parallel ranks.
        num_cpus_per_rank / num_gpus_per_rank: Ray resources reserved per rank.
        ranks_per_node: ranks packed on one node (one bundle of the group's STRICT_SPREAD
            placement group: each node of ranks on a different Ray node); None = all of them;
            must divide ``world_size``. Several nodes of ranks need a cluster (``RAY_ADDRESS``).
        env: extra environment variables for every rank (strings).
        ray_init: extra ``ray.init`` arguments, used only if this group starts Ray
            (e.g. ``{"object_store_memory": 200 * 1024**2}``); a local instance stays on
            loopback (a ``_node_ip_address`` that is not loopback is refused).
        startup_timeout_s: how long to wait for the nodes and for every actor to start.
        connect_timeout_s: how long ``ray.init`` may take to connect to ``RAY_ADDRESS``.
        failure_grace_s: after a rank raises, how long the others may run on before the group is
            closed as broken (a rank blocked in a collective would otherwise wait forever).
        **kwargs: the factory's arguments (the same on every rank).
    """

    def __init__(
        self,
        factory: Callable[..., Any],
        world_size: int,
        *,
        num_cpus_per_rank: float = 1,
        num_gpus_per_rank: float = 0,
        ranks_per_node: int | None = None,
        env: dict[str, str] | None = None,
        ray_init: dict[str, Any] | None = None,
        startup_timeout_s: float = DEFAULT_STARTUP_TIMEOUT_S,
        connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S,
        failure_grace_s: float = DEFAULT_FAILURE_GRACE_S,
        **kwargs: Any,
    ) -> None:
        if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
            raise ValueError(f"world_size must be an int ≥ 1, got {world_size!r}")
        if not callable(factory):
            raise TypeError(f"factory must be callable, got {type(factory).__name__}")
        if num_cpus_per_rank <= 0 or num_gpus_per_rank < 0:
            raise ValueError(
                f"num_cpus_per_rank must be > 0 and num_gpus_per_rank ≥ 0, got "
                f"{num_cpus_per_rank} and {num_gpus_per_rank}"
            )
        if not connect_timeout_s > 0:
            raise ValueError(f"connect_timeout_s must be > 0 s, got {connect_timeout_s!r}")
        ranks_per_node = world_size if ranks_per_node is None else ranks_per_node
        check_divisor("ranks_per_node", ranks_per_node, world_size, f"world_size={world_size}")
        env = _check_env(env)
        self._ray = import_ray()
        self.world_size = world_size
        self.ranks_per_node = ranks_per_node
        self.failure_grace_s = failure_grace_s
        self._actors: list[Any] = []
        self._placement_group: Any = None
        self._owns_ray = False
        try:
            self._start_ray(
                world_size * num_cpus_per_rank,
                world_size * num_gpus_per_rank,
                ray_init,
                connect_timeout_s,
            )
            self._start_actors(
                factory,
                kwargs,
                num_cpus_per_rank,
                num_gpus_per_rank,
                env,
                startup_timeout_s,
            )
        except BaseException:
            self.close()
            raise

    def _start_ray(
        self,
        num_cpus: float,
        num_gpus: float,
        ray_init: dict[str, Any] | None,
        connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S,
    ) -> None:
        ray = self._ray
        if ray.is_initialized():
            return
        if os.environ.get("RAY_ADDRESS"):  # an existing cluster: connect, it has its resources
            connect_within(ray, ray_init or {}, connect_timeout_s)
            self._owns_ray = True
            return
        nodes = self.world_size // self.ranks_per_node
        if nodes > 1:
            raise ValueError(
                f"error: ranks_per_node={self.ranks_per_node} puts the {self.world_size} ranks "
                f"on {nodes} nodes, but with RAY_ADDRESS unset the group starts a private Ray "
                f"instance, which is one node: set RAY_ADDRESS to a cluster of {nodes} nodes, "
                f"or ranks_per_node={self.world_size} (trainer.nnodes=1)"
            )
        options: dict[str, Any] = {
            "address": "local",  # never a cluster named by Ray's last-cluster file
            "num_cpus": max(1, math.ceil(num_cpus)),
            "include_dashboard": False,
        }
        if num_gpus:
            options["num_gpus"] = math.ceil(num_gpus)
        with loopback_node(ray):
            ray.init(**{**options, **(ray_init or {})})
        self._owns_ray = True
        check_loopback_node(ray)  # on failure __init__ closes the group: Ray shuts down

    def _start_actors(
        self,
        factory: Callable[..., Any],
        kwargs: dict[str, Any],
        num_cpus: float,
        num_gpus: float,
        env: dict[str, str],
        timeout: float,
    ) -> None:
        ray = self._ray
        process_env = {"OMP_NUM_THREADS": str(max(1, int(num_cpus)))}
        if os.environ.get("TORCH_EXTENSIONS_DIR"):
            process_env["TORCH_EXTENSIONS_DIR"] = os.environ["TORCH_EXTENSIONS_DIR"]
        process_env.update(env)
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        host = ray.remote(_RankHost)
        self._reserve_nodes(num_cpus, num_gpus, timeout)
        self._actors = [
            host.options(
                num_cpus=num_cpus,
                num_gpus=num_gpus,
                runtime_env={"env_vars": process_env},
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    placement_group=self._placement_group,
                    placement_group_bundle_index=rank // self.ranks_per_node,
                ),
            ).remote(rank, self.world_size, factory, kwargs, timeout)
            for rank in range(self.world_size)
        ]
        try:
            placements = ray.get([a.placement.remote() for a in self._actors], timeout=timeout)
        except ray.exceptions.GetTimeoutError:
            raise RuntimeError(
                f"the {self.world_size} rank actors did not all start within {timeout:.0f} s; "
                f"the Ray cluster needs {num_cpus} CPU(s) and {num_gpus} GPU(s) free per rank "
                f"(cluster resources now: {ray.available_resources()})"
            ) from None
        envs = rank_environment(
            [ip for ip, _ in placements], placements[0][1], gpu_per_rank=num_gpus > 0
        )
        self._gather([a.build.remote(e) for a, e in zip(self._actors, envs)], "build")

    def _reserve_nodes(self, num_cpus: float, num_gpus: float, timeout: float) -> None:
        """``self._placement_group``, ready: STRICT_SPREAD, bundle k holding the resources of
        node k's ranks (module docstring)."""
        from ray.util.placement_group import placement_group

        rank = {"CPU": num_cpus, **({"GPU": num_gpus} if num_gpus else {})}
        node = {name: amount * self.ranks_per_node for name, amount in rank.items()}
        nodes = self.world_size // self.ranks_per_node
        group = placement_group([dict(node) for _ in range(nodes)], strategy="STRICT_SPREAD")
        self._placement_group = group  # close() removes it if it never becomes ready
        try:
            self._ray.get(group.ready(), timeout=timeout)
        except self._ray.exceptions.GetTimeoutError:
            alive = sum(1 for n in self._ray.nodes() if n.get("Alive"))
            raise RuntimeError(
                f"no {nodes} distinct Ray node(s) with {node} free each (the {self.world_size} "
                f"ranks, {self.ranks_per_node} per node, one STRICT_SPREAD placement group) came "
                f"up within {timeout:.0f} s; the cluster has {alive} alive node(s), resources "
                f"free now: {self._ray.available_resources()}"
            ) from None

    def call(
        self,
        method: str,
        batch: DataProto,
        *,
        allow_padding: bool = True,
        ranks_per_chunk: int = 1,
        **kwargs: Any,
    ) -> DataProto:
        """Split ``batch`` over the ranks, run ``worker.method(chunk, **kwargs)`` on every rank
        at once, join the outputs (padding cut, metrics combined). ``ranks_per_chunk`` k: ranks
        k·j … k·j + k − 1 get chunk j together and return one result (``dispatch``); each chunk
        is put in Ray's object store once, however many ranks read it."""
        actors = self._live_actors()
        chunks, pad_size = split_for_ranks(
            batch, self.world_size, allow_padding=allow_padding, ranks_per_chunk=ranks_per_chunk
        )
        stored = {id(chunk): self._ray.put(chunk) for chunk in chunks}
        refs = [a.call.remote(method, stored[id(c)], kwargs) for a, c in zip(actors, chunks)]
        outputs = self._gather(refs, method)
        return collect_from_ranks(outputs, pad_size, ranks_per_chunk=ranks_per_chunk)

    def call_all(self, method: str, **kwargs: Any) -> list[Any]:
        """Run ``worker.method(**kwargs)`` on every rank; the results in rank order."""
        refs = [a.call_all.remote(method, kwargs) for a in self._live_actors()]
        return self._gather(refs, method)

    def close(self) -> None:
        """Kill the rank actors, remove their placement group; shut Ray down if this group
        started it. Safe to call twice."""
        actors, self._actors = self._actors, []
        group, self._placement_group = self._placement_group, None
        if not self._ray.is_initialized():  # someone shut Ray down already: the actors are gone
            self._owns_ray = False
            return
        for actor in actors:
            self._ray.kill(actor)
        if group is not None:
            from ray.util.placement_group import remove_placement_group

            remove_placement_group(group)
        if self._owns_ray:
            self._owns_ray = False
            self._ray.shutdown()

    def _live_actors(self) -> list[Any]:
        if not self._actors:
            raise RuntimeError("this worker group is closed; build a new one")
        return self._actors

    def _gather(self, refs: list[Any], method: str) -> list[Any]:
        """ray.get of one result per rank. When a rank fails, the others get
        ``failure_grace_s`` to finish; if they do not (blocked in a collective the failed rank
        never joined), the group is closed and the error says so."""
        ray = self._ray
        pending = list(refs)
        while pending:
            ready, pending = ray.wait(pending, num_returns=1)
            try:
                ray.get(ready[0])
            except Exception as error:
                rank = refs.index(ready[0])
                _, stuck = ray.wait(pending, num_returns=len(pending), timeout=self.failure_grace_s)
                if stuck:
                    self.close()
                    raise RuntimeError(
                        f"rank {rank} failed in {method!r} and ranks "
                        f"{sorted(refs.index(r) for r in stuck)} did not finish within "
                        f"{self.failure_grace_s:.0f} s (probably blocked in a collective); the "
                        "worker group is closed, build a new one"
                    ) from error
                raise
        return ray.get(refs)

    def __enter__(self) -> RayWorkerGroup:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
