"""A verl user's YAML files and scripts load: interpolations, Hydra overrides, verl's key names.

The YAML and the scripts are written by the tests in verl's layout (keys as verl 0.9.1 and its
quick-start scripts spell them; model and data paths made local).
"""

from __future__ import annotations

import shlex
import warnings
from pathlib import Path

import pytest
from typer.testing import CliRunner

from flows.cli.app import app
from stages.config import (
    CONFIGS_DIR,
    ConfigError,
    ConfigNotice,
    apply_overrides,
    load_config,
)
from stages.config.verl_keys import Fate, rule_for, verl_defaults

BASE = CONFIGS_DIR / "ppo_trainer.yaml"

VERL_STYLE_YAML = """\
data:
  train_files: ${oc.env:PPOFLOW_TEST_DATA}/train.parquet
  val_files: ${oc.env:PPOFLOW_TEST_DATA}/test.parquet
  max_prompt_length: 256
  max_response_length: 128
  train_batch_size: 16
actor_rollout_ref:
  hybrid_engine: true
  model:
    path: ${oc.env:PPOFLOW_TEST_DATA}/model
    use_remove_padding: true
  actor:
    strategy: fsdp
    ppo_mini_batch_size: 8
    ppo_micro_batch_size_per_gpu: 2
    grad_clip: 0.5
    optim:
      lr: 1e-6
      warmup_style: cosine
    fsdp_config:
      param_offload: true
      optimizer_offload: true
      model_dtype: fp32
      dtype: bf16
      wrap_policy:
        min_num_params: 0
  rollout:
    name: vllm
    n: 4
    prompt_length: ${oc.select:data.max_prompt_length,512}
    response_length: ${data.max_response_length}
    log_prob_micro_batch_size: 8
  ref:
    fsdp_config:
      param_offload: true
critic:
  ppo_mini_batch_size: ${actor_rollout_ref.actor.ppo_mini_batch_size}
custom_reward_function:
  path: my_reward.py
  name: compute_score
reward_model:
  enable: false
  model:
    path: null
trainer:
  project_name: proj
  experiment_name: exp
  default_local_dir: checkpoints/${trainer.project_name}/${trainer.experiment_name}
  n_gpus_per_node: 2
  logger: ['console']
"""


