"""verl's DAPO run scripts validate and act: dynamic sampling (``algorithm.filter_groups.*``,
``data.gen_batch_size``), the DAPO reward manager's overlong buffer in each spelling verl's
recipes used, clip-higher and token-mean, no KL.

The overrides are those of verl's ``recipe/dapo/run_dapo_qwen2.5_32b.sh`` with its shell
variables expanded, as the script passes them to ``main_dapo``. One variable is the script's
own choice of a feature ppoflow lacks: ``sp_size=8`` (Ulysses sequence parallelism), refused at
any value but 1 with a line naming it; the script validates with ``sp_size=1``.
"""

from __future__ import annotations

import shlex
import warnings

import pytest

from stages.config import ConfigError, load_config
from stages.config.root import ConfigNotice
from stages.reward.settings import settings_from_config

DAPO_32B = """\
    data.train_files="$HOME/verl/data/dapo-math-17k.parquet" \\
    data.val_files="$HOME/verl/data/aime-2024.parquet" \\
    data.prompt_key=prompt \\
    data.truncation='left' \\
    data.max_prompt_length=2048 \\
    data.max_response_length=20480 \\
    data.gen_batch_size=1536 \\
    data.train_batch_size=512 \\
    actor_rollout_ref.rollout.n=16 \\
    algorithm.adv_estimator=grpo \\
    algorithm.use_kl_in_reward=False \\
    algorithm.kl_ctrl.kl_coef=0.0 \\
    actor_rollout_ref.actor.use_kl_loss=False \\
    actor_rollout_ref.actor.kl_loss_coef=0.0 \\
    actor_rollout_ref.actor.clip_ratio_low=0.2 \\
    actor_rollout_ref.actor.clip_ratio_high=0.28 \\
    actor_rollout_ref.actor.clip_ratio_c=10.0 \\
    algorithm.filter_groups.enable=True \\
    algorithm.filter_groups.max_num_gen_batches=10 \\
    algorithm.filter_groups.metric=acc \\
    actor_rollout_ref.model.use_remove_padding=True \\
    actor_rollout_ref.actor.use_dynamic_bsz=True \\
    actor_rollout_ref.ref.log_prob_use_dynamic_bsz=True \\
    actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=True \\
    actor_rollout_ref.actor.ppo_max_token_len_per_gpu=22528 \\
    actor_rollout_ref.ref.log_prob_max_token_len_per_gpu=22528 \\
    actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=22528 \\
    actor_rollout_ref.model.path="$HOME/verl/models/Qwen2.5-32B" \\
    actor_rollout_ref.model.enable_gradient_checkpointing=True \\
    actor_rollout_ref.actor.optim.lr=1e-6 \\
    actor_rollout_ref.actor.optim.lr_warmup_steps=10 \\
    actor_rollout_ref.actor.optim.weight_decay=0.1 \\
    actor_rollout_ref.actor.ppo_mini_batch_size=32 \\
    actor_rollout_ref.actor.fsdp_config.param_offload=True \\
    actor_rollout_ref.actor.fsdp_config.optimizer_offload=True \\
    actor_rollout_ref.actor.entropy_coeff=0 \\
    actor_rollout_ref.actor.grad_clip=1.0 \\
    actor_rollout_ref.actor.loss_agg_mode=token-mean \\
    actor_rollout_ref.actor.ulysses_sequence_parallel_size=$SP \\
    actor_rollout_ref.rollout.gpu_memory_utilization=0.80 \\
    actor_rollout_ref.rollout.tensor_model_parallel_size=4 \\
    actor_rollout_ref.rollout.enable_chunked_prefill=True \\
    actor_rollout_ref.rollout.max_num_batched_tokens=22528 \\
    actor_rollout_ref.rollout.temperature=1.0 \\
    actor_rollout_ref.rollout.top_p=1.0 \\
    actor_rollout_ref.rollout.top_k="-1" \\
    actor_rollout_ref.rollout.val_kwargs.temperature=1.0 \\
    actor_rollout_ref.rollout.val_kwargs.top_p=0.7 \\
    actor_rollout_ref.rollout.val_kwargs.top_k=-1 \\
    actor_rollout_ref.rollout.val_kwargs.do_sample=True \\
    actor_rollout_ref.rollout.val_kwargs.n=1 \\
    actor_rollout_ref.rollout.name=vllm \\
    actor_rollout_ref.ref.fsdp_config.param_offload=True \\
    actor_rollout_ref.ref.ulysses_sequence_parallel_size=$SP \\
    actor_rollout_ref.actor.fsdp_config.fsdp_size=-1 \\
    reward_model.reward_manager=dapo \\
$OVERLONG
    trainer.logger='["console","wandb"]' \\
    trainer.project_name="DAPO" \\
    trainer.experiment_name="DAPO-Qwen2.5-32B" \\
    trainer.n_gpus_per_node=8 \\
    trainer.nnodes="16" \\
    trainer.val_before_train=True \\
    trainer.test_freq=5 \\
    trainer.save_freq=25 \\
    trainer.total_epochs=1 \\
    trainer.default_local_dir="$HOME/verl/ckpts/DAPO/DAPO-Qwen2.5-32B" \\
    trainer.resume_mode=auto
"""

