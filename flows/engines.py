"""The run's engine registry: models loaded once, resident across steps, and their weight lineage.

:func:`build_engines` builds, for ``StageContext.engines``:

- ``actor`` (always): ``ActorWorker`` — rollouts, old log-probs, the PPO update;
- ``ref`` when ``derived.use_reference_policy``: ``RefWorker``; with ``derived.reference_in_actor``
  (LoRA adapters on the actor that switch off to its base) no reference model is built and
  ``ref`` is the actor's own handle, whose ``compute_ref_log_prob`` runs its module with the
  adapters off (:func:`reference_handle`);
- ``critic`` when ``derived.use_critic``: ``CriticWorker``;
- the reward engines (``reward_loop`` and/or ``reward_model``, ``stages.reward.stage``);
- ``agent`` when the run may use tools: the tool sandbox and what the agent loop needs
  (``stages.agent.rollout.AgentRuntime``).

Where a model role runs follows ``ppoflow.workers.backend``, a ``WORKER_BACKENDS`` entry whose
spec says whether its ranks run in the driver process (``ranks_in_driver``) and how many it can
run (:func:`check_backend`):

- ``local``: :class:`InProcessRole`, the worker in this process (world size 1, so
  ``trainer.n_gpus_per_node × trainer.nnodes`` must be 1), with the worker-group call signature
  (``call(method, batch, **kwargs) -> DataProto``, ``stages.engines.worker_group.WorkerGroup``).
  With ``actor_rollout_ref.rollout.name: vllm`` the actor generates on a vLLM engine it builds
  at its first rollout and sends its weights after each update (``ActorWorker.vllm_rollout``);
- ``ray``: a ``RayWorkerGroup`` per role group (:func:`role_groups`), ``derived.dp_size`` ranks,
  each a Ray actor; all ranks of a group in one ``torch.distributed`` group. With
  ``ppoflow.workers.colocate`` (the default, as verl does) there is one group whose every rank
  holds the actor, the reference and the critic the config uses (:func:`build_rank_workers`,
  ``stages.engines.colocated``): N devices for GRPO with a KL loss, not 2N; otherwise a group per
  role (:func:`build_rank_worker`), each on devices of its own. One GPU per rank when this
  process sees CUDA, else none (gloo); ``ppoflow.workers.num_cpus_per_rank`` CPUs per rank;
  each node's ranks in one bundle (``trainer.n_gpus_per_node`` ranks) of the group's
  STRICT_SPREAD placement group: the bundles land on distinct nodes.
  With ``rollout.name: vllm`` every actor rank builds its own vLLM engine in its process, in
  the rank's torch.distributed world, and syncs it from its own DeepSpeed engine: every device
  generates and trains (verl's hybrid engine). With ``rollout.tensor_model_parallel_size`` t > 1
  one engine spans t consecutive actor ranks instead (vLLM's ``external_launcher``), and the
  actor's rollout methods (``ROLLOUT_METHODS``) are dispatched to each engine's t ranks together
  (:class:`~stages.engines.worker_group.SpanningEngineMethods`);
  ``call`` splits a batch over the ranks (rows padded to a multiple of the rank count and
  flagged ``is_pad``) and joins the outputs and metrics; ``call_all`` runs a method (checkpoint
  save / load) on every rank.

Ray is started by the first role group when it is not running yet (``RAY_ADDRESS`` set: that
cluster is joined instead), with CPUs for every role of the config, and is shut down when that
group is closed — so engines built here, one by one or all at once, are released with
:func:`close_engines`. :func:`close_engines` releases everything (the reward worker pool included).

Weight lineage (:class:`WeightsLineage`): the cache key of a weight-reading stage needs a
fingerprint of the weights it reads. Hashing the parameters every step would cost a pass over
the model, so the fingerprint is a lineage instead: a role starts from a hash of its model
directory's content digest (BLAKE3 of its files, ``flows.cache.user_files``), and each update stage
moves it to sha256(previous | the update's cache key); in training an update always runs. Equal lineages mean the same
initial model and the same sequence of updates on the same inputs.
"""

from __future__ import annotations