def load_noting(*args, **kwargs):
    """load_config, and the notices it gave."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ConfigNotice)
        cfg = load_config(*args, **kwargs)
    return cfg, [str(w.message) for w in caught if issubclass(w.category, ConfigNotice)]


def write(tmp_path: Path, text: str, name: str = "verl.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def test_a_verl_style_trainer_yaml_loads(tmp_path, monkeypatch):
    monkeypatch.setenv("PPOFLOW_TEST_DATA", str(tmp_path))
    cfg, notices = load_noting(
        write(tmp_path, VERL_STYLE_YAML),
        ["trainer.experiment_name=exp2", "data.max_prompt_length=300"],
    )
    arr = cfg.actor_rollout_ref
    # interpolations see the final values of the keys they name (resolved after the overrides)
    assert cfg.trainer.default_local_dir == "checkpoints/proj/exp2"
    assert arr.rollout.prompt_length == 300 and arr.rollout.response_length == 128
    assert cfg.data.train_files == [f"{tmp_path}/train.parquet"]  # oc.env
    assert cfg.critic.ppo_mini_batch_size == 8
    # FSDP blocks and renamed keys
    assert arr.actor.strategy == "deepspeed"
    assert arr.actor.param_offload and arr.actor.optimizer_offload and arr.ref.param_offload
    assert arr.model.dtype == "bfloat16"
    assert arr.actor.optim.clip_grad == 0.5 and arr.actor.optim.lr_scheduler_type == "cosine"
    assert arr.rollout.log_prob_micro_batch_size_per_gpu == 4  # 8 over 2 ranks
    # legacy reward blocks
    assert cfg.reward.custom_reward_function.path == "my_reward.py"
    assert cfg.reward.reward_model.enable is False
    # a file of the user's sets these, at values other than verl's defaults: one line each
    assert any(
        "actor_rollout_ref.actor.fsdp_config.param_offload is read as "
        "actor_rollout_ref.actor.param_offload = True" in n
        for n in notices
    )
    # use_remove_padding is a ppoflow key (packed forwards); hybrid_engine holds verl's default:
    # counted in one line, not one each
    assert arr.model.use_remove_padding is True and cfg.critic.model.use_remove_padding is True
    assert not any("use_remove_padding" in n or "hybrid_engine" in n for n in notices[:-1])
    assert notices[-1].startswith("5 more verl keys hold verl 0.9.1's defaults")


def test_interpolation_of_a_key_set_only_on_the_command_line(tmp_path):
    path = write(
        tmp_path,
        f"base: {BASE}\ntrainer:\n  default_local_dir: ckpt/${{trainer.experiment_name}}\n",
    )
    assert load_config(path, ["trainer.experiment_name=late"]).trainer.default_local_dir == (
        "ckpt/late"
    )
    cfg = load_config(None, ["trainer.experiment_name=${trainer.project_name}-x"])
    assert cfg.trainer.experiment_name == f"{cfg.trainer.project_name}-x"


def test_an_override_can_be_an_interpolation_and_sources_re_resolve(tmp_path):
    cfg = load_config("demo-cpu", ["critic.ppo_mini_batch_size=${data.train_batch_size}"])
    assert cfg.critic.ppo_mini_batch_size == cfg.data.train_batch_size


LEGACY_REWARD_KEYS = {
    "custom_reward_function.path=my_reward.py": ("reward.custom_reward_function.path", "my_reward.py"),
    "custom_reward_function.name=score": ("reward.custom_reward_function.name", "score"),
    "reward_model.enable=true": ("reward.reward_model.enable", True),
    "reward_model.model.path=/models/rm": ("reward.reward_model.model_path", "/models/rm"),
    "reward_model.model.trust_remote_code=true": ("reward.reward_model.trust_remote_code", True),
    "reward_model.micro_batch_size_per_gpu=3": ("reward.reward_model.micro_batch_size_per_gpu", 3),
    "reward_model.num_workers=3": ("reward.num_workers", 3),
}  # fmt: skip


def value_at(cfg, dotted: str):
    node = cfg
    for part in dotted.split("."):
        node = getattr(node, part)
    return node


@pytest.mark.parametrize("config", ["demo-cpu", "grpo", "ppo_trainer", None])
def test_legacy_reward_spellings_beat_the_shipped_defaults(config):
    cfg = load_config(config, list(LEGACY_REWARD_KEYS))
    for key, expected in LEGACY_REWARD_KEYS.values():
        assert value_at(cfg, key) == expected, key


def test_legacy_spelling_in_params_and_in_the_users_file(tmp_path):
    cfg = load_config("demo-cpu", params={"custom_reward_function": {"path": "p.py"}})
    assert cfg.reward.custom_reward_function.path == "p.py"
    path = write(tmp_path, f"base: {BASE}\ncustom_reward_function:\n  path: file.py\n")
    assert load_config(path).reward.custom_reward_function.path == "file.py"


def test_the_later_layer_wins_between_two_spellings(tmp_path):
    legacy_file = write(
        tmp_path, f"base: {BASE}\ncustom_reward_function:\n  path: file.py\n", "a.yaml"
    )
    new_file = write(tmp_path, f"base: {BASE}\nreward:\n  custom_reward_function:\n    path: file.py\n", "b.yaml")  # fmt: skip
    assert (
        load_config(
            legacy_file, ["reward.custom_reward_function.path=cli.py"]
        ).reward.custom_reward_function.path
        == "cli.py"
    )
    assert (
        load_config(
            new_file, ["custom_reward_function.path=cli.py"]
        ).reward.custom_reward_function.path
        == "cli.py"
    )
    both = write(
        tmp_path,
        f"base: {BASE}\ncustom_reward_function:\n  path: a.py\nreward:\n  custom_reward_function:\n    path: b.py\n",
        "c.yaml",
    )
    with pytest.raises(
        ConfigError,
        match=r"set the same ppoflow key reward\.custom_reward_function\.path in .*c\.yaml",
    ):
        load_config(both)  # fmt: skip


def test_legacy_spelling_in_rerun_overrides():
    parent = load_config("demo-cpu", ["reward.custom_reward_function.path=old.py"])
    child = apply_overrides(parent, ["custom_reward_function.path=new.py", "reward_model.num_workers=2"])  # fmt: skip
    assert child.reward.custom_reward_function.path == "new.py" and child.reward.num_workers == 2


def test_hydra_prefixes():
    base = load_config("demo-cpu")
    cfg = load_config("demo-cpu", ["+trainer.total_epochs=3", "++trainer.test_freq=7"])
    assert (cfg.trainer.total_epochs, cfg.trainer.test_freq) == (3, 7)
    # ~key removes the file's value, so the schema's default applies
    assert base.trainer.device == "cpu"
    assert load_config("demo-cpu", ["~trainer.device"]).trainer.device == "cuda"
    assert load_config("demo-cpu", ["~trainer.device=cpu"]).trainer.device == "cuda"
    with pytest.raises(ConfigError, match=r"trainer.device is 'cpu', not 'cuda'; nothing deleted"):
        load_config("demo-cpu", ["~trainer.device=cuda"])


def test_values_read_as_hydra_reads_them():
    cfg = load_config(
        "demo-cpu",
        [
            "trainer.logger=['console','mlflow']",
            "trainer.project_name='verl_grpo_example_gsm8k'",
            'trainer.experiment_name="with spaces and = sign"',
            "actor_rollout_ref.actor.optim.lr=1e-6",
        ],
    )
    assert cfg.trainer.logger == ["console", "mlflow"]
    assert cfg.trainer.project_name == "verl_grpo_example_gsm8k"
    assert cfg.trainer.experiment_name == "with spaces and = sign"
    assert cfg.actor_rollout_ref.actor.optim.lr == 1e-6


# --- verl's quick-start scripts --------------------------------------------------------------

GRPO_SCRIPT = """\
set -x

