"""A verl multi-turn GSM8K launch script (tool agent loop, vLLM) validates as written: its
multi_turn keys are ppoflow keys, its tool config loads, its async-server keys are noted."""

from __future__ import annotations

import shlex
import warnings
from pathlib import Path

from stages.agent.rollout import default_agent, tool_specs
from stages.config import load_config
from stages.config.root import ConfigNotice


def load_noting(*args):
    """load_config, and the notices it gave."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ConfigNotice)
        cfg = load_config(*args)
    return cfg, [str(w.message) for w in caught if issubclass(w.category, ConfigNotice)]


#: the overrides of verl's multi-turn GSM8K run with vLLM (its gsm8k_multiturn_grpo.yaml's
#: data / rollout settings given on the command line, as that file layers them on ppo_trainer)
MULTITURN_SCRIPT = """\
python3 -m verl.trainer.main_ppo \\
    actor_rollout_ref.rollout.name=vllm \\
    algorithm.adv_estimator=grpo \\
    data.train_batch_size=32 \\
    data.max_prompt_length=1024 \\
    data.max_response_length=1024 \\
    data.filter_overlong_prompts=True \\
    data.truncation='error' \\
    data.return_raw_chat=True \\
    actor_rollout_ref.hybrid_engine=True \\
    actor_rollout_ref.model.path=$HOME/models/Qwen2.5-3B-Instruct \\
    actor_rollout_ref.actor.optim.lr=1e-6 \\
    actor_rollout_ref.actor.ppo_mini_batch_size=32 \\
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8 \\
    actor_rollout_ref.actor.use_kl_loss=True \\
    actor_rollout_ref.actor.kl_loss_coef=0.001 \\
    actor_rollout_ref.actor.kl_loss_type=low_var_kl \\
    actor_rollout_ref.actor.entropy_coeff=0 \\
    actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8 \\
    actor_rollout_ref.rollout.tensor_model_parallel_size=2 \\
    actor_rollout_ref.rollout.n=8 \\
    actor_rollout_ref.rollout.gpu_memory_utilization=0.9 \\
    actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=8 \\
    algorithm.use_kl_in_reward=False \\
    trainer.critic_warmup=0 \\
    trainer.project_name='gsm8k_async_rl' \\
    trainer.experiment_name='qwen2.5-3b_function_rm-gsm8k-multi-w-tool' \\
    trainer.n_gpus_per_node=16 \\
    trainer.nnodes=1 \\
    trainer.save_freq=-1 \\
    trainer.test_freq=20 \\
    trainer.logger='["console"]' \\
    data.train_files=$HOME/data/gsm8k/train.parquet \\
    data.val_files=$HOME/data/gsm8k/test.parquet \\
    trainer.total_epochs=15 \\
    actor_rollout_ref.rollout.trace.token2text=False \\
    actor_rollout_ref.rollout.mode=async \\
    actor_rollout_ref.rollout.multi_turn.enable=true \\
    actor_rollout_ref.rollout.multi_turn.max_assistant_turns=5 \\
    actor_rollout_ref.rollout.enforce_eager=True \\
    actor_rollout_ref.actor.use_torch_compile=False \\
    actor_rollout_ref.rollout.multi_turn.tool_config_path=$HOME/tool_config/gsm8k_tool_config.yaml \\
    actor_rollout_ref.rollout.free_cache_engine=True
"""


def test_the_multi_turn_script_and_verls_tool_config_validate(
    tmp_path, write_verl_gsm8k_tool_config
):
    write_verl_gsm8k_tool_config(tmp_path / "tool_config" / "gsm8k_tool_config.yaml")
    command = MULTITURN_SCRIPT.split("main_ppo", 1)[1].replace("$HOME", str(tmp_path))
    cfg, notices = load_noting("ppo_trainer", shlex.split(command.replace("\\\n", " ")))
    multi_turn = cfg.actor_rollout_ref.rollout.multi_turn
    assert multi_turn.enable is True and multi_turn.max_assistant_turns == 5
    assert default_agent(cfg) == "tool_agent"
    (spec,) = tool_specs(cfg)
    assert spec.name == "calc_gsm8k_reward" and spec.class_name == "verl.tools.gsm8k_tool.Gsm8kTool"
    assert any("rollout.mode" in note for note in notices)  # async server: noted, no effect
    assert Path(multi_turn.tool_config_path).is_file()
