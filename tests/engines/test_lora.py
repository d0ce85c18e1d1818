"""LoRA adapters on the actor and critic engines (PEFT on DeepSpeed ZeRO 0–3), on the tiny model.

Only the adapters train (the base stays bit-identical, the optimizer holds the adapters alone),
the reference log-probs are the actor's module with its adapters off and equal a separately
loaded base model's, the vLLM sync's merged weights equal PEFT's own merge, checkpoints hold the
adapters and resume exactly, and the adapter directory / target checks fail with one line.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from tensordict import TensorDict

from dataproto import DataProto
from stages.config import load_config
from stages.data.tiny_model import make_tiny_model
from stages.engines.adapters import adapter_settings, check_adapter_dir, merged_named_weights
from stages.engines.roles import ActorWorker, CriticWorker, RefWorker

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("lora-model"))


def lora_config(model_dir: Path, *overrides: str):
    return load_config(
        REPO / "configs" / "demo-cpu.yaml",
        [
            f"actor_rollout_ref.model.path={model_dir}",
            "data.train_batch_size=1",
            "actor_rollout_ref.actor.ppo_mini_batch_size=1",
            "actor_rollout_ref.rollout.n=4",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
            "data.max_response_length=6",
            "actor_rollout_ref.actor.use_kl_loss=true",
            "actor_rollout_ref.actor.optim.lr=1e-2",
            "actor_rollout_ref.model.lora_rank=4",
            *overrides,
        ],
    )


def rollout(worker: ActorWorker) -> DataProto:
    encoded = worker.tokenizer(["hello", "a b c", "xyz", "q"], return_tensors="pt", padding=True)
    mask = encoded["attention_mask"]
    prompts = DataProto(
        batch=TensorDict(
            {
                "input_ids": encoded["input_ids"],
                "attention_mask": mask,
                "position_ids": (mask.cumsum(-1) - 1).clamp(min=0),
            },
            batch_size=[4],
        ),
        non_tensor_batch={},
        meta_info={"temperature": 1.0},
    )
    out = worker.generate_sequences(prompts, seed=1)
    out.meta_info["temperature"] = 1.0
    return out


def base_tensors(model_dir: Path) -> dict[str, torch.Tensor]:
    return load_file(str(model_dir / "model.safetensors"))


def base_weights_of(worker: ActorWorker) -> dict[str, torch.Tensor]:
    """The actor's frozen base parameters under their model-file names."""
    with worker.full_parameters():
        return {
            name.replace(".base_layer", ""): param.detach().clone()
            for name, param in worker.lm.get_base_model().named_parameters()
            if ".lora_" not in name
        }


def adapter_weights_of(worker: ActorWorker) -> dict[str, torch.Tensor]:
    with worker.full_parameters():
        return {n: p.detach().clone() for n, p in worker.lm.named_parameters() if ".lora_" in n}


