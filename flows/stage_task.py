"""One stage of one step as a cached Prefect task whose cached value is a small ArtifactRef.

:func:`run_stage` is what the step flow calls for every enabled stage:

1. check that the batch holds the stage's ``requires`` and select only those keys;
2. compute the cache key (flows/cache/keys.py) from the stage's name, version, config values,
   the fingerprints of its input keys and, for a weight-reading stage, the weights fingerprint;
3. call the stage's Prefect task (:func:`stage_task`) with that key. Prefect looks the key up in
   the cache records under ``RunStore.cache_dir``; on a miss the task body (:func:`compute_stage`)
   calls ``stage.fn``, checks the delta holds exactly ``produces``, and writes the artifact
   ``<run>/step_<k>/<stage>/`` with the stage's metrics and cache key in its manifest. The task
   returns (and Prefect caches) only the :class:`ArtifactRef`, never tensors. A cache record is
   JSON naming that reference and nothing else, and Prefect reads records only through ppoflow's
   checks (flows/cache/records.py): a record ppoflow did not write (a pickle from an earlier
   version or a planted one, another serializer, garbled or truncated JSON) is never decoded; the
   stage logs one warning naming the file and is recomputed with the cache refreshed, which
   replaces the record (:func:`refused_record`);
4. on a miss the step goes on with the delta just computed (no re-read). A hit does no stage
   work: the artifact is loaded, the delta memory-mapped and the metrics taken from the
   manifest. A cached artifact that is missing, truncated, altered (``verify="full"`` hashes
   every file) or overwritten since (fingerprint or cache key differ) is recomputed with
   ``refresh_cache`` and never used.

The stage's wall time, loading included, is reported as ``timing_s/<timer>`` with verl's timer
names (:data:`TIMER_NAMES`).
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass, replace
from pathlib import Path
from time import perf_counter
from typing import Any

from prefect import Task, task
from prefect.exceptions import MissingContextError
from prefect.logging import get_run_logger
from prefect.utilities.annotations import quote

from dataproto.artifact import (
    ArtifactError,
    ArtifactRef,
    Verify,
    load_artifact,
    read_manifest,
    save_artifact,
    verify_artifact,
)
from dataproto.fingerprint import DEFAULT_DIGEST, Digest
from dataproto.protocol import DataProto
from flows.cache.code_fingerprint import stage_code
from flows.cache.keys import (
    artifact_key_fingerprints,
    cache_key_of,
    config_slice,
    config_value,
    plugin_names,
    stage_key_parts,
)
from flows.cache.miss_reasons import miss_reasons
from flows.cache.records import has_record, record_problem, task_options
from flows.dag import batch_keys
from flows.runs.artifact_writer import current_writer
from flows.runs.derived_keys import derived_fingerprints, rebuild_derived, stored_delta
from flows.runs.store import RunStore, StageRecord, decode_metrics, encode_metrics
from stages.stage import KeyRef, Stage, StageContext

#: stage name → verl timer name (``timing_s/<timer>``); other stages time under their own name
TIMER_NAMES = {"rollout": "gen", "ref_log_prob": "ref", "advantage": "adv"}


def timer_name(stage_name: str) -> str:
    """verl's timer name of a stage.

    >>> timer_name("ref_log_prob"), timer_name("update_actor")
    ('ref', 'update_actor')
    """
    return TIMER_NAMES.get(stage_name, stage_name)


def _log() -> logging.Logger | logging.LoggerAdapter:
    try:
        return get_run_logger()
    except MissingContextError:
        return logging.getLogger(__name__)


# --- the stage call ----------------------------------------------------------------------------


def select_inputs(stage: Stage, batch: DataProto) -> DataProto:
    """The batch reduced to the stage's required keys and the optional keys it holds (tensors
    shared, not copied)."""
    present = batch_keys(batch)
    wanted_keys = list(stage.requires) + [k for k in stage.optional if k in present]
    wanted = {
        layer: [k.name for k in wanted_keys if k.layer == layer]
        for layer in ("batch", "non_tensor_batch", "meta_info")
    }
    tensor_keys = wanted["batch"] if batch.batch is not None else None
    return batch.select(tensor_keys, wanted["non_tensor_batch"], wanted["meta_info"])


def check_delta(stage: Stage, delta: Any, rows: int) -> None:
    """Raise unless ``delta`` is a DataProto holding exactly ``stage.produces``, with ``rows`` rows.

    A delta without rows (meta_info only) passes the row check.
    """
    if not isinstance(delta, DataProto):
        raise TypeError(
            f"stage {stage.name!r} returned {type(delta).__name__}; a stage returns a DataProto "
            "holding exactly the keys it produces"
        )
    got, declared = batch_keys(delta), set(stage.produces)
    undeclared = sorted(str(k) for k in got - declared if k.layer not in stage.extra_outputs)
    missing = sorted(map(str, declared - got))
    if undeclared or missing:
        raise ValueError(
            f"stage {stage.name!r} returned a delta that does not match its declaration: "
            f"undeclared keys {undeclared}, missing declared keys {missing}; "
            f"produces is {sorted(map(str, declared))}"
        )
    has_rows = delta.batch is not None or bool(delta.non_tensor_batch)
    if has_rows and len(delta) != rows:
        raise ValueError(
            f"stage {stage.name!r} returned {len(delta)} rows for an input of {rows} rows; a "
            "delta keeps the batch's rows (repeat the batch before the step, not inside a stage)"
        )


def artifact_digest(config: Any) -> Digest:
    """The file digest a run's artifacts use, ``ppoflow.artifact_digest``; the default
    (``sha256_tree``) for a config without that key, such as a stage test's plain dict."""
    try:
        return config_value(config, "ppoflow.artifact_digest")
    except KeyError:
        return DEFAULT_DIGEST


