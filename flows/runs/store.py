"""The run directory: artifacts per (step, stage), a journal per step, the resolved config.

Layout (``root`` is a local path or any fsspec URL)::

    <root>/config.json                 the resolved run config (JSON)
    <root>/run_info.json               who the run is: its MLflow run id, store and experiment
                                       (flows/runs/identity.py), rewritten on resume
    <root>/step_<k>/input/             the step's input batch (an artifact)
    <root>/step_<k>/<stage>/           each stage's delta (an artifact, dataproto/artifact.py)
    <root>/step_<k>/journal.json       what happened in step k (StepJournal below)
    <root>/cache/                      Prefect's cache records (local roots; see RunStore)
    <root>/code/<fingerprint>.json     the files (name → BLAKE3) behind a stage's code fingerprint
    <root>/rerun.json                  a re-run branch's parent, step, stages and overrides
                                       (flows/rerun.py); a run's branches are found from these
                                       (flows/runs/branches.py), never written into the run

Artifacts are named relative to the run directory in journals and cache records, so a copied
or moved run directory is self-contained: it re-runs from its own files.

The journal is rewritten after every stage, so an interrupted step leaves a journal whose
``status`` is ``"running"`` and which lists the stages finished so far. Each stage record says
whether the stage ran, was taken from the cache, or was skipped (and why), with its artifact path,
fingerprint, cache key, size, time and the metrics it reported. ``ppoflow inspect`` reads it.

Journal and config files are written atomically on a local disk (temp file + ``os.replace``);
on other fsspec stores each is one ``pipe_file`` call.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import posixpath
import re
import shutil
import tempfile
from contextlib import suppress
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Literal

import fsspec
from fsspec.implementations.local import LocalFileSystem

from dataproto.artifact import ArtifactRef, save_artifact
from dataproto.artifact_store import naming_failed_writes
from dataproto.fingerprint import DEFAULT_DIGEST, Digest
from flows.jsonable import jsonable
from flows.runs.branches import RERUN_FILE as RERUN_FILE
from flows.runs.branches import find_branches, note_branch, parent_chain

Status = Literal["ran", "cached", "skipped"]
STATUSES = ("ran", "cached", "skipped")
CONFIG_FILE = "config.json"
RUN_INFO_FILE = "run_info.json"  # the run's MLflow run and store (flows/runs/identity.py)
#: the keys every run_info.json holds (a value is None when the run has no MLflow run)
RUN_INFO_REQUIRED = ("mlflow_run_id", "mlflow_tracking_uri", "mlflow_experiment")
JOURNAL_FILE = "journal.json"
BRANCHES_DIR = "branches"  # branches/<id>.json: notes older versions wrote (flows/runs/branches.py)
CODE_DIR = "code"  # code/<fingerprint>.json: the files behind a stage's code fingerprint
INPUT_NAME = "input"
_SEGMENT = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]*")


# --- metric values in JSON ---------------------------------------------------------------------


def encode_metrics(metrics: dict[str, Any], where: str = "metrics") -> dict[str, Any]:
    """Scalar metrics as JSON values; NaN and ±inf become ``{"float": "nan"}`` (JSON has none).

    >>> encode_metrics({"a": 1, "b": float("nan")})
    {'a': 1.0, 'b': {'float': 'nan'}}
    """
    out = {}
    for name, value in metrics.items():
        try:
            number = float(value)
        except (TypeError, ValueError):
            raise TypeError(
                f"{where}: metric {name!r} is {type(value).__name__} {value!r:.80}; a metric must "
                "be one scalar (reduce lists before reporting them)"
            ) from None
        out[str(name)] = number if math.isfinite(number) else {"float": repr(number)}
    return out


def decode_metrics(encoded: dict[str, Any]) -> dict[str, float]:
    """Inverse of :func:`encode_metrics`.

    >>> decode_metrics({"a": 1.0, "b": {"float": "-inf"}})
    {'a': 1.0, 'b': -inf}
    """
    return {
        name: float(value["float"]) if isinstance(value, dict) else float(value)
        for name, value in encoded.items()
    }


# --- journal records ---------------------------------------------------------------------------


@dataclass
class StageRecord:
    """What happened to one stage in one step.

    status: ``ran`` (computed), ``cached`` (artifact reused, no stage work) or ``skipped``.
    reason: why (``"cache miss"``, ``"cache hit"``, ``"disabled: …"``, ``"recomputed: …"``).
    artifact / fingerprint / rows / nbytes: the delta's artifact (None when skipped).
    cache_key: the stage's cache key (flows/cache/keys.py); key_parts: what it was hashed from
        (code fingerprint, config values, file digests, input fingerprints, weights, seed), so
        a later miss can say what changed.
    timing_s: wall time of the stage in this step, loading a cached artifact included.
    metrics: the metrics the stage reported (stored with its artifact, so a hit restores them).
    """

    stage: str
    status: Status
    reason: str
    artifact: str | None = None
    fingerprint: str | None = None
    cache_key: str | None = None
    rows: int | None = None
    nbytes: int | None = None
    timing_s: float | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    key_parts: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"stage {self.stage!r}: status {self.status!r}, expected {STATUSES}")

    def to_json(self, root: str | None = None) -> dict[str, Any]:
        """JSON data; with ``root``, an artifact below it is named relative to it. Shallow:
        ``key_parts`` is JSON data already and is shared, not copied (a journal is rewritten
        after every stage, so this runs often)."""
        data = {item.name: getattr(self, item.name) for item in fields(self)}
        data["metrics"] = encode_metrics(self.metrics, f"stage {self.stage!r}")
        data["artifact"] = relative_to_root(self.artifact, root)
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any], root: str | None = None) -> StageRecord:
        """Inverse of :meth:`to_json`; a relative artifact is resolved against ``root``."""
        return cls(
            **{
                **data,
                "artifact": resolve_in_root(data.get("artifact"), root),
                "metrics": decode_metrics(data.get("metrics", {})),
            }
        )


def relative_to_root(path: str | None, root: str | None) -> str | None:
    """``path`` relative to ``root`` when it lies below it, else unchanged.

    >>> relative_to_root("/r/step_1/reward", "/r"), relative_to_root("/other/x", "/r")
    ('step_1/reward', '/other/x')
    """
    if path is None or root is None:
        return path
    prefix = root.rstrip("/") + "/"
    return path[len(prefix) :] if path.startswith(prefix) else path


def resolve_in_root(path: str | None, root: str | None) -> str | None:
    """A journal's artifact name as a path: relative names are below ``root``; absolute paths
    and URLs (a re-run branch's reused parent artifacts, journals written before names were
    relative) stay as they are.

    >>> resolve_in_root("step_1/reward", "/r"), resolve_in_root("/p/step_1/x", "/r")
    ('/r/step_1/reward', '/p/step_1/x')
    """
    if path is None or root is None or path.startswith("/") or "://" in path:
        return path
    return f"{root.rstrip('/')}/{path}"


def lies_in(path: str, root: str) -> bool:
    """Whether ``path`` lies below ``root``, ``..`` segments applied; a local path also counts
    when it does once symbolic links are resolved (a run reached through a link).

    >>> lies_in("/r/step_1/x", "/r"), lies_in("/r/../etc/x", "/r"), lies_in("/rr/x", "/r")
    (True, False, False)
    """
    if ("://" in path) != ("://" in root):
        return False
    inside = posixpath.normpath(path).startswith(posixpath.normpath(root).rstrip("/") + "/")
    if inside or "://" in path:
        return inside
    return os.path.realpath(path).startswith(os.path.realpath(root).rstrip("/") + "/")


def stage_label(stage: str) -> str:
    """How an error names a stage's artifact: ``stage 'reward'``."""
    return f"stage {stage!r}"


