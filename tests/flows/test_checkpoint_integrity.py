"""Run checkpoints have the artifacts' guarantees (stages/engines/checkpoint_manifest.py,
flows/runs/checkpoints.py): every file's role, size and BLAKE3 digest is in the step's manifest, written
after the files and before the tracker, and checked before anything is loaded.

Steps 1–3 of an actor (ZeRO 1) and a critic (ZeRO 2) engine of the tiny model are saved once per
module by ``save_run_checkpoint``; each test damages a copy. Refused, in one line naming the file
and what was expected, before any engine is touched: a flipped byte in the actor's weights or the
critic's optimizer state, a truncated file, a missing or added file, swapped step directories, a
missing manifest, a manifest naming paths outside the checkpoint, a pickle payload in any file kind
(even with the manifest re-signed: the files are read weights-only). ``resume_mode=auto`` falls
back to the newest valid step with one notice per step skipped; ``ppoflow export`` / ``validate``
(``ActorCheckpoint.at``) and ``ppoflow rerun`` (``role_builder``) check before they read.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from dataproto.fingerprint import digest_file
from flows.engines import InProcessRole
from flows.export import ActorCheckpoint
from flows.runs import checkpoints
from flows.runs.checkpoints import (
    load_run_checkpoint,
    read_run_state,
    restore_run_checkpoint,
    resume_checkpoint,
    save_run_checkpoint,
)
from stages.engines.checkpoint import LATEST_FILE, write_latest_step
from stages.engines.checkpoint_manifest import (
    STEP_MANIFEST,
    CheckpointIntegrityError,
    seal_legacy_checkpoint,
    verify_checkpoint,
    write_step_manifest,
)
from stages.engines.critic import ValueModel
from stages.engines.deepspeed_setup import EngineSettings, initialize_engine
from stages.engines.logprob import ResponseLogProbModel
from stages.engines.models import load_causal_lm, load_value_model
from stages.engines.roles import _CheckpointMixin

KEEP_ALL = SimpleNamespace(max_actor_ckpt_to_keep=None, max_critic_ckpt_to_keep=None)
ACTOR_WEIGHTS = "actor/state/mp_rank_00_model_states.pt"


class Holder(_CheckpointMixin):
    """A role worker reduced to its checkpoint methods."""

    def __init__(self, engine) -> None:
        self.engine = engine


class Untouchable:
    """An engine role that fails the test if a load reaches it."""

    def call_all(self, method: str, **kwargs):
        raise AssertionError(f"{method} was called: the checkpoint was not refused first")


@pytest.fixture(scope="module")
def engines(tmp_path_factory) -> dict:
    from stages.data import make_tiny_model

    base = make_tiny_model(tmp_path_factory.mktemp("base") / "model")
    torch.manual_seed(0)
    actor = initialize_engine(
        ResponseLogProbModel(load_causal_lm(base)), EngineSettings(zero_stage=1, lr=1e-2)
    )
    critic = initialize_engine(
        ValueModel(load_value_model(base)), EngineSettings(zero_stage=2, lr=1e-2)
    )
    return {"actor": InProcessRole(Holder(actor)), "critic": InProcessRole(Holder(critic))}


@pytest.fixture(scope="module")
def pristine(tmp_path_factory, engines) -> Path:
    """Checkpoints of steps 1–3 (actor and critic) and the tracker naming step 3."""
    root = tmp_path_factory.mktemp("pristine") / "ckpt"
    for step in (1, 2, 3):
        state = {"loader": {"position": 4 * step}, "kl_ctrl": None, "weights_lineage": {}}
        save_run_checkpoint(root, step, engines, state, KEEP_ALL)
    return root


@pytest.fixture
def root(pristine, tmp_path) -> Path:
    """A copy of :func:`pristine` to damage."""
    return Path(shutil.copytree(pristine, tmp_path / "ckpt"))


def untouchable() -> dict:
    return {"actor": Untouchable(), "critic": Untouchable()}


def auto(root: Path, mode: str = "auto", path: Path | None = None) -> SimpleNamespace:
    return SimpleNamespace(
        resume_mode=mode, default_local_dir=str(root), resume_from_path=path and str(path)
    )


def flip_byte(file: Path, at: float = 0.5) -> None:
    data = bytearray(file.read_bytes())
    data[int(len(data) * at)] ^= 0xFF
    file.write_bytes(bytes(data))


def refusal(root: Path, step: int, verify: str = "full") -> str:
    """The one line ``load_run_checkpoint`` refuses with (no engine is reached)."""
    with pytest.raises(CheckpointIntegrityError) as refused:
        load_run_checkpoint(root, step, untouchable(), verify=verify)
    line = str(refused.value)
    assert "\n" not in line
    return line


# --- what a save writes -------------------------------------------------------------------------


def test_the_manifest_lists_every_file_with_role_size_and_digest(root):
    manifest = json.loads((root / "global_step_3" / STEP_MANIFEST).read_text())
    assert manifest["step"] == 3 and manifest["digest"] == "blake3"
    listed = {entry["path"]: entry for entry in manifest["files"]}
    on_disk = {
        p.relative_to(root / "global_step_3").as_posix()
        for p in (root / "global_step_3").rglob("*")
        if p.is_file() and p.name != STEP_MANIFEST
    }
    assert set(listed) == on_disk
    assert {"data/state.json", "actor/rng_state_rank0.pt", "critic/lr_scheduler.pt"} <= on_disk
    assert any(path.startswith("critic/state/") and "optim_states" in path for path in listed)
    for path, entry in listed.items():
        assert entry["role"] == path.split("/")[0]
        digest, size = digest_file(str(root / "global_step_3" / path), "blake3")
        assert (entry["bytes"], entry["blake3"]) == (size, digest)
    client = json.loads((root / "global_step_3" / "critic" / "client_state.json").read_text())
    assert client == {"global_step": 3, "role": "critic"}


def test_the_manifest_is_written_after_the_files_and_before_the_tracker(
    engines, tmp_path, monkeypatch
):
    order = []
    for name in ("_write_json", "write_step_manifest", "write_latest_step"):
        real = getattr(checkpoints, name)
        monkeypatch.setattr(
            checkpoints, name, lambda *a, _real=real, _name=name: (order.append(_name), _real(*a))
        )
    save_run_checkpoint(tmp_path / "ckpt", 1, {"actor": engines["actor"]}, {}, KEEP_ALL)
    assert order == ["_write_json", "write_step_manifest", "write_latest_step"]
    assert not [p for p in (tmp_path / "ckpt" / "global_step_1").iterdir() if p.name[0] == "."]


def test_a_step_saved_again_is_incomplete_until_its_new_manifest(root, engines, monkeypatch):
    def fail(**kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(engines["critic"].worker, "save_checkpoint", fail)
    with pytest.raises(OSError, match="disk full"):
        save_run_checkpoint(root, 3, engines, {}, KEEP_ALL)
    assert f"no {STEP_MANIFEST}" in refusal(root, 3)  # never the old manifest over new files


def test_a_round_trip_loads_the_checked_step(root, engines):
    for verify in ("full", "fast"):
        state = load_run_checkpoint(root, 3, engines, verify=verify)
        assert state["global_step"] == 3 and state["loader"] == {"position": 12}
    assert read_run_state(root, 2)["loader"] == {"position": 8}


# --- damage ---------------------------------------------------------------------------------------


def test_a_flipped_byte_in_the_actor_weights_is_refused_naming_the_file(root):
    flip_byte(root / "global_step_3" / ACTOR_WEIGHTS)
    line = refusal(root, 3)
    assert f"global_step_3/{ACTOR_WEIGHTS}: BLAKE3 digest" in line
    assert "differs from the manifest's" in line and "(file altered or damaged)" in line
    verify_checkpoint(root, 3, verify="fast")  # the documented limit: fast mode checks sizes


def test_a_flipped_byte_in_the_critic_optimizer_state_is_one_line(root, engines):
    (optim,) = (root / "global_step_3" / "critic" / "state").glob("*optim_states.pt")
    flip_byte(optim, at=0.01)
    with pytest.raises(CheckpointIntegrityError, match=rf"{optim.name}: BLAKE3 digest"):
        load_run_checkpoint(root, 3, engines)


def test_a_truncated_file_is_refused_before_torch_reads_it(root):
    weights = root / "global_step_3" / ACTOR_WEIGHTS
    size = weights.stat().st_size
    os.truncate(weights, size // 2)
    for verify in ("full", "fast"):
        line = refusal(root, 3, verify)
        assert f"{ACTOR_WEIGHTS}: {size // 2} bytes, {STEP_MANIFEST} says {size}" in line
        assert "(truncated or altered)" in line


def test_missing_and_added_files_are_refused(root):
    rng = root / "global_step_3" / "critic" / "rng_state_rank0.pt"
    rng.unlink()
    assert "critic/rng_state_rank0.pt: missing (listed in" in refusal(root, 3, "fast")
    (root / "global_step_2" / "actor" / "state" / "extra.pt").write_bytes(b"x")
    line = refusal(root, 2, "fast")
    assert "actor/state/extra.pt: not listed in" in line and "added after the save" in line


def test_swapped_step_directories_are_refused(root):
    step3 = root / "global_step_3"
    shutil.rmtree(step3 / "actor")
    shutil.copytree(root / "global_step_2" / "actor", step3 / "actor")  # step 2's actor in step 3
    for verify in ("full", "fast"):
        line = refusal(root, 3, verify)
        assert "global_step_3/actor/client_state.json: records step 2" in line
        assert "moved in from another step" in line
    shutil.rmtree(step3)
    os.rename(root / "global_step_2", step3)  # the whole step 2, manifest and all, as step 3
    line = refusal(root, 3, "fast")
    assert f"{STEP_MANIFEST}: records step 2, but it is the manifest of global_step_3" in line


def test_a_missing_manifest_is_refused_with_how_to_proceed(root, engines):
    (root / "global_step_3" / STEP_MANIFEST).unlink()  # or: written before manifests existed
    line = refusal(root, 3)
    assert f"global_step_3: no {STEP_MANIFEST}, so its files cannot be checked" in line
    assert f"python -m stages.engines.checkpoint_manifest {root}/global_step_3" in line
    with pytest.raises(CheckpointIntegrityError, match=f"no {STEP_MANIFEST}"):
        read_run_state(root, 3)
    seal_legacy_checkpoint(root / "global_step_3")  # the way forward for a trusted checkpoint
    assert load_run_checkpoint(root, 3, engines)["global_step"] == 3
    with pytest.raises(ValueError, match=r"has a checkpoint_manifest\.json already"):
        seal_legacy_checkpoint(root / "global_step_3")


@pytest.mark.parametrize(
    "path",
    [
        "../../../../etc/passwd",
        "/etc/passwd",
        "actor/../../x",
        "actor/.hidden",
        "actor",
        "actor\\x",
    ],
)
def test_a_manifest_naming_paths_outside_the_checkpoint_is_refused(root, path):
    manifest_file = root / "global_step_3" / STEP_MANIFEST
    manifest = json.loads(manifest_file.read_text())
    manifest["files"].append({"role": "actor", "path": path, "bytes": 1, "blake3": "0" * 64})
    manifest_file.write_text(json.dumps(manifest))
    assert f"path {path!r} is not a plain relative path inside" in refusal(root, 3, "fast")


def test_a_link_out_of_the_checkpoint_is_refused(root, tmp_path):
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "secret").write_text("x")
    (root / "global_step_3" / "actor" / "link").symlink_to(tmp_path / "outside")
    manifest_file = root / "global_step_3" / STEP_MANIFEST
    manifest = json.loads(manifest_file.read_text())
    entry = {"role": "actor", "path": "actor/link/secret", "bytes": 1, "blake3": "0" * 64}
    manifest_file.write_text(json.dumps({**manifest, "files": [*manifest["files"], entry]}))
    assert "'actor/link/secret' is not a plain relative path inside" in refusal(root, 3, "fast")


def test_a_role_recorded_under_another_directory_is_refused(root):
    manifest_file = root / "global_step_3" / STEP_MANIFEST
    manifest = json.loads(manifest_file.read_text())
    manifest["files"][0]["role"] = "critic"
    manifest_file.write_text(json.dumps(manifest))
    line = refusal(root, 3, "fast")
    assert f"{manifest['files'][0]['path']!r} is recorded as role 'critic'" in line


def test_a_role_the_run_needs_but_the_step_lacks_is_named(root, engines, tmp_path):
    save_run_checkpoint(tmp_path / "actor-only", 1, {"actor": engines["actor"]}, {}, KEEP_ALL)
    with pytest.raises(CheckpointIntegrityError, match="lists no critic files"):
        load_run_checkpoint(tmp_path / "actor-only", 1, untouchable())
    checked, _ = resume_checkpoint(auto(tmp_path / "actor-only"))
    with pytest.raises(CheckpointIntegrityError, match=r"needs its \['critic'\] files"):
        restore_run_checkpoint(checked, untouchable())


# --- pickle payloads ------------------------------------------------------------------------------


class Trap:
    """Unpickled, this creates the file ``marker``: a hostile checkpoint's payload."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