def writes_in_background(config: Any) -> bool:
    """``ppoflow.artifacts.write_in_background``; False for a config without that key (a stage
    test's plain dict or toy config)."""
    try:
        return bool(config_value(config, "ppoflow.artifacts.write_in_background"))
    except KeyError:
        return False


def compute_stage(
    stage: Stage,
    inputs: DataProto,
    ctx: StageContext,
    path: str,
    cache_key: str,
    sink: dict[str, Any] | None = None,
) -> ArtifactRef:
    """Call ``stage.fn``, check its delta, and write it with its metrics as the artifact ``path``.

    The stage gets a copy of ``ctx`` whose ``metrics`` holds the step's metrics so far; what it
    adds (or replaces) there is its own metrics, stored in the manifest's ``extra``. When
    ``sink`` is given it receives ``delta`` and ``metrics`` (the in-memory results).
    """
    before = dict(ctx.metrics)
    stage_ctx = replace(ctx, metrics=dict(before))
    delta = stage.fn(inputs, stage_ctx)
    check_delta(stage, delta, len(inputs))
    added = {
        name: value
        for name, value in stage_ctx.metrics.items()
        if name not in before or value is not before[name]
    }
    extra = {"cache_key": cache_key, "metrics": encode_metrics(added, f"stage {stage.name!r}")}
    stored, derived = stored_delta(stage, inputs, delta)  # flows/runs/derived_keys.py
    writer = current_writer()  # the step's background writer (flows/runs/artifact_writer.py)
    if derived:
        extra["derived"] = derived
    ref = save_artifact(
        stored,
        path,
        stage=stage.name,
        stage_version=str(stage.version),
        config=config_slice(ctx.config, stage.config_keys_of(ctx.config)),
        extra=extra,
        overwrite=True,
        digest=artifact_digest(ctx.config),
        write_in=None if writer is None else writer.submit,
    )
    if sink is not None:
        sink.update(delta=delta, metrics=decode_metrics(extra["metrics"]), derived=derived)
    return ref


# --- the Prefect task --------------------------------------------------------------------------


def _key_from_parameters(_context: Any, parameters: dict[str, Any]) -> str:
    return parameters["cache_key"]


def _task_body(
    stage: Stage,
    inputs: DataProto,
    ctx: StageContext,
    path: str,
    cache_key: str,
    step: int,
    sink: dict[str, Any],
    name: str | None = None,
) -> ArtifactRef:
    """The task body: compute and save; ``sink`` gets the delta so a miss needs no re-read.

    The returned (cached) ref names the artifact by ``name``, its path relative to the run
    directory, so a copied run directory's cache records point at its own files."""
    ref = compute_stage(stage, inputs, ctx, path, cache_key, sink)
    return replace(ref, path=name or ref.path)


#: what a task run's name says when its stage is served from the cache (Prefect's timeline colours
#: a cached run as a computed one; its state is named ``Cached``)
CACHED_SUFFIX = " (cached)"