python3 -m verl.trainer.main_ppo \\
    algorithm.adv_estimator=grpo \\
    data.train_files=$HOME/data/gsm8k/train.parquet \\
    data.val_files=$HOME/data/gsm8k/test.parquet \\
    data.train_batch_size=1024 \\
    data.val_batch_size=1312 \\
    data.max_prompt_length=512 \\
    data.max_response_length=512 \\
    actor_rollout_ref.model.path=$HOME/models/Qwen2-7B-Instruct \\
    actor_rollout_ref.actor.optim.lr=1e-6 \\
    actor_rollout_ref.model.use_remove_padding=True \\
    actor_rollout_ref.actor.ppo_mini_batch_size=256 \\
    actor_rollout_ref.actor.ppo_micro_batch_size=128 \\
    actor_rollout_ref.actor.use_kl_loss=True \\
    actor_rollout_ref.actor.kl_loss_coef=0.001 \\
    actor_rollout_ref.actor.kl_loss_type=low_var_kl \\
    actor_rollout_ref.actor.entropy_coeff=0 \\
    actor_rollout_ref.model.enable_gradient_checkpointing=True \\
    actor_rollout_ref.actor.fsdp_config.param_offload=False \\
    actor_rollout_ref.actor.fsdp_config.grad_offload=False \\
    actor_rollout_ref.actor.fsdp_config.optimizer_offload=False \\
    actor_rollout_ref.rollout.log_prob_micro_batch_size=128 \\
    actor_rollout_ref.rollout.tensor_model_parallel_size=2 \\
    actor_rollout_ref.rollout.name=vllm \\
    actor_rollout_ref.rollout.gpu_memory_utilization=0.6 \\
    actor_rollout_ref.rollout.n=5 \\
    actor_rollout_ref.ref.log_prob_micro_batch_size=128 \\
    actor_rollout_ref.ref.fsdp_config.param_offload=True \\
    algorithm.use_kl_in_reward=False \\
    algorithm.kl_ctrl.kl_coef=0.001 \\
    trainer.critic_warmup=0 \\
    trainer.logger=['console','wandb'] \\
    trainer.project_name='verl_grpo_example_gsm8k' \\
    trainer.experiment_name='qwen2_7b_function_rm' \\
    trainer.n_gpus_per_node=8 \\
    trainer.nnodes=1 \\
    trainer.save_freq=-1 \\
    trainer.test_freq=5 \\
    trainer.total_epochs=15 $@
