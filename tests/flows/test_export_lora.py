"""``ppoflow export`` of a LoRA checkpoint: a PEFT adapter directory, or ``--merged`` the model.

Fast (an actor engine with rank-4 adapters on the tiny model, trained a few updates, its
checkpoint saved as ``global_step_1`` with the step's manifest, no Prefect): at each ZeRO stage
the adapter export loads with ``AutoModelForCausalLM`` + ``PeftModel.from_pretrained`` and gives
the engine's own log-probs of a batch (which the base alone does not give: the adapters moved);
the merged export loads with ``AutoModelForCausalLM.from_pretrained`` alone and decodes the adapter
export's greedy tokens; a bfloat16 run's exported adapters are the engine's bit for bit (ZeRO 2
and 3); a DoRA checkpoint exports and merges as well; a run that started from an adapter
directory exports with that directory's rank and targets, and says so in one line when the
directory is gone; ``--merged`` of a full-training checkpoint writes the plain export; a base
model other than the one the adapters were trained on is one line, and nothing is written.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from peft import PeftModel
from safetensors import safe_open
from tensordict import TensorDict
from transformers import AutoModelForCausalLM
from typer.testing import CliRunner

from dataproto import DataProto
from flows.cli.app import app
from stages.config import load_config
from stages.data.tiny_model import make_tiny_model
from stages.engines.checkpoint import checkpoint_dir
from stages.engines.checkpoint_manifest import write_step_manifest
from stages.engines.logprob import response_logprobs
from stages.engines.models import load_causal_lm
from stages.engines.roles import ActorWorker

REPO = Path(__file__).resolve().parents[2]
RESPONSE = 4


def export(*args) -> object:
    return CliRunner().invoke(app, ["export", *map(str, args)])


def one_error_line(result) -> str:
    """The command's one stderr line (asserting there is exactly one, and exit status 2)."""
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.exit_code == 2 and len(lines) == 1, (result.exit_code, result.output)
    assert lines[0].startswith("error: ")
    return lines[0]


def rollout_batch(vocab: int, P: int = 5, R: int = RESPONSE, seed: int = 1) -> DataProto:
    """4 left-padded prompts ‖ right-padded responses with random advantages."""
    generator = torch.Generator().manual_seed(seed)
    attention_mask = torch.zeros(4, P + R, dtype=torch.long)
    for row, (p, r) in enumerate([(3, 4), (5, 2), (1, 1), (4, 3)]):
        attention_mask[row, P - p : P + r] = 1
    input_ids = torch.randint(3, vocab, (4, P + R), generator=generator) * attention_mask
    response_mask = attention_mask[:, P:]
    tensors = {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "position_ids": (attention_mask.cumsum(-1) - 1).clamp(min=0),
        "prompts": input_ids[:, :P],
        "responses": input_ids[:, P:],
        "response_mask": response_mask,
        "advantages": torch.randn(4, R, generator=generator) * response_mask,
        "old_log_probs": (-3.0 + 0.3 * torch.randn(4, R, generator=generator)) * response_mask,
    }
    return DataProto(TensorDict(tensors, batch_size=[4]), {}, {"temperature": 1.0})


def greedy(model, input_ids, attention_mask) -> torch.Tensor:
    with torch.no_grad():
        out = model.generate(
            input_ids=input_ids, attention_mask=attention_mask, do_sample=False,
            max_new_tokens=8, pad_token_id=0, eos_token_id=1, use_cache=True,
        )  # fmt: skip
    return out[:, input_ids.shape[1] :]


@pytest.fixture(scope="module")
def base_model(tmp_path_factory) -> Path:
    """The tiny model with its layer matrices scaled (greedy decoding depends on the layers)."""
    directory = make_tiny_model(tmp_path_factory.mktemp("lora-export") / "model")
    model = load_causal_lm(directory)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if ".layers." in name and parameter.ndim == 2:
                parameter.mul_(3.0)
    model.save_pretrained(directory)
    return directory


def worker_of(base: Path, *overrides: str) -> ActorWorker:
    cfg = load_config(
        REPO / "configs" / "demo-cpu.yaml",
        [
            f"actor_rollout_ref.model.path={base}",
            "actor_rollout_ref.actor.ppo_mini_batch_size=4",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
            "actor_rollout_ref.rollout.n=1",
            "algorithm.adv_estimator=reinforce_plus_plus",  # rows of their own: no groups
            "actor_rollout_ref.actor.optim.lr=5e-2",
            "actor_rollout_ref.actor.entropy_coeff=0.0",
            *overrides,
        ],
    )
    return ActorWorker(cfg, total_training_steps=3)