@pytest.mark.parametrize(
    "kind",
    [
        ACTOR_WEIGHTS,
        "critic/state/*optim_states.pt",
        "actor/lr_scheduler.pt",
        "critic/rng_state_rank0.pt",
        "data/state.json",
    ],
)
def test_a_pickle_payload_in_any_file_kind_never_runs(root, engines, tmp_path, kind):
    """Whoever plants the payload re-signs the manifest too: the digests pass, the weights-only
    reads refuse it."""
    (file,) = (root / "global_step_3").glob(kind)
    marker = tmp_path / "code-ran"
    if file.suffix == ".json":
        file.write_bytes(pickle.dumps(Trap(marker)))
        expected = rf"{file.name}: unreadable JSON"
    else:
        state = torch.load(file, weights_only=False)
        state["ppoflow_test_trap"] = Trap(marker)
        torch.save(state, file)
        expected = rf"refusing to read \S*{file.name}: it names io\.open"
    write_step_manifest(root, 3, ["actor", "critic", "data"])
    with pytest.raises(CheckpointIntegrityError, match=expected):
        load_run_checkpoint(root, 3, engines)
    assert not marker.exists()


# --- resume_mode=auto -----------------------------------------------------------------------------


def test_auto_resume_falls_back_to_the_newest_valid_step_and_says_why(root, engines):
    shutil.copytree(root / "global_step_3", root / "global_step_4")  # saved, tracker not yet
    flip_byte(root / "global_step_3" / ACTOR_WEIGHTS)
    checked, notices = resume_checkpoint(auto(root))
    assert (checked.root, checked.step, checked.verify) == (root, 2, "full")
    assert checked.roles == ("actor", "critic", "data")
    assert len(notices) == 2
    assert notices[0].startswith("skipped the checkpoint of step 4 under")
    assert "newer than the tracker's step 3 (its save did not finish)" in notices[0]
    assert notices[1].startswith("skipped the checkpoint of step 3: checkpoint ")
    assert f"global_step_3/{ACTOR_WEIGHTS}: BLAKE3 digest" in notices[1]
    assert restore_run_checkpoint(checked, engines)["global_step"] == 2