import hashlib
import math
import os
import random
from collections.abc import Iterable
from typing import Any

import numpy as np
import torch

from dataproto import DataProto
from flows.cache.user_files import path_digest
from stages.agent.rollout import build_agent_engines, close_agent_engines, may_use_tools
from stages.engines.adapters import adapter_settings
from stages.engines.colocated import ColocatedRoles, ColocatedWorker
from stages.engines.dispatch import check_ranks_per_chunk
from stages.engines.rollout_backends import ROLLOUT_BACKENDS, ROLLOUT_METHODS
from stages.engines.worker_group import WORKER_BACKENDS, SpanningEngineMethods, check_method
from stages.plugins import import_plugins, plugin_roots
from stages.reward.settings import settings_from_config
from stages.reward.stage import build_reward_engines, close_reward_engines
from stages.stage import Stage

MODEL_ROLES = ("actor", "ref", "critic")
ARR = "actor_rollout_ref"


class InProcessRole:
    """One role's worker in this process (world size 1), called like a worker group."""

    world_size = 1

    def __init__(self, worker: Any) -> None:
        self.worker = worker

    def call(
        self, method: str, batch: DataProto, *, ranks_per_chunk: int = 1, **kwargs: Any
    ) -> DataProto:
        """``worker.method(batch, **kwargs)``; the DataProto it returns (metrics in meta_info).
        One rank: ``ranks_per_chunk`` can only be 1."""
        check_ranks_per_chunk(ranks_per_chunk, self.world_size)
        return self._method(method)(batch, **kwargs)

    def call_all(self, method: str, **kwargs: Any) -> list[Any]:
        """``worker.method(**kwargs)`` on the one rank; a one-element list like a group's."""
        return [self._method(method)(**kwargs)]

    def close(self) -> None:
        """Release the worker: its own ``close()`` first when it has one (the actor's vLLM
        engine), then the reference (the DeepSpeed engine goes with it)."""
        worker, self.worker = self.worker, None
        close = getattr(worker, "close", None)
        if callable(close):
            close()

    def _method(self, method: str):
        if self.worker is None:
            raise RuntimeError("this engine role is closed; the run's engines were released")
        return check_method(self.worker, method)


def check_backend(config: Any) -> None:
    """Fail before any engine is built on a backend, world size or rollout parallelism this
    module cannot run: the worker backend's entry says how many ranks it runs and what it needs
    installed, the rollout backend's whether a tensor-parallel engine runs."""
    name, dp_size = config.ppoflow.workers.backend, config.derived.dp_size
    backend = WORKER_BACKENDS.get(name)
    if backend.max_world_size is not None and dp_size > backend.max_world_size:
        raise ValueError(
            f"the {name} backend runs at most {backend.max_world_size} rank(s), but "
            f"trainer.n_gpus_per_node × trainer.nnodes = {dp_size}; set "
            f"ppoflow.workers.backend={_unlimited_backends()} for {dp_size} ranks, or set both "
            "to 1"
        )
    rollout = config.actor_rollout_ref.rollout
    tp = rollout.tensor_model_parallel_size
    if tp > 1 and not ROLLOUT_BACKENDS.get(rollout.name).runs_tensor_parallel:
        raise NotImplementedError(
            f"actor_rollout_ref.rollout.tensor_model_parallel_size={tp}: the {rollout.name} "
            "rollout backend does not run an engine spanning ranks; set it to 1"
        )
    backend.check_available()


def _unlimited_backends() -> str:
    return "/".join(n for n in WORKER_BACKENDS if WORKER_BACKENDS.get(n).max_world_size is None)


def roles_for(config: Any) -> list[str]:
    """The model roles the config needs: actor always, ref and critic when in use (ref not when
    the reference is the actor's base, ``derived.reference_in_actor``)."""
    roles = ["actor"]
    if config.derived.use_reference_policy and not config.derived.reference_in_actor:
        roles.append("ref")
    if config.derived.use_critic:
        roles.append("critic")
    return roles


