"""End to end: LoRA GRPO with a KL loss (configs/demo-cpu-lora.yaml) on the tiny model, and
kill -9 / resume of such a run.

The run: the LoRA demo config at the tiny size (tests/conftest.py: 4 prompts × n 2, 8 response
tokens), a checkpoint after each of its 2 steps. Checked from its artifacts and checkpoints: the
actor checkpoint holds the adapters only (every saved parameter a ``lora_`` one, some of them
moved from their zero start) with the base model's fingerprint; no reference engine is built, and
step 1's ``ref_log_prob`` equals the log-probs of the base model loaded on its own (a
``RefWorker`` without LoRA) on step 1's batch; the KL loss is reported.

Export and validation of the run: ``ppoflow export RUN --step 1`` writes a PEFT adapter directory
that, loaded with ``AutoModelForCausalLM`` + ``PeftModel.from_pretrained``, gives the log-probs
the run itself computed at step 2 (``old_log_prob``, after step 1's update); ``ppoflow validate
RUN --step 2`` prints the validation metrics the run logged at step 2, and so does ``--model`` of
step 2's adapter export and of its ``--merged`` export.

kill -9: one uninterrupted ``ppoflow train`` of 4 steps with a checkpoint after steps 2 and 4,
and a second one SIGKILLed (its process group, tests/flows/killpoints/sitecustomize.py) at the
start of step 3's actor update, then ``ppoflow resume RUN_DIR`` from step 2's checkpoint. The
resumed run must end with the uninterrupted run's adapters and their optimizer state at step 4,
bit for bit.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
from pathlib import Path

import pytest
import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM
from typer.testing import CliRunner

from dataproto.artifact import load_artifact
from flows.cli.app import app
from flows.runs.derived_keys import load_stage_artifact
from flows.runs.store import RunStore
from flows.train import train
from flows.validate_run import validate_run
from stages.config import load_config
from stages.engines.checkpoint import checkpoint_dir
from stages.engines.logprob import response_logprobs
from stages.engines.roles import RefWorker
from stages.engines.safe_load import weights_only_load

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("prefect_harness")]

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "configs" / "demo-cpu-lora.yaml"
KILLPOINTS = Path(__file__).resolve().parent / "killpoints"


@pytest.fixture(scope="module")
def demo(tmp_path_factory, make_demo_inputs) -> Path:
    return make_demo_inputs(tmp_path_factory.mktemp("demo"))


SPREAD_SCORE = (
    "def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kw):\n"
    "    return float(sum(map(ord, solution_str)) % 5) / 4\n"
)


@pytest.fixture(scope="module")
def scaled_demo(tmp_path_factory, make_demo_inputs) -> Path:
    """The demo inputs with the tiny model's layer matrices scaled ×6 (at init scale its tied
    embeddings decide greedy decoding whatever the layers) and a scorer whose scores spread
    over the response text (``spread_score.py``): validation sees what the adapters changed."""
    from stages.engines.models import load_causal_lm

    root = make_demo_inputs(tmp_path_factory.mktemp("scaled-demo"))
    model = load_causal_lm(root / "model")
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if ".layers." in name and parameter.ndim == 2:
                parameter.mul_(6.0)
    model.save_pretrained(root / "model")
    (root / "spread_score.py").write_text(SPREAD_SCORE)
    return root


def export(*args) -> Path:
    """``ppoflow export ARGS…``; the directory it wrote (its last line)."""
    done = CliRunner().invoke(app, ["export", *map(str, args)])
    assert done.exit_code == 0, done.output
    return Path(done.stdout.splitlines()[-1])


def response_log_probs(model, batch, adapters=None) -> torch.Tensor:
    """(B, R) log-probs of the batch's responses under ``model`` (temperature 1); with
    ``adapters`` (the PEFT model around ``model``) switched off."""
    context = adapters.disable_adapter() if adapters is not None else contextlib.nullcontext()
    with torch.no_grad(), context:
        values, _ = response_logprobs(
            model.eval(),
            batch.batch["input_ids"],
            batch.batch["attention_mask"],
            batch.batch["position_ids"],
            batch.batch["responses"].shape[1],
        )
    return values


def module_state(root: Path, step: int, name: str = "mp_rank_00_model_states.pt") -> dict:
    return weights_only_load(
        checkpoint_dir(root, step, "actor") / "state" / name, map_location="cpu"
    )


def test_lora_grpo_with_a_kl_loss_trains_the_adapters_on_the_base(
    scaled_demo, tmp_path, tiny_run_overrides
):
    demo = scaled_demo
    overrides = tiny_run_overrides(
        demo,
        tmp_path,
        2,
        "trainer.val_before_train=false",
        "trainer.balance_batch=false",  # rows in rollout order (the artifacts compared below)
        "trainer.save_freq=1",
        "actor_rollout_ref.actor.optim.lr=1e-2",
        f"reward.custom_reward_function.path={demo}/spread_score.py",
    )
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

    # step 1's adapter export gives the log-probs the run computed at step 2 (after step 1's
    # update), which the base model does not
    run = str(result.run_dir)
    adapter_1 = export(run, "--step", "1", tmp_path / "adapter-1")
    assert (adapter_1 / "adapter_config.json").is_file()
    step_2 = load_stage_artifact(store.artifact_path(2, "rollout"))
    old = load_artifact(store.artifact_path(2, "old_log_prob")).batch["old_log_probs"]
    base_model = AutoModelForCausalLM.from_pretrained(demo / "model")
    mask = step_2.batch["response_mask"].bool()
    adapted = PeftModel.from_pretrained(base_model, adapter_1)
    torch.testing.assert_close(response_log_probs(adapted, step_2)[mask], old[mask])
    base_only = response_log_probs(adapted.get_base_model(), step_2, adapters=adapted)
    assert (base_only[mask] - old[mask]).abs().max() > 1e-4  # the adapters moved the policy

    # validation of step 2: the checkpoint, its adapter export, its merged export
    logged = {k: v for k, v in result.history[-1].items() if k.startswith("val-")}
    assert logged
    adapter_2 = export(run, "--step", "2", tmp_path / "adapter-2")
    merged_2 = export(run, "--step", "2", tmp_path / "merged-2", "--merged")
    assert (merged_2 / "config.json").is_file() and not (merged_2 / "adapter_config.json").exists()
    for how in ({"step": 2}, {"model_dir": adapter_2}, {"model_dir": merged_2}):
        validation = validate_run(run, **how)
        assert validation.result.metrics == logged, how
    base_validation = validate_run(run, model_dir=demo / "model")  # LoRA keys off: the base
    assert base_validation.result.metrics != logged  # the adapters changed what validation sees


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
