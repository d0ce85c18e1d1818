"""A verl LoRA GRPO launch script validates as written and acts: its flat LoRA keys are
ppoflow keys with verl's defaults, the reference is the actor's base (no reference engine), the
reference offload it sets is noted as having no effect; the ``lora:`` block spelling and the bad
combinations are one line each."""

from __future__ import annotations

import shlex
import warnings
from pathlib import Path

import pytest

from flows.engines import roles_for
from stages.config import ConfigError, load_config
from stages.config.root import ConfigWarning
from stages.engines.adapters import adapter_settings


def load_warning(*args):
    """load_config, and the warnings it gave."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ConfigWarning)
        cfg = load_config(*args)
    return cfg, [str(w.message) for w in caught if issubclass(w.category, ConfigWarning)]


#: verl's examples/grpo_trainer/run_qwen2_5-3b_gsm8k_grpo_lora.sh (the micro-batch sizes made
#: to divide ppoflow's per-rank mini-batch: 16 prompts × 5 / 8 ranks = 10 sequences)
LORA_SCRIPT = """\
python3 -m verl.trainer.main_ppo \\
    algorithm.adv_estimator=grpo \\
    trainer.val_before_train=False \\
    data.train_files=$HOME/data/gsm8k/train.parquet \\
    data.val_files=$HOME/data/gsm8k/test.parquet \\
    data.train_batch_size=16 \\
    data.max_prompt_length=512 \\
    data.max_response_length=1024 \\
    data.filter_overlong_prompts=True \\
    data.truncation='error' \\
    data.shuffle=False \\
    actor_rollout_ref.model.path=Qwen/Qwen2.5-3B-Instruct \\
    actor_rollout_ref.model.use_shm=True \\
    actor_rollout_ref.model.lora_rank=64 \\
    actor_rollout_ref.model.lora_alpha=32 \\
    actor_rollout_ref.actor.optim.lr=3e-6 \\
    actor_rollout_ref.model.use_remove_padding=True \\
    actor_rollout_ref.actor.ppo_mini_batch_size=16 \\
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=10 \\
    actor_rollout_ref.actor.use_kl_loss=True \\
    actor_rollout_ref.actor.kl_loss_coef=0.001 \\
    actor_rollout_ref.actor.kl_loss_type=low_var_kl \\
    actor_rollout_ref.actor.entropy_coeff=0 \\
    actor_rollout_ref.model.enable_gradient_checkpointing=True \\
    actor_rollout_ref.actor.fsdp_config.param_offload=False \\
    actor_rollout_ref.actor.fsdp_config.optimizer_offload=False \\
    actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=10 \\
    actor_rollout_ref.rollout.tensor_model_parallel_size=2 \\
    actor_rollout_ref.rollout.name=vllm \\
    actor_rollout_ref.rollout.gpu_memory_utilization=0.6 \\
    actor_rollout_ref.rollout.n=5 \\
    actor_rollout_ref.rollout.load_format=safetensors \\
    actor_rollout_ref.rollout.layered_summon=True \\
    actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=10 \\
    actor_rollout_ref.ref.fsdp_config.param_offload=True \\
    algorithm.use_kl_in_reward=False \\
    trainer.critic_warmup=0 \\
    trainer.logger='["console"]' \\
    trainer.project_name='verl_grpo_example_gsm8k' \\
    trainer.experiment_name='qwen2.5_3b_grpo_lora' \\
    trainer.n_gpus_per_node=8 \\
    trainer.nnodes=1 \\
    trainer.save_freq=20 \\
    trainer.test_freq=5 \\
    trainer.total_epochs=15
"""


def script_overrides(tmp_path: Path) -> list[str]:
    command = LORA_SCRIPT.split("main_ppo", 1)[1].replace("$HOME", str(tmp_path))
    return shlex.split(command.replace("\\\n", " "))


def test_the_lora_script_validates_and_its_reference_is_the_actors_base(tmp_path):
    cfg, notes = load_warning("ppo_trainer", script_overrides(tmp_path))
    model = cfg.actor_rollout_ref.model
    assert (model.lora_rank, model.lora_alpha, model.target_modules) == (64, 32, "all-linear")
    settings = adapter_settings(model, "actor_rollout_ref.model")
    assert (settings.variant, settings.rank, settings.alpha, settings.init_a) == (
        "lora", 64, 32.0, "kaiming",
    )  # fmt: skip
    assert cfg.derived.use_reference_policy and cfg.derived.reference_in_actor
    assert roles_for(cfg) == ["actor"]  # no reference model is built
    assert any("ref.param_offload = true has no effect with LoRA" in n for n in notes), notes


def test_the_lora_block_spelling_reads_megatrons_names(tmp_path):
    cfg = load_config(
        "ppo_trainer",
        [
            *script_overrides(tmp_path),
            "actor_rollout_ref.model.lora_rank=0",
            "actor_rollout_ref.model.lora.rank=16",
            "actor_rollout_ref.model.lora.merge=true",
        ],
    )
    settings = adapter_settings(cfg.actor_rollout_ref.model, "actor_rollout_ref.model")
    assert (settings.rank, settings.alpha, settings.init_a) == (16, 32.0, "xavier")
    assert settings.target_modules == (
        "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj",
    )  # fmt: skip
    assert cfg.derived.reference_in_actor


@pytest.mark.parametrize(
    "overrides, fragment",
    [
        (
            ["actor_rollout_ref.model.lora_rank=-1"],
            "actor_rollout_ref.model.lora_rank: got -1; must be ≥ 0",
        ),
        (["actor_rollout_ref.model.lora.rank=8"], "both turn LoRA on; set one spelling"),
        (
            ["actor_rollout_ref.model.lora.type=dora"],
            "'dora' with actor_rollout_ref.rollout.name = 'vllm': not implemented",
        ),
        (
            ["actor_rollout_ref.model.lora.type=canonical_lora"],
            "not available: Megatron's split-QKV adapters",
        ),
        (
            ["actor_rollout_ref.model.lora.dtype=float32"],
            "verl feature not supported by ppoflow (an adapter dtype of its own",
        ),
        (
            ["actor_rollout_ref.model.lora.freeze_language_model=false"],
            "training the base model beside its adapters",
        ),
    ],
)
def test_lora_settings_it_cannot_run_are_one_line_each(tmp_path, overrides, fragment):
    with pytest.raises(ConfigError) as info:
        load_config("ppo_trainer", [*script_overrides(tmp_path), *overrides])
    assert len(info.value.problems) == 1, info.value.problems
    assert fragment in info.value.problems[0]
