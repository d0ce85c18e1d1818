"""End to end: LoRA GRPO with a KL loss (configs/demo-cpu-lora.yaml) on the tiny model, and
kill -9 / resume of such a run.

The run: the LoRA demo config at the tiny size (tests/conftest.py: 4 prompts × n 2, 8 response
tokens). Checked from its artifacts and checkpoints: the actor checkpoint holds the adapters only
(every saved parameter a ``lora_`` one, some of them moved from their zero start) with the base
model's fingerprint; no reference engine is built, and step 1's ``ref_log_prob`` equals the log-probs
of the base model loaded on its own (a ``RefWorker`` without LoRA) on step 1's batch; the KL loss
is reported.

kill -9: one uninterrupted ``ppoflow train`` of 4 steps with a checkpoint after steps 2 and 4,
and a second one SIGKILLed (its process group, tests/flows/killpoints/sitecustomize.py) at the
start of step 3's actor update, then ``ppoflow resume RUN_DIR`` from step 2's checkpoint. The
resumed run must end with the uninterrupted run's adapters and their optimizer state at step 4,
bit for bit.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import pytest
import torch

from dataproto.artifact import load_artifact
from flows.runs.derived_keys import load_stage_artifact
from flows.runs.store import RunStore
from flows.train import train
from stages.config import load_config
from stages.engines.checkpoint import checkpoint_dir
from stages.engines.roles import RefWorker
from stages.engines.safe_load import weights_only_load

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("prefect_harness")]

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "configs" / "demo-cpu-lora.yaml"
KILLPOINTS = Path(__file__).resolve().parent / "killpoints"


@pytest.fixture(scope="module")
def demo(tmp_path_factory, make_demo_inputs) -> Path:
    return make_demo_inputs(tmp_path_factory.mktemp("demo"))


def module_state(root: Path, step: int, name: str = "mp_rank_00_model_states.pt") -> dict:
    return weights_only_load(
        checkpoint_dir(root, step, "actor") / "state" / name, map_location="cpu"
    )


def test_lora_grpo_with_a_kl_loss_trains_the_adapters_on_the_base(
    demo, tmp_path, tiny_run_overrides
):
    overrides = tiny_run_overrides(
        demo, tmp_path, 2, "trainer.val_before_train=false", "trainer.balance_batch=false"
    )  # rows in rollout order: step 1's rollout artifact is the reference stage's batch
    result = train(CONFIG, overrides, str(tmp_path / "run"))
    cfg = load_config(CONFIG, overrides)
    assert cfg.derived.reference_in_actor and cfg.derived.use_reference_policy

    module = module_state(tmp_path / "checkpoints", 2)["module"]
    assert module and all(".lora_" in name for name in module), sorted(module)[:4]
    assert any(t.abs().sum() > 0 for n, t in module.items() if ".lora_B." in n)  # B left zero
    manifest = json.loads(
        (
            checkpoint_dir(tmp_path / "checkpoints", 2, "actor") / "ppoflow_checkpoint.json"
        ).read_text()
    )
    assert manifest["adapter"]["rank"] == 8 and manifest["adapter"]["base_model"].startswith(
        "blake3:"
    )

    store = RunStore(str(result.run_dir))
    batch = load_stage_artifact(store.artifact_path(1, "rollout"))
    batch.meta_info["temperature"] = cfg.actor_rollout_ref.rollout.temperature
    ref = load_artifact(store.artifact_path(1, "ref_log_prob")).batch["ref_log_prob"]
    base_cfg = load_config(CONFIG, [*overrides, "actor_rollout_ref.model.lora_rank=0"])
    assert not base_cfg.derived.reference_in_actor
    base = RefWorker(base_cfg).compute_ref_log_prob(batch).batch["ref_log_prob"]
    torch.testing.assert_close(ref, base)
    assert all(step["actor/kl_loss"] >= 0 for step in result.history)
    assert result.history[-1]["actor/kl_loss"] > 0  # the adapted policy moved off its base

    # exporting an adapter checkpoint is refused in one line, saying it is not implemented
    from flows.export import ActorCheckpoint

    with pytest.raises(NotImplementedError, match=r"holds LoRA adapters .* not implemented"):
        ActorCheckpoint.at(tmp_path / "checkpoints" / "global_step_2")


# --- kill -9 and resume ---------------------------------------------------------------------------


def test_a_kill_in_a_lora_run_resumes_to_the_uninterrupted_adapters(
    demo, tmp_path, tiny_run_overrides, process_groups
):
    from prefect.settings import PREFECT_API_URL

    tail = process_groups.tail

    def env(home: Path, **extra: str) -> dict[str, str]:
        return {
            **os.environ,
            "PREFECT_HOME": str(tmp_path / "prefect-home"),
            "PREFECT_API_URL": PREFECT_API_URL.value(),
            "HF_HUB_OFFLINE": "1",
            "OMP_NUM_THREADS": "1",
            **extra,
        }

    def train_run(name: str, **extra: str) -> tuple[Path, int]:
        home = tmp_path / name
        home.mkdir()
        overrides = tiny_run_overrides(
            demo, home, 4, "trainer.save_freq=2", "trainer.test_freq=-1",
            "trainer.val_before_train=false",
        )  # fmt: skip
        command = [sys.executable, "-m", "flows.cli", "train", str(CONFIG), *overrides]
        command += ["--run-dir", str(home / "run")]
        status, _ = process_groups.run_group(command, home, env(home, **extra), home / "train.log")
        return home, status

    baseline, status = train_run("baseline")
    assert status == 0, f"the baseline exited {status}:\n{tail(baseline / 'train.log')}"
    python_path = os.pathsep.join(filter(None, [str(KILLPOINTS), os.environ.get("PYTHONPATH")]))
    killed, status = train_run(
        "killed",
        PYTHONPATH=python_path,
        PPOFLOW_TEST_KILL_AT="update_actor.start:3",
        PPOFLOW_TEST_KILL_LOG=str(tmp_path / "kill.jsonl"),
    )
    assert status == -signal.SIGKILL, f"exited {status}:\n{tail(killed / 'train.log')}"
    command = [sys.executable, "-m", "flows.cli", "resume", str(killed / "run")]
    status, _ = process_groups.run_group(command, killed, env(killed), killed / "resume.log")
    assert status == 0, f"ppoflow resume exited {status}:\n{tail(killed / 'resume.log')}"
    assert "global_step_2" in (killed / "resume.log").read_text(), tail(killed / "resume.log")

    want = module_state(baseline / "checkpoints", 4)
    got = module_state(killed / "checkpoints", 4)
    assert want["module"].keys() == got["module"].keys()
    assert all(".lora_" in name for name in want["module"])
    for name, tensor in want["module"].items():
        assert torch.equal(got["module"][name], tensor), name
    want_optim, got_optim = (
        module_state(root / "checkpoints", 4, "zero_pp_rank_0_mp_rank_00_optim_states.pt")
        if (checkpoint_dir(root / "checkpoints", 4, "actor") / "state" / "zero_pp_rank_0_mp_rank_00_optim_states.pt").exists()
        else module_state(root / "checkpoints", 4)["optimizer"]
        for root in (baseline, killed)
    )  # fmt: skip
    assert str(want_optim) == str(got_optim)