def new_worker(role: str, config: Any, total_training_steps: int) -> Any:
    """A fresh ``ActorWorker`` / ``RefWorker`` / ``CriticWorker`` in this process."""
    from stages.engines.roles import ActorWorker, CriticWorker, RefWorker

    if role == "actor":
        return ActorWorker(config, total_training_steps=total_training_steps)
    if role == "ref":
        return RefWorker(config)
    if role == "critic":
        return CriticWorker(config, total_training_steps=total_training_steps)
    raise KeyError(f"unknown model role {role!r}; expected one of {MODEL_ROLES}")


def build_rank_worker(
    role: str, config: Any, total_training_steps: int, workdir: str | None = None
) -> Any:
    """The ``role`` worker of one Ray rank, built in the rank's process
    (:func:`build_rank_workers` with one role)."""
    return build_rank_workers([role], config, total_training_steps, workdir).workers[role]


def build_rank_workers(
    roles: list[str], config: Any, total_training_steps: int, workdir: str | None = None
) -> ColocatedWorker:
    """The ``roles`` workers of one Ray rank, built in the rank's process, in order.

    ``workdir``: the driver's working directory, entered first when it exists here, so relative
    paths in the config (model, checkpoints) mean what they mean to the driver. The RNGs are
    seeded with ``trainer.seed`` before each model is built (a freshly initialised head, e.g. the
    critic's value head, is then the same on every rank, colocated or not) and with
    ``trainer.seed + rank`` after the last (each rank samples its own rollouts); ``RANK`` is set
    by the worker group. The ``ppoflow.plugins`` modules are imported first: the rank is a
    process of its own, and its losses, KL estimators and rollout backend are looked up in the
    registries they extend.
    """
    if workdir is not None and os.path.isdir(workdir):
        os.chdir(workdir)
    import_plugins(config.ppoflow.plugins)
    seed = config.trainer.seed
    workers = {}
    for role in roles:
        seed_everything(seed)
        workers[role] = new_worker(role, config, total_training_steps)
    seed_everything(seed + int(os.environ.get("RANK", "0")))
    return ColocatedWorker(workers)


def seed_everything(seed: int) -> None:
    """Seed Python's, numpy's and torch's global RNGs."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def build_role(config: Any, role: str, total_training_steps: int) -> Any:
    """One model role (``actor`` / ``ref`` / ``critic``) as a worker group on the configured
    backend (module docstring); release it with :func:`close_engines`."""
    return build_roles(config, [role], total_training_steps)[role]


def build_roles(config: Any, roles: list[str], total_training_steps: int) -> dict[str, Any]:
    """``roles`` as worker groups sharing one set of ranks: role → its group. In the driver
    (``local``) each role is an :class:`InProcessRole`; on other backends one role is a group
    of its own and several are one group whose ranks each hold all of them
    (``stages.engines.colocated``); release them with :func:`close_engines`."""
    check_backend(config)
    unknown = [role for role in roles if role not in MODEL_ROLES]
    if unknown:
        raise KeyError(f"unknown model role {unknown[0]!r}; expected one of {MODEL_ROLES}")
    if WORKER_BACKENDS.get(config.ppoflow.workers.backend).ranks_in_driver:
        return {
            role: InProcessRole(new_worker(role, config, total_training_steps)) for role in roles
        }
    group = _rank_group(config, roles, total_training_steps)
    if len(roles) == 1:
        handles = {roles[0]: group}
    else:
        shared = ColocatedRoles(group, roles)
        handles = {role: shared.role(role) for role in roles}
    tp = config.actor_rollout_ref.rollout.tensor_model_parallel_size
    if "actor" in handles and tp > 1:  # each rollout engine spans tp ranks
        handles["actor"] = SpanningEngineMethods(
            handles["actor"], dict.fromkeys(ROLLOUT_METHODS, tp)
        )
    return handles


def _rank_group(config: Any, roles: list[str], total_training_steps: int) -> Any:
    """``derived.dp_size`` ranks holding ``roles``, each rank in its own process, from the worker
    backend's ``make_group`` (Ray: starts Ray, owned by this group, if needed); a one-role group
    calls the role's worker directly, a several-role one its :class:`ColocatedWorker`."""
    backend = WORKER_BACKENDS.get(config.ppoflow.workers.backend)
    dp_size = config.derived.dp_size
    gpus_per_rank = 1 if torch.cuda.is_available() else 0
    check_gpu_count(config)
    return backend.make_group(
        build_rank_worker if len(roles) == 1 else build_rank_workers,
        dp_size,
        num_cpus_per_rank=config.ppoflow.workers.num_cpus_per_rank,
        num_gpus_per_rank=gpus_per_rank,
        ranks_per_node=config.trainer.n_gpus_per_node,
        ray_init=ray_init_options(config, gpus_per_rank),
        connect_timeout_s=config.ppoflow.workers.connect_timeout_s,
        **({"role": roles[0]} if len(roles) == 1 else {"roles": list(roles)}),
        config=config,
        total_training_steps=total_training_steps,
        workdir=os.getcwd(),
        **_plugin_env(config),
    )