def test_auto_resume_without_a_valid_step_is_one_error_listing_each(root):
    for step in (1, 2, 3):
        (root / f"global_step_{step}" / STEP_MANIFEST).unlink()
    with pytest.raises(CheckpointIntegrityError) as refused:
        resume_checkpoint(auto(root))
    line = str(refused.value)
    assert line.startswith(f"no checkpoint under {root} passes its check")
    assert all(f"skipped the checkpoint of step {step}" in line for step in (1, 2, 3))
    assert "start fresh with trainer.resume_mode=disable" in line and "\n" not in line


def test_resume_modes_without_fallback(root):
    assert resume_checkpoint(auto(root, "disable")) == (None, [])
    (root / LATEST_FILE).unlink()
    assert resume_checkpoint(auto(root)) == (None, [])  # no tracker: a fresh start, as before
    write_latest_step(root, 3)
    flip_byte(root / "global_step_3" / ACTOR_WEIGHTS)
    explicit = auto(root, "resume_path", root / "global_step_3")
    with pytest.raises(CheckpointIntegrityError, match="BLAKE3 digest"):
        resume_checkpoint(explicit)  # a step the user named is never replaced by another
    checked, notices = resume_checkpoint(auto(root, "resume_path", root / "global_step_2"))
    assert checked.step == 2 and notices == []


