"""Where a config's engines run: processes × roles × devices, as ``ppoflow config show --layout``
prints it (docs/scaling.md).

The layout follows from the config alone — ``trainer.nnodes × trainer.n_gpus_per_node`` ranks,
``trainer.device``, ``ppoflow.workers.backend`` and ``colocate``, the roles the algorithm needs —
by the same functions the engine builder uses (``flows.engines.role_groups``), so what is printed
is what a run starts. On CUDA each rank process of a role group holds one device: a node's ranks
of group ``g`` take the node's GPUs ``g × n_gpus_per_node + local rank`` (each rank sees its
one GPU as ``cuda:0``); Ray places them with one STRICT_SPREAD placement group per group, a bundle per node.
With ``rollout.name: vllm`` each actor rank's process holds its vLLM engine too, or at tensor
parallelism t > 1 its shard of the engine that t consecutive actor ranks share.

Example:
    >>> from stages.config import load_config
    >>> print("\\n".join(layout_lines(load_config("demo-cpu", ["actor_rollout_ref.actor.use_kl_loss=true"]))))
    1 rank (1 node × 1), backend local: every role in the driver process
      driver process  cpu  actor (DeepSpeed ZeRO-0, rollout hf) + ref (ZeRO-0)
"""

from __future__ import annotations

from typing import Any

from flows.engines import role_groups, roles_for
from stages.engines.dispatch import chunk_index
from stages.engines.worker_group import WORKER_BACKENDS


def role_text(config: Any, role: str, rank: int | None = None) -> str:
    """``actor (DeepSpeed ZeRO-3, rollout vllm TP 2)``, ``ref (ZeRO-3, parameters on the host)``;
    with the ``rank`` of a rank process and tensor parallelism t > 1, the actor's part names
    the engine the rank holds a shard of: ``rollout vllm engine 1 shard 2/2`` (engine
    ``rank // t``, the ranks ``t·j … t·j + t − 1``)."""
    arr = config.actor_rollout_ref
    settings = {"actor": arr.actor, "ref": arr.ref, "critic": config.critic}[role]
    parts = [f"{'DeepSpeed ' if role == 'actor' else ''}ZeRO-{settings.zero_stage}"]
    if getattr(settings, "param_offload", False):
        parts.append("parameters on the host")
    if role == "actor":
        tp = arr.rollout.tensor_model_parallel_size
        if tp > 1 and rank is not None:
            where = f" engine {chunk_index(rank, tp)} shard {rank % tp + 1}/{tp}"
        else:
            where = f" TP {tp}" if tp > 1 else ""
        parts.append(f"rollout {arr.rollout.name}{where}")
    return f"{role} ({', '.join(parts)})"


def layout_lines(config: Any) -> list[str]:
    """The layout, one line per process after a summary line."""
    backend = config.ppoflow.workers.backend
    nodes, per_node = config.trainer.nnodes, config.trainer.n_gpus_per_node
    ranks = config.derived.dp_size
    head = f"{ranks} rank{'s' * (ranks != 1)} ({nodes} node{'s' * (nodes != 1)} × {per_node}), backend {backend}"
    if WORKER_BACKENDS.get(backend).ranks_in_driver:
        roles = " + ".join(role_text(config, role) for role in roles_for(config))
        return [
            f"{head}: every role in the driver process",
            f"  driver process  {config.trainer.device}  {roles}",
        ]
    groups = role_groups(config)
    on_cuda = config.trainer.device == "cuda"
    devices = len(groups) * per_node
    how = (
        "colocated: every role of a rank in one process"
        if len(groups) == 1 and len(groups[0]) > 1
        else ("a process per role and rank" if len(groups) > 1 else "one role")
    )
    tp = config.actor_rollout_ref.rollout.tensor_model_parallel_size
    engines = (
        f"; {ranks // tp} {config.actor_rollout_ref.rollout.name} engines, each spanning {tp} "
        "actor ranks (external_launcher)"
        if tp > 1
        else ""
    )
    lines = [
        f"{head}; {how}; {len(groups) * ranks} rank processes"
        + (f", {devices} GPUs per node ({devices * nodes} in all)" if on_cuda else " on CPU")
        + "; each node's ranks of a group in one bundle of a STRICT_SPREAD placement group"
        + engines
    ]
    for node in range(nodes):
        for g, roles in enumerate(groups):
            for local in range(per_node):
                device = f"GPU {g * per_node + local}" if on_cuda else "cpu"
                rank = node * per_node + local
                text = " + ".join(role_text(config, role, rank) for role in roles)
                lines.append(f"  node {node}  rank {rank:<3} {device:<8} {text}")
    return lines
