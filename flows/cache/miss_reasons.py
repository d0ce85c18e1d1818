"""Why a stage missed the cache: the key parts that differ from an earlier computation's.

A stage's journal record keeps the parts its cache key was hashed from
(``flows.cache.keys.stage_key_parts``). When the same stage of the same step was computed before
(an earlier training into the run directory, a re-run's parent), :func:`miss_reasons` compares
the two documents and names each difference in words a user can act on::

    stage code changed (stages/algos/advantages_group.py)
    custom reward file changed (reward.custom_reward_function.path)
    config actor_rollout_ref.actor.clip_ratio 0.2 → 0.3
    input non_tensor_batch.uid changed
    weights changed

Pure: the code manifests (file → sha256 behind a code fingerprint) come from ``code_files``,
a lookup the caller provides (``RunStore.code_manifest``).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

from flows.cache.code_fingerprint import changed_files

#: what the user calls the file a dotted config path names
FILE_NAMES = {
    "reward.custom_reward_function.path": "custom reward file",
    "actor_rollout_ref.model.tokenizer_path": "tokenizer",
    "reward.reward_model.model_path": "reward model",
}
#: at most this many names are listed in one reason
MAX_LISTED = 4

CodeLookup = Callable[[str], Mapping[str, str] | None]


def _listed(names: list[str]) -> str:
    shown = ", ".join(names[:MAX_LISTED])
    return shown + (f" and {len(names) - MAX_LISTED} more" if len(names) > MAX_LISTED else "")


def _value(value: Any) -> str:
    return json.dumps(value, sort_keys=True, ensure_ascii=False)


def code_reason(old: str, new: str, code_files: CodeLookup) -> str:
    """``stage code changed`` with the changed files when both manifests are known."""
    before, after = code_files(old), code_files(new)
    if before is None or after is None:
        return "stage code changed"
    changed = changed_files(before, after)
    return f"stage code changed ({_listed(changed)})" if changed else "stage code changed"


def config_reasons(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    """One ``config PATH old → new`` per differing config value.

    >>> config_reasons({"a.b": 0.2, "c": 1}, {"a.b": 0.3, "c": 1})
    ['config a.b 0.2 → 0.3']
    """
    reasons = []
    for path in sorted(set(old) | set(new)):
        if path not in old:
            reasons.append(f"config {path} now read ({_value(new[path])})")
        elif path not in new:
            reasons.append(f"config {path} no longer read")
        elif old[path] != new[path]:
            reasons.append(f"config {path} {_value(old[path])} → {_value(new[path])}")
    return reasons


def file_reasons(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    """One ``<file> changed (PATH)`` per user file whose content digest differs.

    >>> file_reasons({"reward.custom_reward_function.path": "blake3:1"},
    ...              {"reward.custom_reward_function.path": "blake3:2"})
    ['custom reward file changed (reward.custom_reward_function.path)']
    """
    return [
        f"{FILE_NAMES.get(path, 'file')} changed ({path})"
        for path in sorted(set(old) | set(new))
        if old.get(path) != new.get(path)
    ]


def input_reasons(old: Mapping[str, str], new: Mapping[str, str], what: str = "input") -> list[str]:
    """``input K1, K2 changed``: the input keys whose fingerprints differ.

    >>> input_reasons({"batch.x": "1", "batch.y": "2"}, {"batch.x": "1", "batch.y": "3"})
    ['input batch.y changed']
    """
    changed = sorted(key for key in set(old) | set(new) if old.get(key) != new.get(key))
    return [f"{what} {_listed(changed)} changed"] if changed else []


def miss_reasons(
    old: Mapping[str, Any], new: Mapping[str, Any], code_files: CodeLookup
) -> list[str]:
    """What differs between two key-part documents (module docstring), in key order: format,
    version, code, config, files, inputs, optional inputs, weights, seed. Empty when nothing
    does (the key is the same: a miss then means the cache record was not there)."""
    reasons = []
    if old.get("format") != new.get("format"):
        reasons.append(f"cache key format {old.get('format')} → {new.get('format')}")
        return reasons  # the parts of another format are not comparable one by one
    if old.get("version") != new.get("version"):
        reasons.append(f"stage version {old.get('version')} → {new.get('version')}")
    if old.get("code") != new.get("code"):
        reasons.append(code_reason(old.get("code", ""), new.get("code", ""), code_files))
    reasons += config_reasons(old.get("config") or {}, new.get("config") or {})
    reasons += file_reasons(old.get("files") or {}, new.get("files") or {})
    reasons += input_reasons(old.get("inputs") or {}, new.get("inputs") or {})
    reasons += input_reasons(old.get("optional") or {}, new.get("optional") or {}, "optional input")
    if old.get("weights") != new.get("weights"):
        reasons.append("weights changed")
    if old.get("seed") != new.get("seed"):
        reasons.append(f"sampling seed {_value(old.get('seed'))} → {_value(new.get('seed'))}")
    return reasons
