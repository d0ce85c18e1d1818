"""The run's engine registry: models loaded once, resident across steps, and their weight lineage.

:func:`build_engines` builds, for ``StageContext.engines``:

- ``actor`` (always): ``ActorWorker`` — rollouts, old log-probs, the PPO update;
- ``ref`` when ``derived.use_reference_policy``: ``RefWorker``;
- ``critic`` when ``derived.use_critic``: ``CriticWorker``;
- the reward engines (``reward_loop`` and/or ``reward_model``, ``stages.reward.stage``).

Each model role is wrapped in :class:`InProcessRole`, world size 1 in this process, with the
worker-group call signature (``call(method, batch, **kwargs) -> DataProto``,
``stages.engines.worker_group.WorkerGroup``), so a Ray worker group can replace it without
touching a stage. :func:`close_engines` releases everything (the reward worker pool included).

Weight lineage (:class:`WeightsLineage`): the cache key of a weight-reading stage needs a
fingerprint of the weights it reads. Hashing the parameters every step would cost a pass over
the model, so the fingerprint is a lineage instead: a role starts from a hash of its model
directory's file listing (name, size, mtime), and each update stage that ran or was taken from
the cache moves it to sha256(previous | the update's cache key). Equal lineages mean the same
initial model and the same sequence of updates on the same inputs.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from dataproto import DataProto
from stages.engines.worker_group import check_method
from stages.reward.settings import settings_from_config
from stages.reward.stage import build_reward_engines, close_reward_engines
from stages.stage import Stage

MODEL_ROLES = ("actor", "ref", "critic")


class InProcessRole:
    """One role's worker in this process (world size 1), called like a worker group."""

    world_size = 1

    def __init__(self, worker: Any) -> None:
        self.worker = worker

    def call(self, method: str, batch: DataProto, **kwargs: Any) -> DataProto:
        """``worker.method(batch, **kwargs)``; the DataProto it returns (metrics in meta_info)."""
        return self._method(method)(batch, **kwargs)

    def call_all(self, method: str, **kwargs: Any) -> list[Any]:
        """``worker.method(**kwargs)`` on the one rank; a one-element list like a group's."""
        return [self._method(method)(**kwargs)]

    def close(self) -> None:
        self.worker = None

    def _method(self, method: str):
        if self.worker is None:
            raise RuntimeError("this engine role is closed; the run's engines were released")
        return check_method(self.worker, method)


def check_backend(config: Any) -> None:
    """Fail before any engine is built on a backend or world size this module cannot run."""
    if config.ppoflow.workers.backend != "local":
        raise NotImplementedError(
            f"ppoflow.workers.backend={config.ppoflow.workers.backend!r}: the train flow runs "
            "the local (in-process, one rank) backend only so far; set it to 'local'"
        )
    if config.derived.dp_size != 1:
        raise ValueError(
            f"the local backend runs one rank in this process, but trainer.n_gpus_per_node × "
            f"trainer.nnodes = {config.derived.dp_size}; set both to 1"
        )


def roles_for(config: Any) -> list[str]:
    """The model roles the config needs: actor always, ref and critic when in use."""
    roles = ["actor"]
    if config.derived.use_reference_policy:
        roles.append("ref")
    if config.derived.use_critic:
        roles.append("critic")
    return roles


def build_role(config: Any, role: str, total_training_steps: int) -> Any:
    """One model role (``actor`` / ``ref`` / ``critic``) as a worker-group-like engine."""
    from stages.engines.roles import ActorWorker, CriticWorker, RefWorker

    check_backend(config)
    if role == "actor":
        return InProcessRole(ActorWorker(config, total_training_steps=total_training_steps))
    if role == "ref":
        return InProcessRole(RefWorker(config))
    if role == "critic":
        return InProcessRole(CriticWorker(config, total_training_steps=total_training_steps))
    raise KeyError(f"unknown model role {role!r}; expected one of {MODEL_ROLES}")


def build_reward(config: Any, tokenizer: Any) -> dict[str, Any]:
    """The reward engines (``reward_loop`` scorer pool and/or ``reward_model``)."""
    return build_reward_engines(settings_from_config(config), tokenizer)


def build_engines(config: Any, tokenizer: Any, total_training_steps: int) -> dict[str, Any]:
    """Every engine the config needs, keyed for ``StageContext.engines`` (module docstring)."""
    check_backend(config)
    engines: dict[str, Any] = {}
    try:
        # the scorer processes start first, before any model or process group exists here
        engines.update(build_reward(config, tokenizer))
        for role in roles_for(config):
            engines[role] = build_role(config, role, total_training_steps)
    except BaseException:
        close_engines(engines)
        raise
    return engines


def close_engines(engines: dict[str, Any]) -> None:
    """Release every engine (model roles and the reward worker pool); safe to call twice."""
    close_reward_engines(engines)
    for role in MODEL_ROLES:
        if role in engines:
            engines[role].close()
    engines.clear()


def model_fingerprint(path: str | os.PathLike, role: str) -> str:
    """sha256 of the role and the model directory's listing (relative name, size, mtime_ns)."""
    root = Path(path)
    digest = hashlib.sha256(f"ppoflow-weights-v1\n{role}\n{root.absolute()}\n".encode())
    files = sorted(p for p in root.rglob("*") if p.is_file()) if root.is_dir() else []
    for file in files:
        stat = file.stat()
        digest.update(f"{file.relative_to(root)}\t{stat.st_size}\t{stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()


class WeightsLineage:
    """role → weights fingerprint (module docstring); ``fingerprint(stage)`` feeds the step flow."""

    def __init__(self, roots: dict[str, str]) -> None:
        self.current = dict(roots)

    @classmethod
    def from_config(cls, config: Any) -> WeightsLineage:
        actor_path = config.actor_rollout_ref.model.path
        return cls(
            {
                "actor": model_fingerprint(actor_path, "actor"),
                "ref": model_fingerprint(actor_path, "ref"),
                "critic": model_fingerprint(config.critic.model.path, "critic"),
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
