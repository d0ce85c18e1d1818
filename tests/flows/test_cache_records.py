"""Stage cache records (flows/cache/records.py): JSON on disk, and never a decoded planted record.

Each planted record below carries a payload that creates the file ``marker`` when Prefect's own
reader decodes it (a pickle whose ``__reduce__`` opens the file, or a class that Prefect's JSON
object decoder imports and builds). The first tests show that Prefect does decode them, whatever
serializer the task configures; the rest show that through ppoflow's storage, on a stage task's
re-run and on the re-run branch path, the marker is never created, the stage is recomputed with
one warning naming the file, and the record is replaced.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path

import cloudpickle
import pytest
from prefect.filesystems import LocalFileSystem
from prefect.results import ResultRecord, ResultRecordMetadata, ResultStore
from prefect.serializers import CompressedPickleSerializer, JSONSerializer, PickleSerializer

from dataproto.artifact import ArtifactRef
from flows.cache.records import (
    REFS_DIR,
    ArtifactRefSerializer,
    CacheRecordError,
    CacheRecordStorage,
    decode_ref,
    record_problem,
)
from flows.rerun import open_branch
from flows.runs.store import RunStore
from flows.stage_task import stage_task
from flows.step_flow import run_step

WEIGHTS = {"score": "weights-v0"}
ENABLED = ("produce", "double", "score", "total")
FINGERPRINT = "ab" * 32


class Trap:
    """Unpickled, this creates the file ``marker``: the stand-in for a hostile payload."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


@dataclass
class TrapClass:
    """Built by Prefect's JSON object decoder from ``{"__class__": <this class>, "data": ...}``,
    this creates the file ``marker``."""

    marker: str

    def __post_init__(self) -> None:
        Path(self.marker).write_text("ran")


# --- planted records ---------------------------------------------------------------------------


def _one_file(serializer, obj, file: Path) -> bytes:
    """Prefect's single-file result record (what ppoflow wrote before, Prefect's default)."""
    metadata = ResultRecordMetadata(serializer=serializer, storage_key=str(file))
    return ResultRecord(metadata=metadata, result=obj).serialize()


def _metadata(serializer, ref_file: Path) -> bytes:
    return ResultRecordMetadata(serializer=serializer, storage_key=str(ref_file)).dump_bytes()


def plant(cache: Path, key: str, kind: str, marker: Path) -> None:
    """Write the planted record ``kind`` for ``key`` (``PLANTS``)."""
    record, ref = cache / key, cache / REFS_DIR / key
    ref.parent.mkdir(parents=True, exist_ok=True)
    trap, pickled = Trap(marker), PickleSerializer().dumps(Trap(marker))
    ours = ArtifactRefSerializer()
    if kind == "pickle record":
        record.write_bytes(_one_file(PickleSerializer(), trap, record))
    elif kind == "pickle record, split":
        record.write_bytes(_metadata(PickleSerializer(), ref))
        ref.write_bytes(pickled)
    elif kind == "compressed pickle record":
        record.write_bytes(_one_file(CompressedPickleSerializer(), trap, record))
    elif kind == "Prefect 2 pickle blob":
        blob = {"serializer": {"type": "pickle", "picklelib": "cloudpickle"}, "data": ""}
        blob["data"] = pickled.decode()
        record.write_text(json.dumps({**blob, "prefect_version": "2.20.0"}))
    elif kind == "raw pickle":
        record.write_bytes(cloudpickle.dumps(trap))
    elif kind == "JSON with an object to import":
        record.write_bytes(_metadata(JSONSerializer(), ref))
        name = f"{TrapClass.__module__}.{TrapClass.__qualname__}"
        ref.write_text(json.dumps({"__class__": name, "data": {"marker": str(marker)}}))
    elif kind == "ppoflow's serializer with a picklelib":
        metadata = json.loads(_metadata(ours, ref))
        metadata["serializer"]["picklelib"] = "cloudpickle"
        record.write_text(json.dumps(metadata))
        ref.write_bytes(pickled)
    elif kind == "two serializer keys":
        text = _metadata(ours, ref).decode()
        pickle_one = '"serializer":{"type":"pickle","picklelib":"cloudpickle"},'
        record.write_text(text.replace('"serializer":', pickle_one + '"serializer":', 1))
        ref.write_bytes(pickled)
    elif kind == "ppoflow's record, a pickle record as its reference":
        record.write_bytes(_metadata(ours, ref))
        ref.write_bytes(_one_file(PickleSerializer(), trap, ref))
    else:
        raise KeyError(kind)


