"""verl's older spellings accepted as aliases of the 0.9.1 layout.

Older verl configs have top-level ``custom_reward_function`` and ``reward_model`` blocks; 0.9.1
moved them under ``reward``. A top-level block is moved there before validation (null values are
dropped, since verl's generated YAML lists every legacy key as null). Setting a key in both
places, or a legacy key ppoflow has no equivalent for, is an error.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# legacy top-level dotted key -> 0.9.1 dotted key
LEGACY_KEYS = {
    "custom_reward_function.path": "reward.custom_reward_function.path",
    "custom_reward_function.name": "reward.custom_reward_function.name",
    "reward_model.enable": "reward.reward_model.enable",
    "reward_model.model.path": "reward.reward_model.model_path",
    "reward_model.model.trust_remote_code": "reward.reward_model.trust_remote_code",
    "reward_model.micro_batch_size_per_gpu": "reward.reward_model.micro_batch_size_per_gpu",
    "reward_model.num_workers": "reward.num_workers",
}


#: ``trainer.worker_backend`` is an alias of ``ppoflow.workers.backend``; when given it wins
#: (it usually overrides the default written in the base config)
WORKER_BACKEND_ALIAS = ("trainer.worker_backend", "ppoflow.workers.backend")


def move_legacy_keys(data: Any) -> Any:
    """Return ``data`` with the legacy top-level reward blocks moved under ``reward``, and
    ``trainer.worker_backend`` moved to ``ppoflow.workers.backend``.

    >>> move_legacy_keys({"reward_model": {"enable": True, "model": {"path": "rm"}, "nnodes": None}})
    {'reward': {'reward_model': {'enable': True, 'model_path': 'rm'}}}
    >>> move_legacy_keys({"trainer": {"worker_backend": "ray", "nnodes": 1}})
    {'trainer': {'nnodes': 1}, 'ppoflow': {'workers': {'backend': 'ray'}}}
    """
    data = _move_worker_backend(data)
    if not isinstance(data, Mapping) or not (
        {"custom_reward_function", "reward_model"} & set(data)
    ):
        return data
    out = {k: v for k, v in data.items() if k not in ("custom_reward_function", "reward_model")}
    for old_key, value in _flatten(
        {k: data[k] for k in ("custom_reward_function", "reward_model") if k in data}
    ).items():
        if value is None:
            continue
        new_key = LEGACY_KEYS.get(old_key)
        if new_key is None:
            raise ValueError(
                f"{old_key}: legacy key with no ppoflow equivalent (got {value!r}); the 0.9.1 "
                f"layout keeps reward settings under reward.* (keys: {sorted(LEGACY_KEYS.values())})"
            )
        _set_new(out, new_key, value, old_key)
    return out


def _flatten(tree: Mapping, prefix: str = "") -> dict[str, Any]:
    """{'a': {'b': 1}} -> {'a.b': 1}; a non-mapping legacy block is kept under its own key."""
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        path = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            flat.update(_flatten(value, path + "."))
        elif not (isinstance(value, Mapping) and not value):
            flat[path] = value
    return flat


def _set_new(out: dict, new_key: str, value: Any, old_key: str) -> None:
    """Set ``new_key`` in ``out`` (copying nested dicts), refusing a different value already there."""
    *parents, leaf = new_key.split(".")
    node = out
    for part in parents:
        child = node.get(part)
        if child is not None and not isinstance(child, Mapping):
            raise ValueError(f"{part}: expected a mapping to hold {new_key}, got {child!r}")
        node[part] = dict(child or {})
        node = node[part]
    if leaf in node and node[leaf] != value:
        raise ValueError(
            f"{old_key} = {value!r} (legacy spelling) conflicts with {new_key} = {node[leaf]!r}; "
            f"set only {new_key}"
        )
    node[leaf] = value


def _move_worker_backend(data: Any) -> Any:
    trainer = data.get("trainer") if isinstance(data, Mapping) else None
    if not isinstance(trainer, Mapping) or "worker_backend" not in trainer:
        return data
    out = dict(data)
    out["trainer"] = {k: v for k, v in trainer.items() if k != "worker_backend"}
    ppoflow = dict(out.get("ppoflow") or {})
    ppoflow["workers"] = {**(ppoflow.get("workers") or {}), "backend": trainer["worker_backend"]}
    out["ppoflow"] = ppoflow  # the alias wins: it is usually an override of the default
    return out