def _plugin_env(config: Any) -> dict[str, Any]:
    """``env`` for ranks in other processes: the directories the driver found the
    ``ppoflow.plugins`` modules under, ahead of the driver's PYTHONPATH (none without plugins)."""
    if not config.ppoflow.plugins:
        return {}
    paths = [*plugin_roots(config.ppoflow.plugins), os.environ.get("PYTHONPATH", "")]
    return {"env": {"PYTHONPATH": os.pathsep.join(p for p in paths if p)}}


def role_groups(config: Any) -> list[list[str]]:
    """The model roles of the config grouped by the ranks that hold them: one group of every
    role with ``ppoflow.workers.colocate`` (each rank's process holds its actor, reference and
    critic, on one device), else a group per role (each role's ranks on devices of their own).

    Example:
        >>> from stages.config import load_config
        >>> kl = ["actor_rollout_ref.actor.use_kl_loss=true"]
        >>> role_groups(load_config("demo-cpu", kl))
        [['actor', 'ref']]
        >>> role_groups(load_config("demo-cpu", kl + ["ppoflow.workers.backend=ray", "ppoflow.workers.colocate=false"]))
        [['actor'], ['ref']]
    """
    roles = roles_for(config)
    return [roles] if config.ppoflow.workers.colocate else [[role] for role in roles]


def check_gpu_count(config: Any) -> None:
    """On a local Ray instance with CUDA, each rank of each role group takes a GPU of its own
    (:func:`role_groups`): fail before Ray waits for GPUs this machine lacks."""
    if not torch.cuda.is_available() or os.environ.get("RAY_ADDRESS"):
        return
    groups = role_groups(config)
    needed, have = len(groups) * config.derived.dp_size, torch.cuda.device_count()
    if needed > have:
        raise ValueError(
            f"the ray backend gives each of the {config.derived.dp_size} ranks of each role "
            f"group ({' | '.join('+'.join(g) for g in groups)}) a GPU of its own: {needed} "
            f"GPUs, but this machine has {have}; set ppoflow.workers.colocate=true (every role "
            "of a rank on one GPU), lower trainer.n_gpus_per_node, or drop a role (the reference "
            "policy runs only with actor.use_kl_loss or algorithm.use_kl_in_reward)"
        )


def ray_init_options(config: Any, gpus_per_rank: int) -> dict[str, Any]:
    """``ray.init`` arguments for a local Ray instance that fits every role group of the config
    (the group that starts Ray would otherwise size it for its own ranks only); none when
    ``RAY_ADDRESS`` names a cluster to join (it has its own resources)."""
    if os.environ.get("RAY_ADDRESS"):
        return {}
    ranks = len(role_groups(config)) * config.derived.dp_size
    cpus = config.ppoflow.workers.num_cpus_per_rank
    options: dict[str, Any] = {"num_cpus": max(1, math.ceil(ranks * cpus))}
    if gpus_per_rank:
        options["num_gpus"] = ranks * gpus_per_rank  # each group's ranks hold GPUs of their own
    return options


def build_reward(config: Any, tokenizer: Any) -> dict[str, Any]:
    """The reward engines (``reward_loop`` scorer pool and/or ``reward_model``)."""
    return build_reward_engines(settings_from_config(config), tokenizer)


