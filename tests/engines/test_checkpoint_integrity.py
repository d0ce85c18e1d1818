"""Engine checkpoints are read without running code from them (stages/engines/safe_load.py).

A pickle payload (an object whose ``__reduce__`` creates a marker file) planted in any torch file
of an engine checkpoint — DeepSpeed's model states and optimizer states under ZeRO 0–3, the LR
schedule, the RNG states — is refused with one line naming the file and the global, and the
marker is never written; DeepSpeed's own failures on a damaged optimizer state are one line, not a
bare ``StopIteration``. Files written by a Python that pickles enum members by name (CPython
3.11.2, Debian bookworm's) load, and that ``getattr`` builds nothing else. The digests of the step manifest are tested in
tests/flows/test_checkpoint_integrity.py.
"""

from __future__ import annotations

import enum
import pickle
import re
from pathlib import Path

import pytest
import torch

from stages.engines.checkpoint import load_engine_checkpoint, save_engine_checkpoint
from stages.engines.checkpoint_manifest import CheckpointIntegrityError
from stages.engines.critic import ValueModel
from stages.engines.deepspeed_setup import EngineSettings, initialize_engine
from stages.engines.logprob import ResponseLogProbModel
from stages.engines.models import load_causal_lm, load_value_model
from stages.engines.safe_load import (
    WeightsOnlyCheckpointEngine,
    enum_member_by_name,
    install_weights_only_loader,
    weights_only_load,
)

SETTINGS = dict(lr=1e-2, lr_scheduler="cosine", warmup_steps=1, total_steps=4)


class Trap:
    """Unpickled, this creates the file ``marker``: the stand-in for a hostile file's payload."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


def plant(file: Path, marker: Path) -> None:
    """Add a :class:`Trap` to the dict a torch file holds; DeepSpeed would ignore the key."""
    state = torch.load(file, weights_only=False)
    state["ppoflow_test_trap"] = Trap(marker)
    torch.save(state, file)


def make_engine(model_dir: Path, role: str, zero_stage: int):
    torch.manual_seed(0)
    if role == "actor":
        module = ResponseLogProbModel(load_causal_lm(model_dir))
    else:
        module = ValueModel(load_value_model(model_dir))
    return initialize_engine(module, EngineSettings(zero_stage=zero_stage, **SETTINGS))


def test_the_trap_is_real(tmp_path):
    file, marker = tmp_path / "x.pt", tmp_path / "ran"
    torch.save({"a": torch.zeros(1)}, file)
    plant(file, marker)
    with pytest.raises(
        CheckpointIntegrityError, match=r"refusing to read .*x\.pt: it names io\.open"
    ):
        weights_only_load(file)
    assert not marker.exists()
    torch.load(file, weights_only=False)  # what DeepSpeed's own reader does: the payload runs
    assert marker.exists()


@pytest.mark.parametrize(
    ("role", "zero_stage"), [("actor", 0), ("critic", 1), ("actor", 2), ("critic", 3)]
)
def test_a_pickle_payload_in_any_engine_file_never_runs(tiny_model_dir, tmp_path, role, zero_stage):
    engine = make_engine(tiny_model_dir, role, zero_stage)
    path = save_engine_checkpoint(engine, tmp_path / "ckpt", client_state={"global_step": 1})
    files = sorted(path.rglob("*.pt"))
    kinds = {file.relative_to(path).as_posix() for file in files}
    assert {"lr_scheduler.pt", "rng_state_rank0.pt"} <= kinds
    assert any(kind.endswith("model_states.pt") for kind in kinds)
    assert any(kind.endswith("optim_states.pt") for kind in kinds) == (zero_stage > 0)
    for file in files:
        pristine, marker = file.read_bytes(), tmp_path / f"ran-{file.name}"
        plant(file, marker)
        with pytest.raises(CheckpointIntegrityError) as refused:
            load_engine_checkpoint(engine, path)
        line = str(refused.value)
        assert re.search(rf"refusing to read \S*{re.escape(file.name)}: it names io\.open", line)
        assert "\n" not in line and not marker.exists()
        file.write_bytes(pristine)
    assert load_engine_checkpoint(engine, path) == {"global_step": 1}  # the pristine files load
    assert isinstance(engine.checkpoint_engine, WeightsOnlyCheckpointEngine)


def test_a_damaged_optimizer_state_is_one_line_not_a_bare_error(tiny_model_dir, tmp_path):
    engine = make_engine(tiny_model_dir, "critic", 3)
    path = save_engine_checkpoint(engine, tmp_path / "ckpt")
    (optim,) = path.glob("state/*optim_states.pt")
    state = weights_only_load(optim)
    state["optimizer_state_dict"]["optimizer_state_dict"] = {}  # tensors only, wrong structure
    torch.save(state, optim)
    with pytest.raises(
        CheckpointIntegrityError, match=r"state: DeepSpeed's load failed with KeyError"
    ):
        load_engine_checkpoint(engine, path)
    optim.write_bytes(optim.read_bytes()[: optim.stat().st_size // 2])  # truncated
    with pytest.raises(
        CheckpointIntegrityError, match=r"optim_states\.pt cannot be read as a torch file"
    ):
        load_engine_checkpoint(engine, path)


def test_a_bare_stop_iteration_from_deepspeed_becomes_one_line(
    tiny_model_dir, tmp_path, monkeypatch
):
    engine = make_engine(tiny_model_dir, "actor", 0)
    path = save_engine_checkpoint(engine, tmp_path / "ckpt")

    def stop(*args, **kwargs):
        raise StopIteration  # what a damaged critic optimizer state ended in (issue 18)

    monkeypatch.setattr(engine, "load_checkpoint", stop)
    with pytest.raises(
        CheckpointIntegrityError, match=r"load failed with StopIteration \(no message\)"
    ):
        load_engine_checkpoint(engine, path)


def test_the_weights_only_loader_is_installed_once_and_only_over_torchs(tiny_model_dir):
    engine = make_engine(tiny_model_dir, "actor", 0)
    install_weights_only_loader(engine)
    installed = engine.checkpoint_engine
    install_weights_only_loader(engine)
    assert engine.checkpoint_engine is installed and installed.name == "TorchCheckpointEngine"
    engine.checkpoint_engine = object()
    with pytest.raises(TypeError, match="reads checkpoints with object"):
        install_weights_only_loader(engine)


def pickle_enums_by_name(monkeypatch) -> None:
    """Make this process pickle an enum member as CPython 3.11.2 does: ``getattr(cls, name)``."""
    monkeypatch.setattr(
        enum.Enum, "__reduce_ex__", lambda self, proto: (getattr, (type(self), self._name_))
    )


class ByName:
    """Pickles as ``getattr(target, name)``: a crafted file's use of the allowed ``getattr``."""

    def __init__(self, target, name: str) -> None:
        self.target, self.name = target, name

    def __reduce__(self):
        return (getattr, (self.target, self.name))