"""

PPO_SCRIPT = """\
set -x

python3 -m verl.trainer.main_ppo \\
    algorithm.adv_estimator=gae \\
    data.train_files=$HOME/data/gsm8k/train.parquet \\
    data.val_files=$HOME/data/gsm8k/test.parquet \\
    data.train_batch_size=1024 \\
    data.max_prompt_length=512 \\
    data.max_response_length=512 \\
    data.filter_overlong_prompts=True \\
    data.truncation='error' \\
    actor_rollout_ref.model.path=$HOME/models/deepseek-llm-7b-chat \\
    actor_rollout_ref.actor.optim.lr=1e-6 \\
    actor_rollout_ref.model.use_remove_padding=True \\
    actor_rollout_ref.actor.ppo_mini_batch_size=256 \\
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16 \\
    actor_rollout_ref.actor.fsdp_config.param_offload=False \\
    actor_rollout_ref.actor.fsdp_config.optimizer_offload=False \\
    actor_rollout_ref.actor.use_kl_loss=False \\
    actor_rollout_ref.model.enable_gradient_checkpointing=True \\
    actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=32 \\
    actor_rollout_ref.rollout.tensor_model_parallel_size=4 \\
    actor_rollout_ref.rollout.name=vllm \\
    actor_rollout_ref.rollout.gpu_memory_utilization=0.4 \\
    critic.optim.lr=1e-5 \\
    critic.model.use_remove_padding=False \\
    critic.model.path=$HOME/models/deepseek-llm-7b-chat \\
    critic.model.enable_gradient_checkpointing=True \\
    critic.ppo_micro_batch_size_per_gpu=32 \\
    critic.model.fsdp_config.param_offload=False \\
    critic.model.fsdp_config.optimizer_offload=False \\
    algorithm.use_kl_in_reward=False \\
    trainer.critic_warmup=0 \\
    trainer.logger=['console','wandb'] \\
    trainer.project_name='verl_example_gsm8k' \\
    trainer.experiment_name='deepseek_llm_7b_function_rm' \\
    trainer.n_gpus_per_node=8 \\
    trainer.nnodes=1 \\
    trainer.total_training_steps=2 \\
    trainer.use_legacy_worker_impl=False \\
    trainer.total_epochs=15 $@