@functools.lru_cache(maxsize=256)
def _make_task(name: str, cache_dir: str, retries: int, refresh: bool, cached: bool) -> Task:
    return task(
        _task_body,
        name=name,
        task_run_name=name + "-step{step}" + (CACHED_SUFFIX if cached else ""),
        retries=retries,
        refresh_cache=True if refresh else None,
        **task_options(cache_dir, _key_from_parameters),
    )


def stage_task(
    stage: Stage,
    cache_dir: str | Path,
    retries: int = 0,
    refresh: bool = False,
    cached: bool = False,
) -> Task:
    """The Prefect task of ``stage``: cached by the ``cache_key`` parameter, result an ArtifactRef.

    Cache records live in ``cache_dir``, one per key: JSON naming the ArtifactRef, read only
    through ppoflow's checks (flows/cache/records.py, :func:`~flows.cache.records.task_options`).
    ``retries`` is for idempotent stages only: a weight-writing stage (an optimizer step) is
    never retried.
    ``refresh``: compute even on a cache hit (and replace the record). ``cached``: the cache
    holds a good record of this call's key, so its task run is named
    ``<stage>-step<k> (cached)`` (:data:`CACHED_SUFFIX`), else ``<stage>-step<k>``. Tasks are
    built once per (stage, cache_dir, retries, refresh, cached), not per call.
    """
    if retries and stage.writes_weights:
        raise ValueError(
            f"stage {stage.name!r} writes weights; retrying it could apply an update twice, so "
            f"retries must be 0 (got {retries})"
        )
    return _make_task(
        stage.name, str(Path(cache_dir).absolute()), int(retries), bool(refresh), bool(cached)
    )


# --- one stage in the step ---------------------------------------------------------------------


@dataclass
class StageOutcome:
    """What :func:`run_stage` hands back to the step flow."""

    delta: DataProto
    record: StageRecord
    fingerprints: dict[KeyRef, str]


def load_delta(
    ref: ArtifactRef, cache_key: str, verify: Verify, stage: Stage, inputs: DataProto
) -> tuple[DataProto, dict[str, float], list[str]]:
    """The delta (its derived keys rebuilt from ``inputs``, flows/runs/derived_keys.py), metrics and
    derived key names of the artifact ``ref``, after checking it is what ``ref`` names.

    Raises:
        ArtifactError: the artifact is missing, damaged, or was overwritten by other content.
    """
    manifest = read_manifest(ref.path)
    extra = manifest.get("extra") or {}
    if manifest["fingerprint"] != ref.fingerprint or extra.get("cache_key") != cache_key:
        raise ArtifactError(
            f"{ref.path}: holds fingerprint {manifest['fingerprint'][:16]}… for cache key "
            f"{str(extra.get('cache_key'))[:16]}…, but the cache record expects "
            f"{ref.fingerprint[:16]}… for {cache_key[:16]}… (the artifact was overwritten)"
        )
    delta, derived = _load_rebuilt(ref.path, manifest, verify, stage, inputs)
    return delta, decode_metrics(extra.get("metrics", {})), derived


def _load_rebuilt(
    path: str, manifest: dict[str, Any], verify: Verify, stage: Stage, inputs: DataProto
) -> tuple[DataProto, list[str]]:
    """The artifact at ``path`` with the derived keys its manifest lists built again."""
    derived = list((manifest.get("extra") or {}).get("derived") or [])
    try:
        return rebuild_derived(stage, inputs, load_artifact(path, verify=verify), derived), derived
    except (ValueError, KeyError) as err:
        if isinstance(err, ArtifactError):
            raise
        raise ArtifactError(
            f"{path}: its derived keys {derived} cannot be rebuilt ({err})"
        ) from None


def _call(
    stage: Stage,
    inputs: DataProto,
    ctx: StageContext,
    path: str,
    key: str,
    step: int,
    cache_dir: Path,
    name: str,
    refresh: bool,
    retries: int,
) -> tuple[ArtifactRef, tuple[DataProto, dict[str, float], list[str]] | None]:
    """(the ArtifactRef, the in-memory delta, metrics and derived key names when the task body
    ran, else None)."""
    cached = not refresh and has_record(cache_dir, key)  # a refused record is refreshed
    prefect_task = stage_task(stage, cache_dir, retries, refresh, cached)
    sink: dict[str, Any] = {}
    # raises the stage's exception when the task failed; the body fills ``sink`` only when it
    # ran, so an empty sink is a cache hit
    ref = prefect_task(quote(stage), quote(inputs), quote(ctx), path, key, step, quote(sink), name)
    if "delta" not in sink:
        return ref, None
    return replace(ref, path=path), (sink["delta"], sink["metrics"], sink["derived"])


