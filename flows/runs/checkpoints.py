"""Run checkpoints every ``trainer.save_freq`` steps: engines, data position, KL controller.

Layout (verl's) under ``trainer.default_local_dir``::

    global_step_<N>/actor/        the actor engine (stages/engines/checkpoint.py: weights,
    global_step_<N>/critic/       optimizer, lr schedule, RNG states), critic when in use
    global_step_<N>/data/state.json   the loader position, the KL controller, the weights lineage,
                                      the run (``run``: its directory and MLflow run) and the
                                      step's metrics as published (``step_metrics``)
    global_step_<N>/checkpoint_manifest.json   role, path, size and BLAKE3 digest of every file
                                               above (stages/engines/checkpoint_manifest.py)
    latest_checkpointed_iteration.txt  N (written after everything else)

Each engine directory is written atomically by its worker (its ``client_state.json`` records the
step and the role); ``state.json`` by temp + rename; then the step's manifest (temp + fsync +
rename), and the tracker last, so it never names an incomplete step. Then all but the newest
``max_actor_ckpt_to_keep`` (or ``max_critic_ckpt_to_keep`` when smaller) steps are deleted.

Every load checks the step against its manifest first (``verify_checkpoint``: ``"full"`` hashes
every file, ``"fast"`` checks sizes and the small JSON files only), and refuses a step whose
step, role, size or digest does not match, or whose manifest is missing, with one
``CheckpointIntegrityError`` line naming the file: :func:`read_run_state` (``data`` only),
:func:`load_run_checkpoint` (the engines' roles and ``data``), :func:`resume_checkpoint`.

Resume (``trainer.resume_mode``, :func:`resume_checkpoint`): ``disable`` starts fresh; ``auto``
takes the newest step of ``default_local_dir`` that passes the check, starting from the step in
the tracker (fresh when there is no tracker), and returns a notice for each step it skipped and
why (a step newer than the tracker is an unfinished save); none valid is an error listing them;
``resume_path`` takes ``resume_from_path``, a ``…/global_step_N`` folder, which must pass.
:func:`restore_run_checkpoint` then restores the engines (weights, optimizer, lr schedule, RNG
states) and returns the run state; the loader position is restored even at an epoch boundary
(the loader's state points at the next batch there, so the verl 0.9.1 skip is not needed).

The ``run`` entry (:func:`checkpoint_run`: ``run_dir``, ``mlflow_run_id``,
``mlflow_tracking_uri``, ``mlflow_experiment``) is what lets a resume continue the same MLflow
run and replay the journaled steps that run lacks, and ``step_metrics`` (:func:`checkpoint_metrics`)
holds step N's metrics with its validation metrics, which step N's journal does not have: the
metrics are published after the checkpoint, so a kill right after it can leave them unsent.
Checkpoints written before these entries existed read as ``{}``.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from dataproto.artifact_store import naming_failed_writes
from flows.runs.store import decode_metrics, encode_metrics
from stages.engines.checkpoint import (
    checkpoint_dir,
    checkpoint_steps,
    prune_checkpoints,
    read_latest_step,
    write_latest_step,
)
from stages.engines.checkpoint_manifest import (
    STEP_DIR,
    CheckpointIntegrityError,
    CheckpointVerify,
    VerifiedCheckpoint,
    remove_step_manifest,
    verify_checkpoint,
    write_step_manifest,
)

DATA_ROLE = "data"
STATE_FILE = "state.json"
CHECKPOINT_ROLES = ("actor", "critic")
RUN_KEY = "run"  # the run that wrote the checkpoint: run_dir and its MLflow run
METRICS_KEY = "step_metrics"  # the checkpoint step's metrics as published (encode_metrics)
RUN_KEYS = ("run_dir", "mlflow_run_id", "mlflow_tracking_uri", "mlflow_experiment")


def controller_state(kl_ctrl: Any) -> dict[str, Any] | None:
    """The KL controller's plain attributes (β ``value``, adaptive target/horizon), or None."""
    if kl_ctrl is None:
        return None
    return {"type": type(kl_ctrl).__name__, **vars(kl_ctrl)}


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
    try:  # a full disk leaves no temp file behind and names the file it could not write
        with naming_failed_writes(temp), os.fdopen(handle, "w", encoding="utf-8") as out:
            json.dump(data, out, indent=1, sort_keys=True)
        os.replace(temp, path)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise


def keep_last(trainer: Any) -> int | None:
    """How many checkpoint steps to keep (None = all): the smaller of the two keep-limits."""
    limits = [n for n in (trainer.max_actor_ckpt_to_keep, trainer.max_critic_ckpt_to_keep) if n]
    return min(limits) if limits else None


def save_run_checkpoint(
    root: str | Path, step: int, engines: dict[str, Any], run_state: dict[str, Any], trainer: Any
) -> Path:
    """Save step ``step`` (module docstring); ``run_state`` is JSON data (loader, KL, lineage)."""
    roles = [role for role in CHECKPOINT_ROLES if role in engines]
    remove_step_manifest(root, step)  # a step saved again is incomplete until its new manifest
    for role in roles:
        engines[role].call_all(
            "save_checkpoint",
            directory=str(checkpoint_dir(root, step, role)),
            client_state={"global_step": step, "role": role},
        )
    data_dir = checkpoint_dir(root, step, DATA_ROLE)
    _write_json(data_dir / STATE_FILE, {"global_step": step, **run_state})
    write_step_manifest(root, step, [*roles, DATA_ROLE])
    write_latest_step(root, step)
    prune_checkpoints(root, keep_last(trainer))
    return data_dir.parent


def resume_checkpoint(
    trainer: Any, verify: CheckpointVerify = "full"
) -> tuple[VerifiedCheckpoint | None, list[str]]:
    """The checkpoint to resume from under ``trainer.resume_mode`` (None: start fresh), checked
    by ``verify_checkpoint`` over every role it holds, and one notice per step skipped on the
    way (``auto``: module docstring). Prints nothing; the caller shows the notices.

    Raises:
        CheckpointIntegrityError: ``resume_path`` names a step that fails the check; ``auto``
            finds none that passes (the message lists why each was skipped).
        ValueError: ``resume_from_path`` is not a ``…/global_step_N`` folder.
    """
    if trainer.resume_mode == "disable":
        return None, []
    if trainer.resume_mode != "auto":
        path = Path(trainer.resume_from_path or "")
        match = STEP_DIR.fullmatch(path.name)
        if match is None or not path.is_dir():
            raise ValueError(
                f"trainer.resume_from_path={trainer.resume_from_path!r} must be an existing "
                "…/global_step_N checkpoint folder (resume_mode resume_path)"
            )
        return verify_checkpoint(path.parent, int(match.group(1)), verify=verify), []
    root = Path(trainer.default_local_dir)
    latest = read_latest_step(root)
    if latest is None:
        return None, []
    steps = checkpoint_steps(root)
    notices = [
        f"skipped the checkpoint of step {step} under {root}: it is newer than the tracker's "
        f"step {latest} (its save did not finish)"
        for step in reversed(steps)
        if step > latest
    ]
    for step in sorted({latest, *(s for s in steps if s < latest)}, reverse=True):
        try:
            return verify_checkpoint(root, step, verify=verify), notices
        except CheckpointIntegrityError as err:
            notices.append(f"skipped the checkpoint of step {step}: {err}")
    raise CheckpointIntegrityError(
        f"no checkpoint under {root} passes its check (trainer.resume_mode=auto): "
        + "; ".join(notices)
        + "; restore one, or start fresh with trainer.resume_mode=disable"
    )


