"""Stage cache keys: what a stage's output really depends on, hashed the same in every process.

A stage's cache key is ``sha256(canonical_json(parts))`` over its **key parts**
(:func:`stage_key_parts`), which the step journal records so that a miss can say why
(:func:`miss_reasons`)::

    {
        "format":  "ppoflow-stage-key-v2",
        "stage":   stage.name,
        "version": stage.version,
        "code":    fingerprint of the source the stage runs (flows/cache/code_fingerprint.py),
        "config":  {dotted path: value, for every path in stage.config_keys not in file_keys},
        "files":   {dotted path: content digest of the file or directory it names, for every
                    path in stage.file_keys} (custom reward file, tokenizer, reward model),
        "inputs":  {"<layer>.<key>": key fingerprint, for every key in stage.requires},
        "weights": the caller's weights fingerprint (reads_weights stages) or null,
        "seed":    {"seed": trainer.seed, "step": the global step} for a stage whose output
                   depends on its sampling seed (``Stage.seeded``), else null,
        "optional": {"<layer>.<key>": fingerprint, for every key in stage.optional the batch
                     holds} (only for stages that declare optional keys),
    }

``canonical_json`` sorts keys and drops whitespace, so the key depends on values only, never on
dict order, object ids or Python's per-process ``hash()`` salt. The global step is part of it
only through ``seed`` (a seeded stage) or a key that holds it (``meta.global_steps``). A user
file is keyed by its content, not its path: an in-place edit of a reward file is a miss, a copy
of the same file elsewhere is a hit.

Key fingerprints (lineage, no tensor hashing). Every key of a step batch comes from an artifact:
the step's input batch (``step_<k>/input``) or a stage's delta (``step_<k>/<stage>``). An
artifact's fingerprint is the sha256 of its content (``dataproto/fingerprint.py``), computed while
it is written. The fingerprint of key ``k`` is ``sha256("ppoflow-key-v1" | artifact fingerprint |
layer | k)``, so

* equal content gives equal fingerprints (a cache hit reproduces them exactly, in any process);
* a changed value changes its artifact's fingerprint and hence the key's: a stale input is never
  taken for a fresh one;
* it costs nothing beyond the hashing the artifact write does anyway, and never copies a tensor off
  the GPU. The price is granularity: a change to one key of a delta also changes the
  fingerprints of its sibling keys, so a stage reading only an unchanged sibling re-runs too
  (a conservative miss, never a wrong hit).

Reordered rows. When a stage reorders the step batch (``Stage.reorders``, the balance stage),
every key's rows move, so every key gets the new fingerprint ``sha256("ppoflow-reordered-v1" |
permutation key fingerprint | old key fingerprint)`` (:func:`reordered_fingerprints`): the same
permutation of the same content gives the same fingerprints in any process.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from typing import Any

from dataproto.fingerprint import canonical_json
from flows.cache.code_fingerprint import stage_code
from flows.cache.user_files import path_digest
from flows.jsonable import jsonable
from stages.stage import KeyRef, Stage

KEY_FORMAT = "ppoflow-stage-key-v2"
KEY_FINGERPRINT_FORMAT = "ppoflow-key-v1"
REORDERED_FORMAT = "ppoflow-reordered-v1"


def config_value(config: Any, dotted: str) -> Any:
    """The value at a dotted path (``"algorithm.gamma"``) of a pydantic model, object or mapping.

    Each segment is read as a mapping item when the node is a Mapping, else as an attribute
    (properties such as ``cfg.derived.use_critic`` work).

    >>> config_value({"algorithm": {"gamma": 1.0}}, "algorithm.gamma")
    1.0
    """
    node = config
    for depth, segment in enumerate(dotted.split(".")):
        where = ".".join(dotted.split(".")[:depth]) or "<config root>"
        if isinstance(node, Mapping):
            if segment not in node:
                raise KeyError(
                    f"config path {dotted!r}: {where} has no key {segment!r} "
                    f"(it has {sorted(map(str, node))})"
                )
            node = node[segment]
        elif hasattr(node, segment):
            node = getattr(node, segment)
        else:
            raise KeyError(
                f"config path {dotted!r}: {where} ({type(node).__name__}) has no field {segment!r}"
            )
    return node


def config_slice(config: Any, paths: Iterable[str]) -> dict[str, Any]:
    """{dotted path: canonical value} for the config values a stage reads.

    >>> config_slice({"a": {"b": (1, 2)}, "c": 3}, ["a.b"])
    {'a.b': [1, 2]}
    """
    return {path: jsonable(config_value(config, path), f"config {path!r}") for path in paths}


def key_fingerprint(artifact_fingerprint: str, key: KeyRef) -> str:
    """The lineage fingerprint of one key held by an artifact (module docstring).

    >>> from stages.stage import tensor
    >>> key_fingerprint("ab" * 32, tensor("x")) != key_fingerprint("ab" * 32, tensor("y"))
    True
    """
    text = f"{KEY_FINGERPRINT_FORMAT}\n{artifact_fingerprint}\n{key.layer}\n{key.name}"
    return hashlib.sha256(text.encode()).hexdigest()


def artifact_key_fingerprints(
    artifact_fingerprint: str, keys: Iterable[KeyRef]
) -> dict[KeyRef, str]:
    """{key: fingerprint} for every key an artifact holds."""
    return {key: key_fingerprint(artifact_fingerprint, key) for key in keys}


def reordered_fingerprints(
    fingerprints: Mapping[KeyRef, str], permutation_fingerprint: str
) -> dict[KeyRef, str]:
    """Key fingerprints after the rows were permuted by a key with ``permutation_fingerprint``.

    Only row-carrying keys (tensor and non-tensor layers) change; meta_info keys keep theirs.

    >>> from stages.stage import meta, tensor
    >>> out = reordered_fingerprints({tensor("x"): "a" * 64, meta("t"): "b" * 64}, "c" * 64)
    >>> out[tensor("x")] != "a" * 64, out[meta("t")] == "b" * 64
    (True, True)
    """
    out = {}
    for key, fingerprint in fingerprints.items():
        if key.layer == "meta_info":
            out[key] = fingerprint
            continue
        text = f"{REORDERED_FORMAT}\n{permutation_fingerprint}\n{fingerprint}"
        out[key] = hashlib.sha256(text.encode()).hexdigest()
    return out


def _optional_config(config: Any, dotted: str, default: Any) -> Any:
    try:
        return config_value(config, dotted)
    except KeyError:
        return default


def plugin_names(config: Any) -> tuple[str, ...]:
    """``ppoflow.plugins`` (none for a config without the key, such as a test's plain dict)."""
    return tuple(_optional_config(config, "ppoflow.plugins", ()) or ())


def code_part(stage: Stage, config: Any) -> str:
    """The fingerprint of the code ``stage`` runs under ``config``: its plugins and the modules
    it declares for the config (``Stage.code_modules``: the rollout's tool classes) included."""
    return stage_code(stage, (*plugin_names(config), *stage.code_modules(config))).fingerprint


def files_part(stage: Stage, config: Any) -> dict[str, str | None]:
    """{dotted path: content digest} of the user files and directories the stage reads."""
    return {path: path_digest(config_value(config, path)) for path in stage.file_keys_of(config)}


def seed_part(stage: Stage, config: Any, step: int | None) -> dict[str, int] | None:
    """``{"seed", "step"}`` for a seeded stage (its sampling seed's inputs), else None."""
    if not stage.seeded:
        return None
    if step is None:
        raise ValueError(f"stage {stage.name!r} is seeded per step: its cache key needs step=")
    return {"seed": int(config_value(config, "trainer.seed")), "step": int(step)}


def stage_key_parts(
    stage: Stage,
    config: Any,
    input_fingerprints: Mapping[KeyRef, str],
    weights_fingerprint: str | None = None,
    step: int | None = None,
) -> dict[str, Any]:
    """The parts of the stage's cache key (module docstring), as canonical JSON data.

    Args:
        input_fingerprints: fingerprint of (at least) every key in ``stage.requires``.
        weights_fingerprint: required for ``reads_weights`` stages, refused for the others.
        step: the global step (needed by a ``seeded`` stage).

    Raises:
        KeyError: a required key has no fingerprint (names the stage and key).
        ValueError: the weights fingerprint is missing for a weight-reading stage, or given to
            a stage that reads no weights.
    """
    missing = [str(key) for key in stage.requires if key not in input_fingerprints]
    if missing:
        raise KeyError(
            f"stage {stage.name!r}: no fingerprint for required keys {missing}; every input key "
            "must come from the step's input artifact or an upstream stage's artifact"
        )
    if stage.reads_weights and not weights_fingerprint:
        raise ValueError(
            f"stage {stage.name!r} reads weights, so its cache key needs a weights fingerprint; "
            f"got {weights_fingerprint!r}"
        )
    if not stage.reads_weights and weights_fingerprint is not None:
        raise ValueError(
            f"stage {stage.name!r} declares reads_weights=False but got a weights fingerprint "
            f"{weights_fingerprint[:16]!r}…; declare reads_weights=True or pass None"
        )
    file_keys = stage.file_keys_of(config)
    config_paths = [path for path in stage.config_keys_of(config) if path not in file_keys]
    parts = {
        "format": KEY_FORMAT,
        "stage": stage.name,
        "version": stage.version,
        "code": code_part(stage, config),
        "config": config_slice(config, config_paths),
        "files": files_part(stage, config),
        "inputs": {str(key): input_fingerprints[key] for key in stage.requires},
        "weights": weights_fingerprint,
        "seed": seed_part(stage, config, step),
    }
    if stage.optional:
        parts["optional"] = {
            str(key): input_fingerprints[key] for key in stage.optional if key in input_fingerprints
        }
    return parts


def cache_key_of(parts: Mapping[str, Any]) -> str:
    """The 64-hex-digit sha256 cache key of :func:`stage_key_parts`' document."""
    return hashlib.sha256(canonical_json(dict(parts)).encode()).hexdigest()


def stage_cache_key(
    stage: Stage,
    config: Any,
    input_fingerprints: Mapping[KeyRef, str],
    weights_fingerprint: str | None = None,
    step: int | None = None,
) -> str:
    """The stage's cache key: :func:`cache_key_of` of :func:`stage_key_parts` (same arguments)."""
    return cache_key_of(
        stage_key_parts(stage, config, input_fingerprints, weights_fingerprint, step)
    )