def load_cached(
    ref: ArtifactRef,
    store: RunStore,
    cache_key: str,
    verify: Verify,
    stage: Stage,
    inputs: DataProto,
) -> tuple[ArtifactRef, tuple[DataProto, dict[str, float], list[str]]]:
    """The cache record's artifact, looked for in the run and the runs it branched from
    (``RunStore.candidates``); the first that holds the record's fingerprint and key wins.

    Raises:
        ArtifactError: no candidate holds it (each candidate's problem named).
    """
    problems = []
    for path in store.candidates(ref.path):
        located = replace(ref, path=path)
        try:
            return located, load_delta(located, cache_key, verify, stage, inputs)
        except (ArtifactError, FileNotFoundError) as err:
            problems.append(str(err))
    raise ArtifactError("; ".join(problems) or f"{ref.path}: no such artifact")


def run_stage(
    stage: Stage,
    batch: DataProto,
    ctx: StageContext,
    store: RunStore,
    step: int,
    *,
    fingerprints: dict[KeyRef, str],
    weights_fingerprint: str | None = None,
    refresh: bool = False,
    refresh_reason: str = "cache refreshed",
    retries: int = 0,
    verify: Verify = "full",
    previous: StageRecord | None = None,
) -> StageOutcome:
    """Run (or take from the cache) one stage of step ``step`` (module docstring).

    Args:
        fingerprints: key fingerprints of the step batch so far (at least ``stage.requires``).
        weights_fingerprint: for a ``reads_weights`` stage, a fingerprint of the weights it reads.
        refresh: recompute even on a cache hit (``ppoflow rerun --refresh``, a weight-writing
            stage in training); ``refresh_reason`` is the record's reason then.
        verify: how a cached artifact is checked before use: ``"full"`` hashes every file, so
            any damage is caught; ``"lazy"`` skips hashing tensor bytes (sizes, header and small
            files are still checked), faster for large batches but blind to a flipped tensor byte.
        previous: the record of this stage in an earlier computation of the step (an earlier
            training into this directory, a re-run's parent); a miss names what changed since.

    Returns:
        The delta, the stage's journal record and the fingerprints of the keys it produced.
    """
    start = perf_counter()
    stage.check_inputs(batch)
    inputs = select_inputs(stage, batch)
    parts = stage_key_parts(stage, ctx.config, fingerprints, weights_fingerprint, step)
    key = cache_key_of(parts)
    if not store.has_saved_code_manifest(parts["code"]):  # once per fingerprint and process
        store.save_code_manifest(
            parts["code"], dict(stage_code(stage, plugin_names(ctx.config)).files)
        )
    path = store.artifact_path(step, stage.name)
    call = functools.partial(
        _call,
        stage,
        inputs,
        replace(ctx, step=step),
        path,
        key,
        step,
        store.cache_dir,
        store.relative(path),
    )
    refused = None if refresh else refused_record(stage, store.cache_dir, key)
    ref, computed = call(refresh or refused is not None, retries)
    if computed is not None:
        reason = refused or (refresh_reason if refresh else miss_reason(previous, parts, store))
    else:
        reason = "cache hit"
        try:
            ref, computed = load_cached(ref, store, key, verify, stage, inputs)
        except ArtifactError as err:
            _log().warning("stage %r: cached artifact unusable, recomputing: %s", stage.name, err)
            ref, computed = call(True, retries)
            reason = f"recomputed: the cached artifact was unusable ({err})"
    if computed is None:
        raise RuntimeError(f"stage {stage.name!r}: refresh_cache still served a cached result")
    delta, metrics, derived = computed
    record = StageRecord(
        stage=stage.name,
        status="cached" if reason == "cache hit" else "ran",
        reason=reason,
        artifact=ref.path,
        fingerprint=ref.fingerprint,
        cache_key=key,
        rows=ref.rows,
        nbytes=ref.nbytes,
        timing_s=perf_counter() - start,
        metrics=metrics,
        key_parts=parts,
    )
    return StageOutcome(
        delta, record, _produced_fingerprints(stage, delta, ref.fingerprint, derived, fingerprints)
    )