def trained_checkpoint(base: Path, root: Path, *overrides: str) -> ActorWorker:
    """An actor trained 3 updates on one batch, saved as ``root/global_step_1/actor``."""
    torch.manual_seed(0)
    worker = worker_of(base, *overrides)
    batch = rollout_batch(worker.lm.config.vocab_size)
    for _ in range(3):
        worker.update_actor(batch)
    worker.save_checkpoint(str(checkpoint_dir(root, 1, "actor")))
    write_step_manifest(root, 1, ["actor"])
    return worker


def log_probs(model, batch) -> torch.Tensor:
    with torch.no_grad():
        values, _ = response_logprobs(
            model.eval(),
            batch.batch["input_ids"],
            batch.batch["attention_mask"],
            batch.batch["position_ids"],
            RESPONSE,
        )
    return values * batch.batch["response_mask"]


def engine_log_probs(worker: ActorWorker, batch) -> torch.Tensor:
    batch.meta_info["temperature"] = 1.0
    return worker.compute_log_prob(batch).batch["old_log_probs"] * batch.batch["response_mask"]


@pytest.mark.parametrize("zero_stage", [0, 1, 2, 3], ids=str)
def test_adapter_export_gives_the_engine_log_probs_and_merges(base_model, tmp_path, zero_stage):
    worker = trained_checkpoint(
        base_model,
        tmp_path / "ckpt",
        "actor_rollout_ref.model.lora_rank=4",
        f"actor_rollout_ref.actor.zero_stage={zero_stage}",
    )
    batch = rollout_batch(worker.lm.config.vocab_size, seed=2)
    expected = engine_log_probs(worker, batch)

    out = tmp_path / "adapter"
    result = export(tmp_path / "ckpt" / "global_step_1", out, "--base", base_model)
    assert result.exit_code == 0, result.output
    assert "a PEFT adapter directory (LoRA rank 4)" in result.stdout
    assert result.stdout.splitlines()[-1] == str(out)
    assert {"adapter_config.json", "adapter_model.safetensors", "tokenizer.json"} <= {
        p.name for p in out.iterdir()
    }
    assert not (out / "model.safetensors").exists() and not list(out.glob("*.bin"))
    with safe_open(out / "adapter_model.safetensors", "pt") as stored:
        stored_names = set(stored.keys())
    assert stored_names and all(".lora_" in name for name in stored_names)
    config = json.loads((out / "adapter_config.json").read_text())
    assert (config["peft_type"], config["r"], config["lora_alpha"]) == ("LORA", 4, 16)
    assert config["base_model_name_or_path"] == str(base_model)
    provenance = json.loads((out / "ppoflow_export.json").read_text())
    manifest = json.loads(
        (checkpoint_dir(tmp_path / "ckpt", 1, "actor") / "ppoflow_checkpoint.json").read_text()
    )
    assert provenance["kind"] == "adapter" and provenance["zero_stage"] == zero_stage
    assert provenance["base_model"] == str(base_model)
    assert provenance["base_fingerprint"] == manifest["adapter"]["base_model"]

    adapted = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base_model), out)
    torch.testing.assert_close(log_probs(adapted, batch), expected)
    base_only = log_probs(AutoModelForCausalLM.from_pretrained(base_model), batch)
    assert (base_only - expected).abs().max() > 1e-2  # the adapters moved the policy

    merged_dir = tmp_path / "merged"
    result = export(
        tmp_path / "ckpt" / "global_step_1", merged_dir, "--base", base_model, "--merged"
    )
    assert result.exit_code == 0, result.output
    assert "LoRA adapters (rank 4) merged" in result.stdout
    assert not (merged_dir / "adapter_config.json").exists()
    merged = AutoModelForCausalLM.from_pretrained(merged_dir)
    assert not any(".lora_" in name or "base_layer" in name for name in merged.state_dict())
    assert json.loads((merged_dir / "ppoflow_export.json").read_text())["kind"] == "merged"
    torch.testing.assert_close(log_probs(merged, batch), expected)
    prompts = batch.batch["input_ids"][:, :5], batch.batch["attention_mask"][:, :5]
    tokens = greedy(adapted, *prompts)
    assert torch.equal(greedy(merged, *prompts), tokens)
    assert not torch.equal(
        greedy(AutoModelForCausalLM.from_pretrained(base_model), *prompts), tokens
    )  # the greedy tokens are the adapters', not the base's