@pytest.mark.parametrize("zero_stage", [0, 1, 2, 3])
def test_lora_actor_trains_adapters_only_and_its_reference_is_the_base(
    model_dir, tmp_path, zero_stage
):
    cfg = lora_config(model_dir, f"actor_rollout_ref.actor.zero_stage={zero_stage}")
    assert cfg.derived.reference_in_actor and cfg.derived.use_reference_policy
    worker = ActorWorker(cfg, total_training_steps=2)
    optimized = [p for group in worker.engine.optimizer.param_groups for p in group["params"]]
    adapters = [p for n, p in worker.lm.named_parameters() if ".lora_" in n]
    assert sum(p.numel() for p in worker.lm.parameters() if p.requires_grad) == sum(
        p.numel() for p in adapters
    )
    assert len(optimized) <= len(adapters)  # ZeRO may flatten them; never a base parameter
    before = adapter_weights_of(worker)

    batch = rollout(worker)
    old = worker.compute_log_prob(batch)
    ref = worker.compute_ref_log_prob(batch)
    base_ref = RefWorker(load_config(REPO / "configs" / "demo-cpu.yaml", [
        f"actor_rollout_ref.model.path={model_dir}", "actor_rollout_ref.actor.use_kl_loss=true",
        f"actor_rollout_ref.ref.zero_stage={zero_stage}",
    ])).compute_ref_log_prob(batch)  # fmt: skip
    torch.testing.assert_close(ref.batch["ref_log_prob"], base_ref.batch["ref_log_prob"])

    train = batch.union(old).union(ref)
    R = train.batch["responses"].shape[1]
    train.batch["advantages"] = torch.randn(4, R, generator=torch.Generator().manual_seed(0))
    worker.update_actor(train)

    after = adapter_weights_of(worker)
    assert any(not torch.equal(before[n], after[n]) for n in before)  # the adapters trained
    on_disk = base_tensors(model_dir)
    for name, tensor in base_weights_of(worker).items():
        assert torch.equal(tensor, on_disk[name]), name  # the base is bit-identical
    ref_after = worker.compute_ref_log_prob(batch)
    assert torch.equal(ref_after.batch["ref_log_prob"], ref.batch["ref_log_prob"])
    assert not torch.equal(
        worker.compute_log_prob(batch).batch["old_log_probs"], old.batch["old_log_probs"]
    )

    # the checkpoint holds the adapters (not the base) and resumes exactly
    saved = Path(worker.save_checkpoint(str(tmp_path / "actor")))
    manifest = json.loads((saved / "ppoflow_checkpoint.json").read_text())
    assert manifest["adapter"]["rank"] == 4 and manifest["adapter"]["base_model"].startswith(
        "blake3:"
    )
    state_bytes = sum(f.stat().st_size for f in (saved / "state").iterdir())
    assert state_bytes < (model_dir / "model.safetensors").stat().st_size
    resumed = ActorWorker(cfg, total_training_steps=2)
    resumed.load_checkpoint(str(saved))
    for name, tensor in adapter_weights_of(resumed).items():
        assert torch.equal(tensor, after[name]), name
    worker.update_actor(train)
    resumed.update_actor(train)  # the optimizer state came back too: the next step is the same
    for name, tensor in adapter_weights_of(resumed).items():
        assert torch.equal(tensor, adapter_weights_of(worker)[name]), name


def test_merged_weights_equal_peft_merge_and_leave_the_adapter(model_dir):
    worker = ActorWorker(
        lora_config(model_dir, "actor_rollout_ref.actor.zero_stage=0"), total_training_steps=1
    )
    with torch.no_grad():
        for name, param in worker.lm.named_parameters():
            if ".lora_B." in name:
                param.normal_(0, 0.1)  # a trained-looking adapter (B starts at zero)
    adapters = adapter_weights_of(worker)
    merged = dict(merged_named_weights(worker.lm))
    reference = copy.deepcopy(worker.lm).merge_and_unload().state_dict()
    assert set(merged) == set(reference) - {"lm_head.weight"}  # tied: vLLM ties it back
    for name, tensor in merged.items():
        torch.testing.assert_close(tensor, reference[name])
    assert all(torch.equal(p, adapters[n]) for n, p in adapter_weights_of(worker).items())
    for name, tensor in base_weights_of(worker).items():
        assert torch.equal(tensor, base_tensors(model_dir)[name])


def test_start_from_an_adapter_directory(model_dir, tmp_path):
    cfg = lora_config(model_dir, "actor_rollout_ref.actor.zero_stage=0")
    worker = ActorWorker(cfg, total_training_steps=1)
    with torch.no_grad():
        for name, param in worker.lm.named_parameters():
            if ".lora_B." in name:
                param.normal_(0, 0.1)
    worker.lm.save_pretrained(tmp_path / "adapter")
    batch = rollout(worker)
    expected = worker.compute_log_prob(batch).batch["old_log_probs"]
    started = ActorWorker(
        lora_config(
            model_dir,
            "actor_rollout_ref.actor.zero_stage=0",
            "actor_rollout_ref.model.lora_rank=0",
            f"actor_rollout_ref.model.lora_adapter_path={tmp_path / 'adapter'}",
        ),
        total_training_steps=1,
    )
    assert any(p.requires_grad for n, p in started.lm.named_parameters() if ".lora_" in n)
    torch.testing.assert_close(started.compute_log_prob(batch).batch["old_log_probs"], expected)
    # its reference is the base model (verl: not base + the adapter it starts from)
    torch.testing.assert_close(
        started.compute_ref_log_prob(batch).batch["ref_log_prob"],
        worker.compute_ref_log_prob(batch).batch["ref_log_prob"],
    )