def journal_paths(journal: StepJournal) -> list[tuple[str, str]]:
    """(what, path) of every artifact a journal names: the step input, then each stage's."""
    named = [("the step input", journal.input_artifact)]
    named += [(stage_label(record.stage), record.artifact) for record in journal.stages]
    return [(what, path) for what, path in named if path is not None]


@dataclass
class StepJournal:
    """The record of one step: its input artifact, every stage's record, the step's metrics.

    ``metrics`` holds the stages' metrics and ``timing_s/*`` while the step runs; the train flow
    replaces them with the step's full metrics (data, timing, throughput, ``training/*``) after
    it. ``weights``: role → weights fingerprint at the start of the step (flows/engines.py's
    lineage), which a re-run of the step needs for its cache keys. ``pruned``: the retention
    settings (``{"keep_last": K, "keep_every": N}``, flows/runs/retention.py) that removed the step's
    artifacts, None while they are kept.
    """

    step: int
    status: Literal["running", "done"] = "running"
    input_artifact: str | None = None
    input_fingerprint: str | None = None
    stages: list[StageRecord] = field(default_factory=list)
    metrics: dict[str, float] = field(default_factory=dict)
    weights: dict[str, str] = field(default_factory=dict)
    pruned: dict[str, int | None] | None = None

    def record(self, name: str) -> StageRecord:
        """The record of stage ``name``; ``KeyError`` listing the recorded stages otherwise."""
        for record in self.stages:
            if record.stage == name:
                return record
        raise KeyError(
            f"step {self.step} has no record of stage {name!r} "
            f"(recorded: {[r.stage for r in self.stages]})"
        )

    def to_json(self, root: str | None = None) -> dict[str, Any]:
        """JSON data; with ``root`` (the run directory), artifacts below it are named relative
        to it, so a copied or moved run directory is self-contained."""
        data = {
            "step": self.step,
            "status": self.status,
            "input_artifact": relative_to_root(self.input_artifact, root),
            "input_fingerprint": self.input_fingerprint,
            "stages": [record.to_json(root) for record in self.stages],
            "metrics": encode_metrics(self.metrics, f"step {self.step}"),
            "weights": dict(self.weights),
        }
        if self.pruned is not None:
            data["pruned"] = dict(self.pruned)
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any], root: str | None = None) -> StepJournal:
        """Inverse of :meth:`to_json`; relative artifact names are resolved against ``root``."""
        return cls(
            step=int(data["step"]),
            status=data["status"],
            input_artifact=resolve_in_root(data["input_artifact"], root),
            input_fingerprint=data["input_fingerprint"],
            stages=[StageRecord.from_json(record, root) for record in data["stages"]],
            metrics=decode_metrics(data["metrics"]),
            weights=dict(data.get("weights") or {}),
            pruned=data.get("pruned"),
        )