# --- export, validate and rerun check first -------------------------------------------------------


def test_export_and_validate_check_the_actor_before_reading_it(root):
    flip_byte(root / "global_step_3" / ACTOR_WEIGHTS)
    with pytest.raises(CheckpointIntegrityError, match=rf"{ACTOR_WEIGHTS}: BLAKE3 digest"):
        ActorCheckpoint.at(root / "global_step_3")
    assert ActorCheckpoint.at(root / "global_step_3", verify="fast").step == 3
    flip_byte(root / "global_step_2" / "critic" / "lr_scheduler.pt")  # not the actor's
    assert ActorCheckpoint.at(root / "global_step_2" / "actor").zero_stage == 1


def test_rerun_checks_the_role_before_building_its_engine(root, monkeypatch):
    from flows import rerun
    from stages.config import load_config

    cfg = load_config(None, [f"trainer.default_local_dir={root}", "trainer.device=cpu"])
    monkeypatch.setattr(rerun, "build_role", lambda *a: pytest.fail("the engine was built"))
    flip_byte(root / "global_step_3" / ACTOR_WEIGHTS)
    with pytest.raises(CheckpointIntegrityError, match=rf"{ACTOR_WEIGHTS}: BLAKE3 digest"):
        rerun.role_builder(cfg, "actor", 4, lambda: 4)()