def build_engines(
    config: Any, tokenizer: Any, total_training_steps: int, startup: Any = None
) -> dict[str, Any]:
    """Every engine the config needs, keyed for ``StageContext.engines`` (module docstring);
    each one an ``engines`` phase of ``startup`` (flows/process/startup.py; default: only logged)."""
    from flows.process.startup import current_startup

    startup = startup or current_startup()
    check_backend(config)
    check_adapters(config)
    if not WORKER_BACKENDS.get(config.ppoflow.workers.backend).ranks_in_driver:
        check_gpu_count(config)
    engines: dict[str, Any] = {}
    try:
        # the scorer processes start first, before any model or process group exists here
        with startup.phase("engines", "reward: starting the scorers") as shown:
            rewards = build_reward(config, tokenizer)
            engines.update(rewards)
            shown["text"] = "reward: " + (", ".join(rewards) or "none")
        if may_use_tools(config):
            with startup.phase("engines", "tools: starting the tool sandbox"):
                engines.update(build_agent_engines(config, tokenizer))
        for roles in _build_order(config):
            text = "; ".join(f"{role}: {describe_role(config, role)}" for role in roles)
            with startup.phase("engines", text):
                engines.update(build_roles(config, roles, total_training_steps))
        engines.update(reference_handle(config, engines))
    except BaseException:
        close_engines(engines)
        raise
    return engines


def reference_handle(config: Any, engines: Any) -> dict[str, Any]:
    """``{"ref": the actor's handle}`` when the run uses a reference policy that is the actor's
    base (``derived.reference_in_actor``: ``compute_ref_log_prob`` on the actor runs its module
    with its LoRA adapters off); else nothing (the ref role is a model of its own, or unused)."""
    derived = config.derived
    if derived.use_reference_policy and derived.reference_in_actor:
        return {"ref": engines["actor"]}
    return {}


def check_adapters(config: Any) -> None:
    """Before any weight is read: each role's LoRA targets match modules of its model (the
    adapters put on a model built from its config.json on the meta device), and an adapter
    directory to start from is a LoRA adapter of the configured rank, trained on the role's
    base model (``stages.engines.adapters``); one line naming the key otherwise."""
    from transformers import AutoConfig

    from stages.engines.adapters import adapter_settings, check_adapter_dir, check_targets_on_meta
    from stages.engines.models import check_model_path

    model, critic = config.actor_rollout_ref.model, config.critic.model
    roles = [(model, "actor_rollout_ref.model", "CAUSAL_LM")]
    if config.derived.use_critic:
        roles.append((critic, "critic.model", "TOKEN_CLS"))
    for model_cfg, prefix, task_type in roles:
        settings = adapter_settings(model_cfg, prefix)
        if settings is None:
            continue
        if settings.adapter_path:
            check_adapter_dir(settings, model_cfg.path)
            continue
        check_model_path(model_cfg.path)
        hf_config = AutoConfig.from_pretrained(
            model_cfg.path, trust_remote_code=model_cfg.trust_remote_code
        )
        if task_type == "TOKEN_CLS":
            hf_config.num_labels = 1
        check_targets_on_meta(settings, hf_config, task_type)


def _build_order(config: Any) -> list[list[str]]:
    """The role groups to build, one :func:`build_roles` call each: one per role in the driver
    (each its own start-up phase), else :func:`role_groups`."""
    if WORKER_BACKENDS.get(config.ppoflow.workers.backend).ranks_in_driver:
        return [[role] for role in roles_for(config)]
    return role_groups(config)