#: planted kind → (what the refusal says, whether Prefect's own reader runs its payload)
PLANTS = {
    "pickle record": ("serializer 'pickle' is not ppoflow's JSON record", True),
    "pickle record, split": ("serializer 'pickle' is not ppoflow's JSON record", True),
    "compressed pickle record": ("serializer 'compressed/pickle' is not ppoflow's", True),
    "Prefect 2 pickle blob": ("serializer 'pickle' is not ppoflow's JSON record", True),
    "raw pickle": ("not JSON, or garbled or truncated", False),
    "JSON with an object to import": ("serializer 'json' is not ppoflow's JSON record", True),
    "ppoflow's serializer with a picklelib": ("fields ppoflow never writes ['picklelib']", False),
    "two serializer keys": ("its reference", False),
    "ppoflow's record, a pickle record as its reference": ("not an artifact reference", False),
}


def prefects_own_store(cache: Path, kind: str) -> ResultStore:
    """A Prefect result store with ppoflow's serializer but Prefect's plain local storage."""
    if kind in ("pickle record, split", "JSON with an object to import"):
        refs = LocalFileSystem(basepath=str(cache / REFS_DIR))
        metadata = LocalFileSystem(basepath=str(cache))
        return ResultStore(
            result_storage=refs, metadata_storage=metadata, serializer=ArtifactRefSerializer()
        )
    return ResultStore(
        result_storage=LocalFileSystem(basepath=str(cache)), serializer=ArtifactRefSerializer()
    )


def ppoflows_store(cache: Path, toy_stages) -> ResultStore:
    """The result store Prefect builds for a stage task whose records are in ``cache``."""
    return ResultStore().update_for_task(stage_task(toy_stages[0], cache), _sync=True)


# --- the format --------------------------------------------------------------------------------


def test_the_serializer_round_trips_a_reference_and_reads_nothing_else():
    serializer, ref = ArtifactRefSerializer(), ArtifactRef("step_1/reward", FINGERPRINT, 8, 4096)
    assert json.loads(serializer.dumps(ref)) == {
        "fingerprint": FINGERPRINT,
        "nbytes": 4096,
        "path": "step_1/reward",
        "rows": 8,
    }
    assert serializer.loads(serializer.dumps(ref)) == ref
    failure = serializer.dumps(ValueError("boom"))  # Prefect stores a failed task's exception
    assert json.loads(failure) == {"error": "ValueError", "message": "boom"}
    with pytest.raises(ValueError, match="not an artifact reference"):
        serializer.loads(failure)
    with pytest.raises(TypeError, match="returns an ArtifactRef; got dict"):
        serializer.dumps({"path": "x"})
    good = json.loads(serializer.dumps(ref))
    for field, bad in [
        ("rows", True),
        ("rows", -1),
        ("nbytes", 1.5),
        ("fingerprint", "AB" * 32),
        ("path", ""),
        ("path", None),
    ]:
        with pytest.raises(ValueError, match=field):
            decode_ref({**good, field: bad})
    with pytest.raises(ValueError, match=r"got \['extra', 'fingerprint'"):
        decode_ref({**good, "extra": 1})


def test_record_writes_are_atomic_and_leave_no_temp_files(tmp_path):
    storage = CacheRecordStorage(basepath=str(tmp_path))
    storage.write_path("k", b"old")
    with pytest.raises(TypeError):
        storage.write_path("k", "not bytes")  # fails inside the write
    assert (tmp_path / "k").read_bytes() == b"old"
    storage.write_path(str(tmp_path / "k"), b"new")
    assert [p.name for p in tmp_path.iterdir()] == ["k"] and (tmp_path / "k").read_bytes() == b"new"


# --- planted records: Prefect's reader runs them, ppoflow's never ------------------------------


@pytest.mark.parametrize("kind", [kind for kind, (_, live) in PLANTS.items() if live])
def test_prefects_own_reader_runs_a_planted_record_whatever_the_task_configures(tmp_path, kind):
    """Why ppoflow reads records itself: with ppoflow's serializer configured, Prefect's store
    still decodes with the serializer the record names (this is Prefect 3.9's behaviour)."""
    cache, marker = tmp_path / "cache", tmp_path / "code-ran"
    plant(cache, "k" * 64, kind, marker)
    store = prefects_own_store(cache, kind)
    with suppress(Exception):
        store.exists("k" * 64)
        store.read("k" * 64)
    assert marker.exists()