@pytest.mark.parametrize("zero_stage", [2, 3], ids=str)
def test_a_bfloat16_run_exports_the_engine_adapters_bit_for_bit(base_model, tmp_path, zero_stage):
    worker = trained_checkpoint(
        base_model,
        tmp_path / "ckpt",
        "actor_rollout_ref.model.lora_rank=4",
        "actor_rollout_ref.model.dtype=bfloat16",
        f"actor_rollout_ref.actor.zero_stage={zero_stage}",
    )
    result = export(tmp_path / "ckpt" / "global_step_1", tmp_path / "adapter", "--base", base_model)
    assert result.exit_code == 0, result.output
    with worker.full_parameters():
        engine = {
            name.replace(".default", ""): param.detach().clone()
            for name, param in worker.lm.named_parameters()
            if ".lora_" in name
        }
    with safe_open(tmp_path / "adapter" / "adapter_model.safetensors", "pt") as stored:
        exported = {name: stored.get_tensor(name) for name in stored.keys()}  # noqa: SIM118
    assert exported.keys() == engine.keys()
    for name, tensor in exported.items():
        assert tensor.dtype == torch.bfloat16 and torch.equal(tensor, engine[name]), name


def test_merged_on_a_full_checkpoint_is_the_plain_export(base_model, tmp_path):
    worker = trained_checkpoint(
        base_model, tmp_path / "ckpt", "actor_rollout_ref.actor.zero_stage=0"
    )
    step = tmp_path / "ckpt" / "global_step_1"
    result = export(step, tmp_path / "merged", "--base", base_model, "--merged")
    assert result.exit_code == 0, result.output
    assert "full training: nothing to merge" in result.stdout
    assert json.loads((tmp_path / "merged" / "ppoflow_export.json").read_text())["kind"] == "model"
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "merged").state_dict()
    for name, tensor in worker.lm.state_dict().items():
        assert torch.equal(loaded[name], tensor), name


def test_an_adapter_checkpoint_on_another_base_is_one_line(base_model, tmp_path):
    trained_checkpoint(
        base_model, tmp_path / "ckpt", "actor_rollout_ref.model.lora_rank=4",
        "actor_rollout_ref.actor.zero_stage=0",
    )  # fmt: skip
    other = make_tiny_model(tmp_path / "other", seed=1)
    line = one_error_line(
        export(tmp_path / "ckpt" / "global_step_1", tmp_path / "out", "--base", other)
    )
    assert f"{other} is not the base model the LoRA adapters of" in line
    assert "pass --base with the model directory the run trained on" in line
    assert not (tmp_path / "out").exists()
    assert not list(tmp_path.glob(".out.partial-*"))


def test_a_run_started_from_an_adapter_exports_with_that_adapter_s_config(base_model, tmp_path):
    start = worker_of(base_model, "actor_rollout_ref.model.lora_rank=2")
    start.lm.save_pretrained(tmp_path / "start")  # rank 2, α 16: not the settings' defaults
    worker = trained_checkpoint(
        base_model,
        tmp_path / "ckpt",
        f"actor_rollout_ref.model.lora_adapter_path={tmp_path / 'start'}",
        "actor_rollout_ref.actor.zero_stage=0",
    )
    batch = rollout_batch(worker.lm.config.vocab_size, seed=2)
    expected = engine_log_probs(worker, batch)
    step = tmp_path / "ckpt" / "global_step_1"
    result = export(step, tmp_path / "adapter", "--base", base_model)
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())["r"] == 2
    adapted = PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(base_model), tmp_path / "adapter"
    )
    torch.testing.assert_close(log_probs(adapted, batch), expected)

    (tmp_path / "start" / "adapter_config.json").unlink()  # its rank and targets are gone
    line = one_error_line(export(step, tmp_path / "again", "--base", base_model))
    assert f"started from the adapter directory {tmp_path / 'start'}" in line
    assert "restore that directory" in line


def test_a_dora_checkpoint_exports_and_merges(base_model, tmp_path):
    worker = trained_checkpoint(
        base_model, tmp_path / "ckpt", "actor_rollout_ref.model.lora_rank=4",
        "actor_rollout_ref.model.lora.type=dora", "actor_rollout_ref.actor.zero_stage=0",
    )  # fmt: skip
    batch = rollout_batch(worker.lm.config.vocab_size, seed=2)
    expected = engine_log_probs(worker, batch)
    step = tmp_path / "ckpt" / "global_step_1"
    for out, extra in ((tmp_path / "adapter", []), (tmp_path / "merged", ["--merged"])):
        result = export(step, out, "--base", base_model, *extra)
        assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())["use_dora"]
    adapted = PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(base_model), tmp_path / "adapter"
    )
    torch.testing.assert_close(log_probs(adapted, batch), expected)
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged")
    torch.testing.assert_close(log_probs(merged, batch), expected)
    base_only = log_probs(AutoModelForCausalLM.from_pretrained(base_model), batch)
    assert (base_only - expected).abs().max() > 1e-2