def test_an_enum_member_pickled_by_name_loads_as_that_member(tmp_path, monkeypatch):
    from deepspeed.runtime.zero.config import ZeroStageEnum

    pickle_enums_by_name(monkeypatch)
    file = tmp_path / "stage.pt"
    torch.save({"zero_stage": ZeroStageEnum.gradients, "w": torch.ones(2)}, file)
    assert "builtins.getattr" in torch.serialization.get_unsafe_globals_in_checkpoint(file)
    with pytest.raises(pickle.UnpicklingError, match="GLOBAL getattr was not an allowed"):
        torch.load(file, weights_only=True)  # torch's own weights-only load refuses the file
    state = weights_only_load(file)
    assert state["zero_stage"] is ZeroStageEnum.gradients and state["w"].tolist() == [1.0, 1.0]


@pytest.mark.parametrize(
    ("target", "name"),
    [
        ("ZeroStageEnum", "mro"),  # an allowed enum class, but not a member's name
        ("ZeroStageEnum", "_member_map_"),
        ("LossScaler", "update_scale"),  # an allowed class that is not an enum
        ("Tensor", "__setattr__"),  # a class torch itself allows
    ],
)
def test_getattr_builds_nothing_but_an_allowed_enum_member(tmp_path, target, name):
    from deepspeed.runtime.fp16.loss_scaler import LossScaler
    from deepspeed.runtime.zero.config import ZeroStageEnum

    cls = {"ZeroStageEnum": ZeroStageEnum, "LossScaler": LossScaler, "Tensor": torch.Tensor}
    file = tmp_path / "crafted.pt"
    torch.save({"x": ByName(cls[target], name)}, file)
    with pytest.raises(CheckpointIntegrityError) as refused:
        weights_only_load(file)
    line = str(refused.value)
    assert re.search(r"crafted\.pt: it names builtins\.getattr; the checkpoint holds", line)
    assert "\n" not in line
    with pytest.raises(pickle.UnpicklingError, match=f"called on {target}"):
        enum_member_by_name(cls[target], name)


def test_an_engine_checkpoint_written_with_enums_by_name_resumes(
    tiny_model_dir, tmp_path, monkeypatch
):
    pickle_enums_by_name(monkeypatch)
    engine = make_engine(tiny_model_dir, "critic", 1)
    path = save_engine_checkpoint(engine, tmp_path / "ckpt", client_state={"global_step": 3})
    (optim,) = path.glob("state/*optim_states.pt")
    assert "builtins.getattr" in torch.serialization.get_unsafe_globals_in_checkpoint(optim)
    assert load_engine_checkpoint(engine, path) == {"global_step": 3}