def read_run_state(
    root: str | Path, step: int, verify: CheckpointVerify = "full"
) -> dict[str, Any]:
    """The ``state.json`` data of ``root/global_step_<step>``, after checking the ``data`` role
    against the step's manifest (no engine is touched)."""
    verify_checkpoint(root, step, (DATA_ROLE,), verify)
    state_file = checkpoint_dir(root, step, DATA_ROLE) / STATE_FILE
    return json.loads(state_file.read_text(encoding="utf-8"))


def load_run_checkpoint(
    root: str | Path, step: int, engines: dict[str, Any], verify: CheckpointVerify = "full"
) -> dict[str, Any]:
    """Check, then restore the engines of ``root/global_step_<step>``; returns its
    ``state.json`` data."""
    roles = (*(role for role in CHECKPOINT_ROLES if role in engines), DATA_ROLE)
    return restore_run_checkpoint(verify_checkpoint(root, step, roles, verify), engines)


def restore_run_checkpoint(
    checkpoint: VerifiedCheckpoint, engines: dict[str, Any]
) -> dict[str, Any]:
    """Restore the engines from a checked step (:func:`resume_checkpoint`'s choice, or
    ``verify_checkpoint``'s result); returns its ``state.json`` data.

    Raises:
        CheckpointIntegrityError: the run has an engine whose role the check did not cover
            (the checkpoint holds no such role).
    """
    needed = [*(role for role in CHECKPOINT_ROLES if role in engines), DATA_ROLE]
    unchecked = [role for role in needed if role not in checkpoint.roles]
    if unchecked:
        raise CheckpointIntegrityError(
            f"checkpoint {checkpoint.directory}: this run needs its {unchecked} files, which "
            f"were not checked (checked: {list(checkpoint.roles)}); a checkpoint of a run "
            "without that role cannot restore it"
        )
    directory = checkpoint.directory
    state = json.loads((directory / DATA_ROLE / STATE_FILE).read_text(encoding="utf-8"))
    for role in CHECKPOINT_ROLES:
        if role in engines:
            engines[role].call_all("load_checkpoint", directory=str(directory / role))
    return state


def checkpoint_run(state: dict[str, Any]) -> dict[str, str | None]:
    """The run entry of a checkpoint's state (module docstring), every key of :data:`RUN_KEYS`
    present (None when unknown, or for a checkpoint written before the entry existed).

    >>> checkpoint_run({"global_step": 2})["mlflow_run_id"] is None
    True
    """
    entry = state.get(RUN_KEY) or {}
    return {key: entry.get(key) for key in RUN_KEYS}


def checkpoint_metrics(state: dict[str, Any]) -> dict[str, float]:
    """The checkpoint step's metrics as published ({} for an older checkpoint).

    >>> checkpoint_metrics({"step_metrics": {"a": 1.0, "b": {"float": "nan"}}})
    {'a': 1.0, 'b': nan}
    """
    return decode_metrics(state.get(METRICS_KEY) or {})


def tracking_state(run: dict[str, str | None], metrics: dict[str, float]) -> dict[str, Any]:
    """The ``run`` and ``step_metrics`` entries of a checkpoint's run state.

    >>> tracking_state({"run_dir": "/r"}, {"a": float("inf")})["step_metrics"]
    {'a': {'float': 'inf'}}
    """
    return {
        RUN_KEY: {key: run.get(key) for key in RUN_KEYS},
        METRICS_KEY: encode_metrics(metrics, "checkpoint step metrics"),
    }


def restore_controller(kl_ctrl: Any, state: dict[str, Any] | None) -> None:
    """Put a saved :func:`controller_state` back into ``kl_ctrl`` (same type required)."""
    if kl_ctrl is None or state is None:
        return
    saved = dict(state)
    kind = saved.pop("type")
    if kind != type(kl_ctrl).__name__:
        raise ValueError(
            f"the checkpoint holds a {kind} KL controller, the config builds a "
            f"{type(kl_ctrl).__name__}; resume with the same algorithm.kl_ctrl.type"
        )
    vars(kl_ctrl).update(saved)