@pytest.mark.usefixtures("prefect_harness")  # Prefect resolves the task's storage with a client
@pytest.mark.parametrize("kind", list(PLANTS))
def test_a_stage_tasks_lookup_never_decodes_a_planted_record(tmp_path, toy_stages, kind):
    cache, marker, key = tmp_path / "cache", tmp_path / "code-ran", "k" * 64
    plant(cache, key, kind, marker)
    store = ppoflows_store(cache, toy_stages)
    assert store.exists(key) is False  # Prefect's cache lookup: a miss
    with pytest.raises(CacheRecordError) as refused:
        store.read(key)
    problem, _ = PLANTS[kind]
    assert str(refused.value).startswith(f"cache record {(cache / key).resolve()}: ")
    assert problem in str(refused.value) and record_problem(cache, key) == str(refused.value)
    assert not marker.exists()


def test_the_refusal_of_an_old_pickled_record_is_one_line_naming_the_file(tmp_path):
    cache, key = tmp_path / "cache", "k" * 64
    plant(cache, key, "pickle record", tmp_path / "code-ran")
    line = record_problem(cache, key)
    assert line == f"cache record {cache / key}: serializer 'pickle' is not ppoflow's JSON record"
    assert record_problem(cache, "absent") is None


# --- through the step flow ---------------------------------------------------------------------


@pytest.fixture
def warnings():
    """The warning lines logged while a step runs (Prefect's run loggers do not propagate)."""
    lines: list[str] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: lines.append(record.getMessage())
    loggers = [logging.getLogger(name) for name in ("prefect.flow_runs", "flows.stage_task")]
    for logger in loggers:
        logger.addHandler(handler)
    yield lines
    for logger in loggers:
        logger.removeHandler(handler)


def first_step(root: Path, stages, batch, ctx) -> tuple[RunStore, dict[str, str]]:
    """Step 1 of a fresh run in ``root``; the store and each enabled stage's cache key."""
    store = RunStore(root)
    result = run_step(stages, batch, ctx, store, 1, weights_fingerprints=WEIGHTS)
    return store, {record.stage: record.cache_key for record in result.records if record.cache_key}


def step_again(store: RunStore, stages, batch, ctx):
    """Step 1 again into ``store``'s directory, as a new process would see it (a new store)."""
    return run_step(stages, batch, ctx, RunStore(store.root), 1, weights_fingerprints=WEIGHTS)


def assert_recomputed_and_replaced(
    result, store: RunStore, planted: dict[str, Callable[[str], bool]], warned: list[str]
) -> None:
    """Every planted stage ran again, said why, warned once naming its file, and its record is
    a good one again; every other stage was a cache hit."""
    records = {record.stage: record for record in result.records}
    for stage in ENABLED:
        record = records[stage]
        file = (store.cache_dir / record.cache_key).resolve()
        if stage not in planted:
            assert record.status == "cached", record.reason
            continue
        assert record.status == "ran" and record.reason.startswith(
            f"recomputed: cache record {file}: "
        )
        assert planted[stage](record.reason), record.reason
        lines = [line for line in warned if str(file) in line]
        assert len(lines) == 1 and lines[0].startswith(f"stage {stage!r}: cache record {file}: ")
        assert lines[0].endswith(
            "it was not decoded: recomputing the stage, which replaces the record"
        )
        assert record_problem(store.cache_dir, record.cache_key) is None
        ref = json.loads((store.cache_dir / REFS_DIR / record.cache_key).read_text())
        assert ref == {
            "fingerprint": record.fingerprint,
            "nbytes": record.nbytes,
            "path": f"step_1/{stage}",
            "rows": record.rows,
        }