"""


def script_overrides(script: str, home: Path) -> list[str]:
    """The override arguments of a verl launch script, as the shell passes them ($HOME set)."""
    command = script.split("main_ppo", 1)[1].replace("$@", "").replace("$HOME", str(home))
    return shlex.split(command.replace("\\\n", " "))


@pytest.mark.parametrize("script", [GRPO_SCRIPT, PPO_SCRIPT], ids=["grpo", "ppo"])
def test_verl_quick_start_scripts_validate(script, tmp_path):
    overrides = script_overrides(script, tmp_path)
    cfg, notices = load_noting("ppo_trainer", overrides)
    assert cfg.trainer.logger == ["console", "wandb"]
    assert (
        cfg.actor_rollout_ref.model.path
        == f"{tmp_path}/models/" + Path(cfg.actor_rollout_ref.model.path).name
    )
    assert cfg.actor_rollout_ref.model.use_remove_padding is True  # a ppoflow key: packed forwards
    packed_critic = "critic.model.use_remove_padding=False" not in script  # the PPO script's
    assert cfg.critic.model.use_remove_padding is packed_critic
    assert not any("use_remove_padding" in n for n in notices)
    assert any("fsdp_config.param_offload is read as" in n for n in notices)


def test_grpo_script_global_micro_batches_become_per_rank(tmp_path):
    cfg = load_config("ppo_trainer", script_overrides(GRPO_SCRIPT, tmp_path))
    arr = cfg.actor_rollout_ref
    assert arr.actor.ppo_micro_batch_size_per_gpu == 16  # 128 over 8 ranks, as verl divides
    assert arr.rollout.log_prob_micro_batch_size_per_gpu == 16
    assert arr.ref.log_prob_micro_batch_size_per_gpu == 16
    assert arr.ref.param_offload is True


def test_ppo_script_older_critic_fsdp_block_is_read(tmp_path):
    overrides = [
        *script_overrides(PPO_SCRIPT, tmp_path),
        "critic.model.fsdp_config.param_offload=True",
    ]
    cfg = load_config("ppo_trainer", overrides)
    assert cfg.critic.param_offload is True and cfg.critic.zero_stage == 3


def test_features_ppoflow_lacks_are_named_all_in_one_round(tmp_path):
    overrides = [
        *script_overrides(GRPO_SCRIPT, tmp_path),
        "actor_rollout_ref.actor.ulysses_sequence_parallel_size=4",
        "actor_rollout_ref.rollout.multi_turn.function_tool_path=x.py",
        "algorithm.filter_groups.max_inflight_gen_batches=4",
        "reward.reward_manager.source=importlib",
        "+actor_rollout_ref.rollout.engine_kwargs.vllm.swap_space=4",
        "actor_rollout_ref.actor.clip_ratio_hgh=0.28",
        "trainer.total_epochs=0",
    ]
    with pytest.raises(ConfigError) as info:
        load_config("ppo_trainer", overrides)
    problems = info.value.problems
    unsupported = [p for p in problems if "verl feature not supported by ppoflow" in p]
    assert sorted(p.split(" = ")[0] for p in unsupported) == [
        "actor_rollout_ref.actor.ulysses_sequence_parallel_size",
        "actor_rollout_ref.rollout.engine_kwargs.vllm.swap_space",
        "actor_rollout_ref.rollout.multi_turn.function_tool_path",
        "algorithm.filter_groups.max_inflight_gen_batches",
        "reward.reward_manager.source",
    ]
    assert all("remove the line" in p for p in unsupported)
    assert any("Ulysses sequence parallelism" in p for p in unsupported)
    assert any(
        p.startswith("actor_rollout_ref.actor.clip_ratio_hgh: unknown key; did you mean 'clip_ratio_high'")
        for p in problems
    )  # fmt: skip
    assert any(p.startswith("trainer.total_epochs: got 0") for p in problems)
    assert len(problems) == 7


def test_renamed_keys_map_instead_of_misleading_hints():
    cfg = load_config(
        "demo-cpu",
        [
            "actor_rollout_ref.actor.optim.warmup_style=cosine",
            "actor_rollout_ref.actor.grad_clip=0.3",
            "critic.grad_clip=0.4",
            "reward.reward_manager.name=naive",  # verl's default manager: nothing to refuse
        ],
    )
    assert cfg.actor_rollout_ref.actor.optim.lr_scheduler_type == "cosine"
    assert cfg.actor_rollout_ref.actor.optim.clip_grad == 0.3
    assert cfg.critic.optim.clip_grad == 0.4


def test_strategy_and_short_dtypes_are_translated():
    cfg, notices = load_noting(
        "demo-cpu",
        ["actor_rollout_ref.actor.strategy=fsdp2", "actor_rollout_ref.rollout.dtype=bf16"],
    )
    assert cfg.actor_rollout_ref.actor.strategy == "deepspeed"
    assert cfg.actor_rollout_ref.rollout.dtype == "bfloat16"
    assert any("strategy = 'fsdp2' is read as 'deepspeed'" in n for n in notices)


# --- verl's own generated config -------------------------------------------------------------


def unflatten(flat: dict) -> dict:
    tree: dict = {}
    for key, value in flat.items():
        *parents, leaf = key.split(".")
        node = tree
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return tree


def test_every_verl_0_9_1_key_has_a_fate():
    for key in verl_defaults():
        rule = rule_for(key)
        assert rule is not None and rule.fate is not Fate.UNKNOWN, key


def test_verl_defaults_over_the_base_config_load_quietly(tmp_path):
    """verl 0.9.1's generated config, less the keys ppoflow has, over ppoflow's base: loads,
    with one summary notice and no line per key (nothing was set by the user)."""
    import yaml

    tree = unflatten(verl_defaults())
    path = write(tmp_path, f"base: {BASE}\n" + yaml.safe_dump(tree, sort_keys=False))
    cfg, notices = load_noting(path)
    assert cfg.actor_rollout_ref.actor.strategy == "deepspeed"
    assert len(notices) == 1 and "verl keys hold verl 0.9.1's defaults" in notices[0], notices


def test_verl_generated_config_loads_when_verl_is_installed():
    verl = pytest.importorskip("verl", reason="verl 0.9.1 is in the bench environment only")
    path = Path(verl.__file__).parent / "trainer/config/_generated_ppo_trainer.yaml"
    cfg = load_config(path, ["actor_rollout_ref.rollout.name=vllm"])  # '???' in verl's file
    assert cfg.actor_rollout_ref.rollout.name == "vllm"


def test_verl_keys_command_lists_each_fate(tmp_path, monkeypatch):
    monkeypatch.setenv("PPOFLOW_TEST_DATA", str(tmp_path))
    result = CliRunner().invoke(
        app, ["config", "verl-keys", "-c", str(write(tmp_path, VERL_STYLE_YAML))]
    )
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert any(
        line.startswith("mapped") and "actor_rollout_ref.actor.grad_clip" in line
        and "→ actor_rollout_ref.actor.optim.clip_grad" in line
        for line in lines
    )  # fmt: skip
    assert any(line.startswith("no effect") and "hybrid_engine" in line for line in lines)
    assert "ppoflow key" in lines[-1]


def test_config_show_prints_notes_on_stderr(tmp_path):
    result = CliRunner().invoke(
        app, ["config", "show", "-c", "demo-cpu", "custom_reward_function.path=x.py"]
    )
    assert result.exit_code == 0, result.output
    assert (
        "note: verl's custom_reward_function.path is read as reward.custom_reward_function.path = 'x.py'"
        in result.output
    )


def test_the_docs_list_every_mapping_and_every_unsupported_feature():
    """docs/differences.md states the whole table (regenerate its tables when verl_keys.yaml
    changes)."""
    import yaml

    from stages.config.verl_keys import TABLE_PATH

    table = yaml.safe_load(TABLE_PATH.read_text(encoding="utf-8"))
    doc = (Path(__file__).resolve().parents[2] / "docs" / "differences.md").read_text()
    for section in ("rename", "per_rank", "values", "no_effect", "unsupported"):
        for key in table[section]:
            assert f"`{key}`" in doc, (section, key)
    for section in ("no_effect", "unsupported"):
        for why in table[section].values():
            assert why in doc, (section, why)


def test_a_verl_section_given_a_value():
    cfg = load_config("demo-cpu", ["reward.reward_manager=naive"])  # verl's older scalar form
    assert cfg.reward.custom_reward_function.path is None
    with pytest.raises(ConfigError) as info:
        load_config("demo-cpu", ["actor_rollout_ref.rollout.trace=5"])
    assert info.value.problems == [
        "actor_rollout_ref.rollout.trace = 5: in verl 0.9.1 this is a section (keys: backend, "
        "experiment_name, max_samples_per_step_per_worker, project_name, token2text); set one "
        "of its keys, e.g. actor_rollout_ref.rollout.trace.backend=…"
    ]
    with pytest.raises(ConfigError) as info:
        load_config("demo-cpu", ["actor_rollout_ref.rollout.multi_turn=5"])  # a ppoflow section
    assert info.value.problems == [
        "actor_rollout_ref.rollout.multi_turn: got 5 (int); expected a mapping of keys"
    ]