def describe_role(config: Any, role: str) -> str:
    """``DeepSpeed ZeRO-1, 2 ranks (ray), rollout vllm``: the engine a role runs on."""
    arr = config.actor_rollout_ref
    settings = {"actor": arr.actor, "ref": arr.ref, "critic": config.critic}[role]
    ranks = config.derived.dp_size
    where = config.ppoflow.workers.backend
    text = f"DeepSpeed ZeRO-{settings.zero_stage}, {ranks} rank{'s' * (ranks != 1)} ({where})"
    model_cfg, prefix = (
        (config.critic.model, "critic.model") if role == "critic" else (arr.model, f"{ARR}.model")
    )
    adapter = adapter_settings(model_cfg, prefix) if role != "ref" else None
    if adapter is not None:
        text += f", {adapter.variant} rank {adapter.rank or 'of ' + str(adapter.adapter_path)}"
        if role == "actor" and config.derived.use_reference_policy:
            text += " (reference: adapters off)"
    return text + (f", rollout {arr.rollout.name}" if role == "actor" else "")


def close_engines(engines: dict[str, Any]) -> None:
    """Release every engine (model roles and the reward worker pool); safe to call twice.

    On the ray backend the group that started Ray shuts it down when it closes, after which the
    other groups' actors are gone with it: every role is closed here, in any order."""
    close_reward_engines(engines)
    close_agent_engines(engines)
    closed: set[int] = set()  # ref may be the actor's own handle (reference_handle)
    try:
        for role in MODEL_ROLES:
            if role in engines and id(engines[role]) not in closed:
                closed.add(id(engines[role]))
                engines[role].close()
    finally:
        engines.clear()


def model_fingerprint(path: str | os.PathLike, role: str, dtype: str | None = None) -> str:
    """sha256 of the role, the compute dtype and the content digest of the model directory
    (``flows.cache.user_files.path_digest``): the same files anywhere give the same lineage root, an
    edited file or another dtype gives another."""
    digest = path_digest(path)
    text = f"ppoflow-weights-v2\n{role}\n{digest}\n{dtype}\n"
    return hashlib.sha256(text.encode()).hexdigest()


def with_adapter(root: str, model_cfg: Any, prefix: str) -> str:
    """A role's lineage root moved by its LoRA adapters: sha256(root | their settings and the
    content digest of the adapter directory they start from); ``root`` itself without."""
    from stages.engines.adapters import adapter_settings, lineage_text

    settings = adapter_settings(model_cfg, prefix)
    if settings is None:
        return root
    text = f"{root}\nadapter {lineage_text(settings, path_digest(settings.adapter_path))}"
    return hashlib.sha256(text.encode()).hexdigest()


class WeightsLineage:
    """role → weights fingerprint (module docstring); ``fingerprint(stage)`` feeds the step flow."""

    def __init__(self, roots: dict[str, str]) -> None:
        self.current = dict(roots)

    @classmethod
    def from_config(cls, config: Any) -> WeightsLineage:
        """The roots: each role's model directory, and for a role with LoRA adapters their
        settings and the adapter directory they start from (``with_adapter``). The reference is
        the base model with or without adapters on the actor (verl: the base, not the adapter
        it starts from)."""
        model, critic = config.actor_rollout_ref.model, config.critic.model
        critic_dtype = critic.dtype or model.dtype
        return cls(
            {
                "actor": with_adapter(
                    model_fingerprint(model.path, "actor", model.dtype),
                    model,
                    "actor_rollout_ref.model",
                ),
                "ref": model_fingerprint(model.path, "ref", model.dtype),
                "critic": with_adapter(
                    model_fingerprint(critic.path, "critic", critic_dtype), critic, "critic.model"
                ),
            }
        )

    def fingerprint(self, stage: Stage) -> str:
        if stage.engine not in self.current:
            raise KeyError(
                f"stage {stage.name!r} reads weights of engine {stage.engine!r}, which has no "
                f"lineage (known: {sorted(self.current)}); declare Stage.engine"
            )
        return self.current[stage.engine]

    def advance(self, stages: Iterable[Stage], records: Iterable[Any]) -> None:
        """Move each role written by a stage that ran or was cached this step."""
        by_name = {stage.name: stage for stage in stages}
        for record in records:
            stage = by_name.get(record.stage)
            if stage is None or not stage.writes_weights or record.status == "skipped":
                continue
            text = f"{self.current[stage.engine]}\n{record.cache_key}"
            self.current[stage.engine] = hashlib.sha256(text.encode()).hexdigest()

    def state_dict(self) -> dict[str, str]:
        return dict(self.current)