#: the overlong buffer as each generation of verl's DAPO scripts spells it
OVERLONG = {
    # verl 0.9.1 (test_dapo_7b_math.sh, test_dapo_local.sh): the legacy place, migrated
    "reward_kwargs": """\
    +reward_model.reward_kwargs.overlong_buffer_cfg.enable=True \\
    +reward_model.reward_kwargs.overlong_buffer_cfg.len=4096 \\
    +reward_model.reward_kwargs.overlong_buffer_cfg.penalty_factor=1.0 \\
    +reward_model.reward_kwargs.overlong_buffer_cfg.log=False \\
    +reward_model.reward_kwargs.max_resp_len=20480 \\
""",
    # verl 0.9.1's own layout
    "reward.reward_kwargs": """\
    +reward.reward_kwargs.overlong_buffer_cfg.enable=True \\
    +reward.reward_kwargs.overlong_buffer_cfg.len=4096 \\
    +reward.reward_kwargs.overlong_buffer_cfg.penalty_factor=1.0 \\
    +reward.reward_kwargs.overlong_buffer_cfg.log=False \\
    +reward.reward_kwargs.max_resp_len=20480 \\
""",
    # run_dapo_qwen2.5_32b.sh as written (before reward_kwargs)
    "reward_model.overlong_buffer": """\
    reward_model.overlong_buffer.enable=True \\
    reward_model.overlong_buffer.len=4096 \\
    reward_model.overlong_buffer.penalty_factor=1.0 \\
""",
}


def overrides(overlong: str, sp: int) -> list[str]:
    text = DAPO_32B.replace("$OVERLONG\n", OVERLONG[overlong]).replace("$SP", str(sp))
    return shlex.split(text.replace("$HOME", "/home/u").replace("\\\n", " "))


def load_quietly(args: list[str]):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConfigNotice)
        return load_config("ppo_trainer", args)


@pytest.mark.parametrize("overlong", sorted(OVERLONG))
def test_the_dapo_script_validates_and_its_keys_act(overlong):
    cfg = load_quietly(overrides(overlong, sp=1))
    fg = cfg.algorithm.filter_groups
    assert (fg.enable, fg.metric, fg.max_num_gen_batches) == (True, "acc", 10)
    assert (cfg.data.gen_batch_size, cfg.data.train_batch_size) == (1536, 512)
    actor = cfg.actor_rollout_ref.actor
    assert (actor.clip_ratio_low, actor.clip_ratio_high, actor.loss_agg_mode) == (
        0.2,
        0.28,
        "token-mean",
    )
    assert not cfg.algorithm.use_kl_in_reward and not actor.use_kl_loss
    assert cfg.reward.reward_manager.name == "dapo"
    buffer = settings_from_config(cfg).overlong  # what the reward stage applies
    assert buffer is not None
    assert (buffer.len, buffer.penalty_factor, buffer.log, buffer.max_resp_len) == (
        4096,
        1.0,
        False,
        20480,
    )
    # the loader draws generation rounds, and an epoch counts them (verl's DAPO recipe)
    assert cfg.steps_per_epoch(17_000) == 17_000 // 1536


def test_the_scripts_sequence_parallelism_is_the_one_refusal():
    with pytest.raises(ConfigError) as info:
        load_quietly(overrides("reward_kwargs", sp=8))
    (problem,) = info.value.problems  # the actor's key; the reference's is not a refusal
    assert problem.startswith("actor_rollout_ref.actor.ulysses_sequence_parallel_size = 8: verl ")
    assert "(Ulysses sequence parallelism)" in problem


def test_the_v1_buffers_in_flight_cap_is_refused_unless_at_verls_default():
    base = overrides("reward_kwargs", sp=1)
    load_quietly([*base, "algorithm.filter_groups.max_inflight_gen_batches=1"])
    with pytest.raises(
        ConfigError, match="max_inflight_gen_batches = 2: verl feature not supported"
    ):
        load_quietly([*base, "algorithm.filter_groups.max_inflight_gen_batches=2"])


def test_the_recipe_config_loads():
    cfg = load_config("dapo-cpu")
    fg = cfg.algorithm.filter_groups
    assert fg.enable and cfg.data.gen_batch_size > cfg.data.train_batch_size
    assert cfg.actor_rollout_ref.actor.clip_ratio_high == 0.28
    assert cfg.actor_rollout_ref.actor.loss_agg_mode == "token-mean"
    assert not cfg.algorithm.use_kl_in_reward and not cfg.actor_rollout_ref.actor.use_kl_loss
    assert settings_from_config(cfg).overlong is not None
