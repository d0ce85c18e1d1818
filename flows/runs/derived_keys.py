"""A stage's derived keys (``Stage.derived``): left out of its artifact, rebuilt on load.

On save, each derived key of the delta is built again from the stage's inputs and the delta's
other tensors; only when that gives the same tensor (``torch.equal``, same dtype) is the key left
out, and the manifest's ``extra["derived"]`` lists it. A key that differs (an engine that lays its
tensors out another way) is stored as it is. On load the listed keys are built from the batch the
stage reads and the loaded tensors, so a loaded delta holds every key the stage produces.

Lineage: a derived key's fingerprint is that of the artifact *and* of the input keys it is built
from — the artifact alone does not hold them (the rollout's ``input_ids`` contain the prompts,
which are in the step input, not in the rollout artifact):

    fingerprint(key) = key_fingerprint(sha256("derived\\n" + artifact ‖ fingerprints of the needed
                                              input keys, in ``needs`` order), key)
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from tensordict import TensorDict

from dataproto import DataProto
from dataproto.artifact import ArtifactError, Verify, load_artifact, read_manifest
from dataproto.report import Completion
from flows.cache.keys import key_fingerprint
from stages.stage import KeyRef, Stage, tensor

#: the folder of a step's input artifact beside its stage artifacts (flows/runs/store.py)
STEP_INPUT = "input"


def _tensors(inputs: DataProto, delta: TensorDict) -> dict[str, torch.Tensor]:
    """Name → tensor over the stage's inputs and its delta (the delta's win)."""
    found = dict(inputs.batch.items()) if inputs.batch is not None else {}
    found.update(delta.items())
    return found


def stored_delta(stage: Stage, inputs: DataProto, delta: DataProto) -> tuple[DataProto, list[str]]:
    """(the delta to store, the derived keys left out, sorted): a key is left out only when its
    :class:`~stages.stage.DerivedKey` rebuilds it exactly from ``inputs`` and the delta's other
    tensors."""
    if not stage.derived or delta.batch is None:
        return delta, []
    kept = delta.batch.exclude(*stage.derived)
    available = _tensors(inputs, kept)
    left_out = []
    for name, derivation in stage.derived.items():
        if name not in delta.batch or any(k.name not in available for k in derivation.needs):
            continue
        made, actual = derivation.build(available), delta.batch[name]
        if made.dtype == actual.dtype and torch.equal(made, actual):
            left_out.append(name)
    if not left_out:
        return delta, []
    stored = DataProto(
        batch=delta.batch.exclude(*left_out),
        non_tensor_batch=dict(delta.non_tensor_batch),
        meta_info=dict(delta.meta_info),
    )
    return stored, sorted(left_out)


def rebuild_derived(
    stage: Stage, inputs: DataProto, delta: DataProto, names: Sequence[str]
) -> DataProto:
    """``delta`` with the derived keys ``names`` built again (a loaded artifact's ``extra["derived"]``).

    Raises:
        ValueError: a name the stage does not derive (the artifact is not this stage's).
    """
    unknown = [name for name in names if name not in stage.derived]
    if unknown:
        raise ValueError(
            f"the artifact lists derived keys {unknown} that stage {stage.name!r} does not derive "
            f"(it derives {sorted(stage.derived)})"
        )
    if not names:
        return delta
    available = _tensors(inputs, delta.batch)
    built = {name: stage.derived[name].build(available) for name in names}
    batch = delta.batch.clone(recurse=False)
    for name, value in built.items():
        batch.set(name, value)
    ordered = [k.name for k in stage.produces if k.layer == "batch" and k.name in batch]
    rest = [name for name in batch.keys() if name not in ordered]  # noqa: SIM118 (a TensorDict)
    return DataProto(
        batch=batch.select(*ordered, *rest),
        non_tensor_batch=dict(delta.non_tensor_batch),
        meta_info=dict(delta.meta_info),
    )


def derived_fingerprints(
    stage: Stage, names: Sequence[str], artifact: str, fingerprints: Mapping[KeyRef, str]
) -> dict[KeyRef, str]:
    """{key: fingerprint} of the derived keys ``names`` (module docstring): the artifact's
    fingerprint with those of the input keys each is built from."""
    produced = set(stage.produces)
    out = {}
    for name in names:
        needs = [k for k in stage.derived[name].needs if k not in produced]
        text = "\n".join(["derived", artifact, *(fingerprints[k] for k in needs)])
        out[tensor(name)] = key_fingerprint(hashlib.sha256(text.encode()).hexdigest(), tensor(name))
    return out


def from_step_input(path: str | os.PathLike, verify: Verify, stages: Sequence[Stage]) -> Completion:
    """For ``describe_artifact``: a stage artifact's derived keys rebuilt from the step input
    artifact beside it (``<step dir>/input``), when the stage (looked up by the manifest's stage
    name in ``stages``) builds them from the step input and that artifact is there; otherwise the
    note says they were left out."""

    def complete(data: DataProto, manifest: dict[str, Any]) -> tuple[DataProto, str | None]:
        derived = list((manifest.get("extra") or {}).get("derived") or [])
        if not derived:
            return data, None
        names = ", ".join(derived)
        left_out = f"{names}: not stored; rebuilt when the step is loaded"
        stage = next((s for s in stages if s.name == manifest.get("stage")), None)
        step_input = os.path.join(os.path.dirname(os.path.abspath(os.fspath(path))), STEP_INPUT)
        if stage is None or not os.path.isdir(step_input):
            return data, f"{left_out} (no step input beside the artifact)"
        try:
            inputs = load_artifact(step_input, verify=verify)
            return rebuild_derived(stage, inputs, data, derived), (
                f"{names}: not stored; rebuilt from {step_input}"
            )
        except (ArtifactError, KeyError, ValueError) as err:
            return data, f"{left_out} (not from {step_input}: {err})"

    return complete


def load_stage_artifact(
    path: str | os.PathLike, verify: Verify = "full", stages: Sequence[Stage] | None = None
) -> DataProto:
    """A run's stage artifact with the keys its stage left out rebuilt from the step input beside
    it (what the step batch held), for scripts and tests that read one stage of a past step.
    ``stages``: where to find the stage by name (default: ``stages.ppo.PPO_STAGES``).

    Raises:
        ArtifactError: the artifact fails ``verify``, or its derived keys cannot be rebuilt.
    """
    if stages is None:
        from stages.ppo import PPO_STAGES

        stages = PPO_STAGES
    manifest = read_manifest(path)
    data, note = from_step_input(path, verify, stages)(load_artifact(path, verify=verify), manifest)
    if note is not None and "rebuilt from" not in note:
        raise ArtifactError(f"{os.fspath(path)}: {note}")
    return data


__all__ = [
    "derived_fingerprints",
    "from_step_input",
    "load_stage_artifact",
    "rebuild_derived",
    "stored_delta",
]