@pytest.mark.usefixtures("prefect_harness")
def test_the_records_on_disk_are_json_and_an_identical_step_hits_them(
    tmp_path, toy_stages, toy_batch, toy_ctx, calls
):
    store, keys = first_step(tmp_path / "run", toy_stages, toy_batch, toy_ctx)
    journal = {record.stage: record for record in store.read_journal(1).stages}
    for stage, key in keys.items():
        metadata = json.loads((store.cache_dir / key).read_text())
        assert metadata["serializer"] == {"type": "ppoflow-artifact-ref"}
        ref = json.loads((store.cache_dir / REFS_DIR / key).read_text())
        assert ref == {
            "fingerprint": journal[stage].fingerprint,
            "nbytes": journal[stage].nbytes,
            "path": f"step_1/{stage}",
            "rows": 4,
        }
    again = step_again(store, toy_stages, toy_batch, toy_ctx)
    assert {r.stage: r.status for r in again.records if r.cache_key} == dict.fromkeys(
        ENABLED, "cached"
    )
    assert dict(calls) == dict.fromkeys(ENABLED, 1)


@pytest.mark.usefixtures("prefect_harness")
@pytest.mark.parametrize(
    "kinds",
    [
        ("pickle record", "pickle record, split", "Prefect 2 pickle blob", "raw pickle"),
        (
            "compressed pickle record",
            "JSON with an object to import",
            "two serializer keys",
            "ppoflow's record, a pickle record as its reference",
        ),
    ],
    ids=["pickles", "others"],
)
def test_a_planted_record_never_runs_on_a_stage_tasks_rerun(
    tmp_path, toy_stages, toy_batch, toy_ctx, calls, warnings, kinds
):
    store, keys = first_step(tmp_path / "run", toy_stages, toy_batch, toy_ctx)
    marker = tmp_path / "code-ran"
    for stage, kind in zip(ENABLED, kinds, strict=True):
        plant(store.cache_dir, keys[stage], kind, marker)
    rerun = step_again(store, toy_stages, toy_batch, toy_ctx)
    assert not marker.exists()
    planted = {
        stage: (lambda reason, kind=kind: PLANTS[kind][0] in reason)
        for stage, kind in zip(ENABLED, kinds, strict=True)
    }
    assert_recomputed_and_replaced(rerun, store, planted, warnings)
    assert dict(calls) == dict.fromkeys(ENABLED, 2)


@pytest.mark.usefixtures("prefect_harness")
def test_a_planted_record_never_runs_on_the_rerun_branch_path(
    tmp_path, toy_stages, toy_batch, toy_ctx, calls, warnings
):
    """``ppoflow rerun`` copies the parent's cache records into the branch (``open_branch``) and
    runs the step there: the planted parent record is refused, the branch recomputes."""
    parent, keys = first_step(tmp_path / "run", toy_stages, toy_batch, toy_ctx)
    marker = tmp_path / "code-ran"
    plant(parent.cache_dir, keys["double"], "pickle record", marker)
    planted_bytes = (parent.cache_dir / keys["double"]).read_bytes()
    branch = open_branch(parent, toy_ctx.config, str(tmp_path / "branch"), {"parent": "run"})
    rerun = run_step(toy_stages, toy_batch, toy_ctx, branch, 1, weights_fingerprints=WEIGHTS)
    assert not marker.exists()
    serializer = {"double": lambda reason: "serializer 'pickle'" in reason}
    assert_recomputed_and_replaced(rerun, branch, serializer, warnings)
    assert (parent.cache_dir / keys["double"]).read_bytes() == planted_bytes  # only read


@pytest.mark.usefixtures("prefect_harness")
def test_a_garbled_or_truncated_record_is_recomputed_with_a_warning(
    tmp_path, toy_stages, toy_batch, toy_ctx, calls, warnings
):
    store, keys = first_step(tmp_path / "run", toy_stages, toy_batch, toy_ctx)
    record = store.cache_dir / keys["produce"]
    record.write_bytes(record.read_bytes()[:40])  # truncated: a write killed half way
    ref = store.cache_dir / REFS_DIR / keys["score"]
    ref.write_text(ref.read_text().replace('"rows": 4', '"rows": "4"'))  # a hand edit
    (store.cache_dir / REFS_DIR / keys["total"]).unlink()  # the reference is gone
    rerun = step_again(store, toy_stages, toy_batch, toy_ctx)
    assert_recomputed_and_replaced(
        rerun,
        store,
        {
            "produce": lambda reason: "not JSON, or garbled or truncated (" in reason,
            "score": lambda reason: "the reference's rows '4' is not a count" in reason,
            "total": lambda reason: "its reference" in reason and "missing" in reason,
        },
        warnings,
    )
    assert dict(calls) == {"produce": 2, "double": 1, "score": 2, "total": 2}