# --- the store ---------------------------------------------------------------------------------


def _default_cache_dir(url: str, local_root: str | None) -> Path:
    """``<root>/cache`` for a local run; for a remote run a local dir named after its URL."""
    if local_root is not None:
        return Path(local_root) / "cache"
    base = Path(os.environ.get("PREFECT_HOME") or Path.home() / ".prefect")
    return base / "ppoflow-cache" / hashlib.sha256(url.encode()).hexdigest()[:16]


class RunStore:
    """One run's directory (module docstring) on a local disk or an fsspec filesystem.

    Args:
        root: the run directory, a local path or an fsspec URL (``memory://run``, ``s3://b/run``).
        cache_dir: where Prefect keeps the stage-task cache records (small JSON records naming
            an ArtifactRef, flows/cache/records.py). It must be a local path (Prefect's result storage needs a persisted
            block for anything else). Default: ``<root>/cache`` for a local root; for a remote
            root, ``$PREFECT_HOME/ppoflow-cache/<sha256(url)[:16]>``. A re-run branch passes the
            parent run's ``cache_dir`` so it hits the parent's artifacts.
        parents: the run directories this run branched from, nearest first (a re-run branch's
            parent chain): a cache hit's artifact and a code manifest are looked for here after
            this run's own directory.
    """

    def __init__(
        self,
        root: str | os.PathLike,
        cache_dir: str | os.PathLike | None = None,
        parents: list[str] | tuple[str, ...] = (),
    ) -> None:
        url = os.fspath(root)
        self.fs, path = fsspec.core.url_to_fs(url)
        self.is_local = isinstance(self.fs, LocalFileSystem)
        self.root = os.path.abspath(path) if self.is_local else url.rstrip("/")
        self._fs_root = self.root if self.is_local else path.rstrip("/")
        self.cache_dir = (
            Path(cache_dir)
            if cache_dir is not None
            else (_default_cache_dir(self.root, self.root if self.is_local else None))
        )
        self.parents = [str(parent) for parent in parents]
        self._saved_code: set[str] = set()

    def __repr__(self) -> str:
        return f"RunStore({self.root!r}, cache_dir={str(self.cache_dir)!r})"

    # --- paths ---

    def step_dir(self, step: int) -> str:
        if not isinstance(step, int) or isinstance(step, bool) or step < 0:
            raise ValueError(f"step must be an int >= 0, got {step!r}")
        return f"{self.root}/step_{step}"

    def artifact_path(self, step: int, stage: str) -> str:
        """``<root>/step_<k>/<stage>``: where stage ``stage`` of step ``step`` keeps its delta."""
        if not _SEGMENT.fullmatch(stage) or stage == INPUT_NAME:
            raise ValueError(
                f"stage name {stage!r} cannot name an artifact folder; use letters, digits, "
                f"'_', '.', '-' (not starting with '.' or '-') and not {INPUT_NAME!r}"
            )
        return f"{self.step_dir(step)}/{stage}"

    def input_path(self, step: int) -> str:
        return f"{self.step_dir(step)}/{INPUT_NAME}"

    def steps(self) -> list[int]:
        """The steps that have a journal, in increasing order."""
        if not self.fs.exists(self._fs_root):
            return []
        found = []
        for entry in self.fs.ls(self._fs_root, detail=False):
            name = entry.rstrip("/").rsplit("/", 1)[-1]
            if re.fullmatch(r"step_\d+", name) and self.fs.exists(f"{entry}/{JOURNAL_FILE}"):
                found.append(int(name.removeprefix("step_")))
        return sorted(found)

    def remove_temp_files(self) -> list[str]:
        """Delete what interrupted writes left in a local run directory (``.tmp-*`` files of the
        journals and JSON records, ``.<stage>.tmp-*`` artifact folders in the step folders) and
        in the generation rounds' folders ``step_<k>/round_<r>`` (dynamic sampling), and in its
        cache directory (``.<key>.tmp-*`` files of the stage-task cache records and their
        ``refs/``); returns their paths. Call it only while holding the run's lock
        (flows/runs/lock.py): another writer's temporaries look the same."""
        if not self.is_local or not os.path.isdir(self.root):
            return []
        root, cache = Path(self.root), Path(self.cache_dir)
        found = [
            *root.glob(".tmp-*"),
            *root.glob("step_*/.tmp-*"),
            *root.glob("step_*/.*.tmp-*"),
            *root.glob("step_*/round_*/.tmp-*"),  # a generation round's (flows/gen_rounds.py)
            *root.glob("step_*/round_*/.*.tmp-*"),
            *cache.glob(".*.tmp-*"),
            *cache.glob("*/.*.tmp-*"),
        ]
        for path in found:
            if path.is_dir():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)
        return sorted(str(path) for path in found)

    # --- files ---

    def _fs_path(self, url: str) -> str:
        return url if self.is_local else self._fs_root + url[len(self.root) :]

    def _write_text(self, url: str, text: str) -> None:
        """Write ``text`` at ``url`` atomically on a local disk: a temp file ``.tmp-<name>-*``
        beside it, then ``os.replace``; a failed write (a full disk: its ``OSError`` names the
        temp file) removes the temp file and leaves the target as it was."""
        target = self._fs_path(url)
        if not self.is_local:
            self.fs.pipe_file(target, text.encode())
            return
        directory, name = os.path.split(target)
        os.makedirs(directory, exist_ok=True)
        handle, temp = tempfile.mkstemp(dir=directory, prefix=f".tmp-{name}-")
        try:
            with naming_failed_writes(temp), os.fdopen(handle, "w", encoding="utf-8") as out:
                out.write(text)
            os.replace(temp, target)
        except BaseException:  # a full disk included: the target keeps its old contents
            with suppress(FileNotFoundError):
                os.remove(temp)
            raise

    def _read_json(self, url: str, what: str) -> Any:
        target = self._fs_path(url)
        if not self.fs.exists(target):
            raise FileNotFoundError(f"{url}: no {what} (is {self.root!r} a ppoflow run directory?)")
        try:
            return json.loads(self.fs.cat_file(target))
        except json.JSONDecodeError as err:
            raise ValueError(
                f"{url}: the {what} is not valid JSON ({err.msg} at line {err.lineno} column "
                f"{err.colno}): the file is truncated or damaged"
            ) from None

    # --- contents ---

    def save_config(self, config: Any) -> str:
        """Write the resolved config (pydantic model or mapping) as ``<root>/config.json``."""
        url = f"{self.root}/{CONFIG_FILE}"
        self._write_text(url, json.dumps(jsonable(config, "config"), indent=1, sort_keys=True))
        return url

    def load_config(self) -> dict[str, Any]:
        """The config saved by :meth:`save_config`, as plain JSON data."""
        return self._read_json(f"{self.root}/{CONFIG_FILE}", "config.json")

    def save_run_info(self, info: dict[str, Any]) -> str:
        """Write ``info`` as ``<root>/run_info.json`` (replacing the file), atomically.

        ``info`` must hold :data:`RUN_INFO_REQUIRED` (``mlflow_run_id``, ``mlflow_tracking_uri``,
        ``mlflow_experiment``), each a string or None; other JSON keys are kept as given.

        Raises:
            ValueError: a required key is missing or not a string / None.
        """
        problems = [
            f"{key} is missing" if key not in info else f"{key} is {info[key]!r}"
            for key in RUN_INFO_REQUIRED
            if key not in info or not isinstance(info[key], str | None)
        ]
        if problems:
            raise ValueError(
                f"run_info for {self.root}: {'; '.join(problems)}; expected each of "
                f"{list(RUN_INFO_REQUIRED)} as a string or None"
            )
        return self.save_json(RUN_INFO_FILE, info)

    def load_run_info(self) -> dict[str, Any]:
        """The ``run_info.json`` written by :meth:`save_run_info`.

        Raises:
            FileNotFoundError: the run has none (not a run directory, or one written before
                run_info.json existed); ValueError: it is damaged or lacks a required key.
        """
        info = self._read_json(f"{self.root}/{RUN_INFO_FILE}", RUN_INFO_FILE)
        if not isinstance(info, dict):
            raise ValueError(
                f"{self.root}/{RUN_INFO_FILE} holds a {type(info).__name__}; expected an object"
            )
        missing = [key for key in RUN_INFO_REQUIRED if key not in info]
        if missing:
            raise ValueError(
                f"{self.root}/{RUN_INFO_FILE} lacks {missing} (it holds {sorted(info)}); "
                "it was not written by ppoflow train"
            )
        return info

    def save_json(self, name: str, data: Any) -> str:
        """Write ``data`` as ``<root>/<name>`` (one file name, e.g. ``rerun.json``), atomically."""
        if not _SEGMENT.fullmatch(name):
            raise ValueError(f"{name!r} is not a plain file name")
        url = f"{self.root}/{name}"
        self._write_text(url, json.dumps(jsonable(data, name), indent=1, sort_keys=True))
        return url

    def load_json(self, name: str) -> Any:
        """The JSON file ``<root>/<name>`` written by :meth:`save_json`."""
        return self._read_json(f"{self.root}/{name}", name)

    def exists(self, name: str) -> bool:
        """Whether ``<root>/<name>`` exists."""
        return bool(self.fs.exists(self._fs_path(f"{self.root}/{name}")))

    def save_input(self, step: int, batch: Any, digest: Digest = DEFAULT_DIGEST) -> ArtifactRef:
        """Write the step's input batch as the artifact ``step_<k>/input`` (replacing one there)
        with file digest ``digest`` (dataproto/fingerprint.py)."""
        return save_artifact(
            batch, self.input_path(step), stage=INPUT_NAME, overwrite=True, digest=digest
        )

    def write_journal(self, journal: StepJournal) -> str:
        url = f"{self.step_dir(journal.step)}/{JOURNAL_FILE}"
        self._write_text(url, json.dumps(journal.to_json(self.root), separators=(",", ":")))
        return url

    def read_journal(self, step: int) -> StepJournal:
        return StepJournal.from_json(
            self._read_json(f"{self.step_dir(step)}/{JOURNAL_FILE}", f"journal for step {step}"),
            self.root,
        )

    def check_journal_paths(
        self, journal: StepJournal, stages: list[str] | None = None
    ) -> StepJournal:
        """``journal`` (of this run) after checking that the artifacts it names (the step input
        and every stage's, or only those of ``stages``) lie in this run directory or, for a
        re-run branch, in a run it branched from (``rerun.json``: a branch reuses its parent's
        artifacts); the journal is returned, for chaining.

        Raises:
            ValueError: one line naming the journal, the stage and the path outside, e.g. a
                journal copied from another run or edited by hand.
        """
        roots = [self.root, *self.parents, *parent_chain(self.root)]
        named = journal_paths(journal)
        if stages is not None:
            wanted = {stage_label(stage) for stage in stages}
            named = [(what, path) for what, path in named if what in wanted]
        for what, path in named:
            if not any(lies_in(path, root) for root in roots):
                allowed = " or ".join(dict.fromkeys(roots))
                shown = path if "://" in path else posixpath.normpath(path)  # ".." applied
                raise ValueError(
                    f"{self.step_dir(journal.step)}/{JOURNAL_FILE}: {what} names the artifact "
                    f"{shown}, outside the run directory; a journal names artifacts in {allowed} "
                    "(as ppoflow writes it), so this journal was edited or copied from another "
                    "run: restore it, or re-run or inspect another step"
                )
        return journal

    def previous_journal(self, step: int) -> StepJournal | None:
        """The journal a step of an earlier training into this directory left (None if none, or
        unreadable: it only explains cache misses)."""
        try:
            return self.read_journal(step)
        except (FileNotFoundError, ValueError, KeyError, TypeError):
            return None

    # --- what a stage's artifact is looked up by ---

    def search_roots(self) -> list[str]:
        """Where a cache record's relative artifact name is looked for: this run, then the
        runs it branched from (a re-run branch hits its parent's artifacts)."""
        return [self.root, *self.parents]

    def relative(self, path: str) -> str:
        """``path`` relative to this run directory when it lies below it."""
        return relative_to_root(path, self.root) or path

    def candidates(self, name: str) -> list[str]:
        """The paths a cache record's artifact name may be at (:meth:`search_roots`)."""
        if name.startswith("/") or "://" in name:
            return [name]
        return [f"{root.rstrip('/')}/{name}" for root in self.search_roots()]

    # --- retention (flows/runs/retention.py) ---

    def remove_step_artifacts(self, step: int) -> list[str]:
        """Delete the artifact folders of step ``step`` (its input and every stage's delta),
        keeping its journal; returns their paths. On a local disk each folder is first renamed
        to ``.<name>.tmp-pruned`` beside it, so a process killed while deleting leaves only a
        temp folder that :meth:`remove_temp_files` removes, never a half artifact."""
        directory = self._fs_path(self.step_dir(step))
        if not self.fs.exists(directory):
            return []
        removed = []
        for entry in sorted(self.fs.ls(directory, detail=False)):
            name = entry.rstrip("/").rsplit("/", 1)[-1]
            if name == JOURNAL_FILE or name.startswith(".") or not self.fs.isdir(entry):
                continue
            if self.is_local:
                doomed = os.path.join(directory, f".{name}.tmp-pruned")
                os.replace(entry, doomed)
                shutil.rmtree(doomed)
            else:
                self.fs.rm(entry, recursive=True)
            removed.append(f"{self.step_dir(step)}/{name}")
        return removed

    def record_branch(self, branch_root: str, step: int) -> None:
        """Note in this machine's branch index (flows/runs/branches.py), not in this run, that
        the run directory ``branch_root`` re-ran step ``step`` of this run and of the runs it
        branched from (:attr:`parents`), so their retention keeps that step's artifacts.

        Raises:
            OSError: the index cannot be written.
        """
        note_branch(branch_root, step, [self.root, *self.parents])

    def branches(self) -> dict[str, int]:
        """Branch run directory → the step it re-ran, for the branches of this run that still
        exist: beside it, in this machine's branch index, or noted in ``branches/`` by an older
        ppoflow (flows/runs/branches.py).

        Raises:
            ValueError: a note is unreadable (named), so what it protects is unknown.
        """
        return find_branches(self.root)

    # --- code manifests (the files behind a stage's code fingerprint) ---

    def has_saved_code_manifest(self, fingerprint: str) -> bool:
        """Whether this store object wrote (or found) the manifest of ``fingerprint`` already."""
        return fingerprint in self._saved_code

    def save_code_manifest(self, fingerprint: str, files: dict[str, str]) -> None:
        """``<root>/code/<fingerprint>.json``: {file: digest} behind a code fingerprint, once."""
        if fingerprint in self._saved_code:
            return
        url = f"{self.root}/{CODE_DIR}/{fingerprint}.json"
        if not self.fs.exists(self._fs_path(url)):
            self._write_text(url, json.dumps(dict(sorted(files.items())), indent=0))
        self._saved_code.add(fingerprint)

    def code_manifest(self, fingerprint: str) -> dict[str, str] | None:
        """The files behind ``fingerprint`` from this run or a run it branched from."""
        for root in self.search_roots():
            url = f"{root.rstrip('/')}/{CODE_DIR}/{fingerprint}.json"
            try:
                fs, path = fsspec.core.url_to_fs(url)
                if fs.exists(path):
                    return json.loads(fs.cat_file(path))
            except (OSError, ValueError):
                continue
        return None