def _produced_fingerprints(
    stage: Stage,
    delta: DataProto,
    artifact: str,
    derived: list[str],
    fingerprints: dict[KeyRef, str],
) -> dict[KeyRef, str]:
    """The key fingerprints of what the stage produced: from its artifact's fingerprint, and for
    derived keys also from the input keys they are built from (flows/runs/derived_keys.py)."""
    produced = set(stage.produces) | batch_keys(delta) if stage.extra_outputs else stage.produces
    found = artifact_key_fingerprints(artifact, produced)
    found.update(derived_fingerprints(stage, derived, artifact, fingerprints))
    return found


def refused_record(stage: Stage, cache_dir: Path, key: str) -> str | None:
    """The journal reason when the cache record of ``key`` is refused (flows/cache/records.py),
    after one warning naming the file; None when there is no record or a good one."""
    problem = record_problem(cache_dir, key)
    if problem is None:
        return None
    _log().warning(
        "stage %r: %s; it was not decoded: recomputing the stage, which replaces the record",
        stage.name,
        problem,
    )
    return f"recomputed: {problem}"


def miss_reason(previous: StageRecord | None, parts: dict[str, Any], store: RunStore) -> str:
    """``"cache miss"``, followed by what changed since ``previous`` when it is known."""
    if previous is None or not previous.key_parts:
        return "cache miss"
    reasons = miss_reasons(previous.key_parts, parts, store.code_manifest)
    return "cache miss: " + "; ".join(reasons) if reasons else "cache miss"


def check_reusable(records: dict[str, StageRecord], origin: str, verify: Verify) -> None:
    """Make, before anything is written, the checks :func:`reuse_stage` makes on each record's
    artifact: it exists, holds the recorded fingerprint, and its files pass ``verify``
    (``"full"`` hashes every file, ``"lazy"`` checks sizes, the manifest and the small files).
    ``records`` maps a stage name to its record in ``origin``'s journal.

    Raises:
        ArtifactError: naming the artifact file that is missing, damaged or replaced.
        ValueError: a record has no artifact.
    """
    for name, record in records.items():
        _check_reused_manifest(name, record, origin)
        if verify == "full":
            verify_artifact(record.artifact)
        else:
            load_artifact(record.artifact, verify=verify)


def _check_reused_manifest(stage: str, record: StageRecord, origin: str) -> None:
    if record.artifact is None or record.fingerprint is None:
        raise ValueError(
            f"stage {stage!r} has no artifact in {origin} ({record.status}: "
            f"{record.reason}); re-run from {stage!r} or an earlier stage instead"
        )
    manifest = read_manifest(record.artifact)
    if manifest["fingerprint"] != record.fingerprint:
        raise ArtifactError(
            f"{record.artifact}: holds fingerprint {manifest['fingerprint'][:16]}…, but the "
            f"journal of {origin} records {record.fingerprint[:16]}… (the artifact was replaced)"
        )


def reuse_stage(
    stage: Stage,
    record: StageRecord,
    origin: str,
    verify: Verify,
    batch: DataProto,
    fingerprints: dict[KeyRef, str],
) -> StageOutcome:
    """Take one stage's delta from another run's journal record (a re-run's upstream stages).

    The artifact ``record.artifact`` is loaded (``verify="full"`` hashes every file) and must
    still hold ``record.fingerprint``; its derived keys are rebuilt from ``batch`` (the step batch
    so far, whose key fingerprints are ``fingerprints``); its metrics come from the record. No
    stage work is done.

    Raises:
        ArtifactError: the artifact is gone, damaged, or holds other content than recorded.
        ValueError: the record has no artifact (the stage was skipped in ``origin``).
    """
    start = perf_counter()
    _check_reused_manifest(stage.name, record, origin)
    manifest = read_manifest(record.artifact)
    delta, derived = _load_rebuilt(
        record.artifact, manifest, verify, stage, select_inputs(stage, batch)
    )
    reused = replace(
        record,
        status="cached",
        reason=f"reused from {origin}",
        timing_s=perf_counter() - start,
        metrics=dict(record.metrics),
    )
    found = _produced_fingerprints(stage, delta, record.fingerprint, derived, fingerprints)
    return StageOutcome(delta, reused, found)