def test_an_adapter_of_another_base_is_one_line(model_dir, tmp_path):
    other = make_tiny_model(tmp_path / "other", seed=1)
    cfg = lora_config(other, "actor_rollout_ref.actor.zero_stage=0")
    ActorWorker(cfg, total_training_steps=1).lm.save_pretrained(tmp_path / "adapter")
    settings = adapter_settings(
        lora_config(
            model_dir, "actor_rollout_ref.model.lora_rank=0",
            f"actor_rollout_ref.model.lora_adapter_path={tmp_path / 'adapter'}",
        ).actor_rollout_ref.model,
        "actor_rollout_ref.model",
    )  # fmt: skip
    with pytest.raises(ValueError, match=r"was trained on base model .* is another model") as info:
        check_adapter_dir(settings, str(model_dir))
    assert "\n" not in str(info.value)
    check_adapter_dir(settings, str(other))  # its own base passes
    with pytest.raises(FileNotFoundError, match=r"no adapter_config\.json"):
        check_adapter_dir(
            adapter_settings(
                lora_config(
                    model_dir, f"actor_rollout_ref.model.lora_adapter_path={tmp_path}"
                ).actor_rollout_ref.model,
                "actor_rollout_ref.model",
            ),
            str(model_dir),
        )


def test_a_checkpoint_of_other_adapters_is_refused(model_dir, tmp_path):
    worker = ActorWorker(
        lora_config(model_dir, "actor_rollout_ref.actor.zero_stage=0"), total_training_steps=1
    )
    saved = worker.save_checkpoint(str(tmp_path / "actor"))
    other = ActorWorker(
        lora_config(
            model_dir,
            "actor_rollout_ref.actor.zero_stage=0",
            "actor_rollout_ref.model.lora_alpha=8",
        ),
        total_training_steps=1,
    )
    with pytest.raises(ValueError, match=r"other settings .*alpha: 16\.0 there, 8\.0 here"):
        other.load_checkpoint(saved)
    full = ActorWorker(
        lora_config(
            model_dir, "actor_rollout_ref.actor.zero_stage=0", "actor_rollout_ref.model.lora_rank=0"
        ),
        total_training_steps=1,
    )
    with pytest.raises(
        ValueError, match="holds LoRA adapters, but this engine trains full weights"
    ):
        full.load_checkpoint(saved)


@pytest.mark.parametrize("zero_stage", [0, 3])
def test_lora_critic_trains_adapters_and_value_head(model_dir, zero_stage):
    cfg = load_config(
        REPO / "configs" / "demo-cpu.yaml",
        [
            f"actor_rollout_ref.model.path={model_dir}",
            "algorithm.adv_estimator=gae",
            "data.train_batch_size=1",
            "actor_rollout_ref.actor.ppo_mini_batch_size=1",
            "actor_rollout_ref.rollout.n=4",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
            "critic.ppo_micro_batch_size_per_gpu=2",
            f"critic.zero_stage={zero_stage}",
            "critic.model.lora_rank=4",
            "critic.optim.lr=1e-2",
        ],
    )
    critic = CriticWorker(cfg, total_training_steps=1)
    trainable = {n for n, p in critic.engine.module.named_parameters() if p.requires_grad}
    assert trainable and all(".lora_" in n or ".score." in n for n in trainable), trainable
    actor = ActorWorker(
        lora_config(model_dir, "actor_rollout_ref.actor.zero_stage=0"), total_training_steps=1
    )
    batch = rollout(actor)
    values = critic.compute_values(batch)
    R = batch.batch["responses"].shape[1]
    train = batch.union(values)
    train.batch["returns"] = torch.ones(4, R)
    critic.update_critic(train)
    after = critic.compute_values(batch).batch["values"]
    assert not torch.equal(after, values.batch["values"])
