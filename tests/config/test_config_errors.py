"""Malformed configs: each error names the dotted key, the value received and what is allowed."""

from __future__ import annotations

from pathlib import Path

import pytest

from stages.config import ConfigError, load_config
from stages.config.loading import parse_yaml

# (overrides, fragments that must all appear in the one error message)
BAD_OVERRIDES = {
    "unknown top-level key": (
        ["trainr.total_epochs=2"],
        ["trainr", "unknown key", "did you mean 'trainer'"],
    ),
    "nested unknown key": (
        ["actor_rollout_ref.actor.optim.lrr=1e-5"],
        ["actor_rollout_ref.actor.optim.lrr", "unknown key", "did you mean 'lr'"],
    ),
    "unknown key with no close match": (
        ["trainer.zzz=1"],
        ["trainer.zzz", "unknown key", "known keys here:", "total_epochs"],
    ),
    "wrong type int": (
        ["trainer.total_epochs=abc"],
        ["trainer.total_epochs", "'abc'", "expected an integer"],
    ),
    "wrong type bool": (
        ["actor_rollout_ref.rollout.do_sample=maybe"],
        ["actor_rollout_ref.rollout.do_sample", "'maybe'", "expected a boolean"],
    ),
    "float where int": (
        ["actor_rollout_ref.rollout.n=1.5"],
        ["actor_rollout_ref.rollout.n", "1.5", "an integer"],
    ),
    "bad literal": (
        ["algorithm.adv_estimator=ppo"],
        ["algorithm.adv_estimator", "'ppo'", "allowed:", "'gae'", "'grpo'"],
    ),
    "truncation value": (
        ["data.truncation=both"],
        ["data.truncation", "'both'", "'error', 'left', 'right' or 'middle'"],
    ),
    "negative lr": (
        ["actor_rollout_ref.actor.optim.lr=-1e-6"],
        ["actor_rollout_ref.actor.optim.lr", "-1e-06", "> 0"],
    ),
    "clip_ratio_c equal to 1": (
        ["actor_rollout_ref.actor.clip_ratio_c=1.0"],
        ["clip_ratio_c", "1.0", "> 1"],
    ),
    "bad kl_loss_type": (
        ["actor_rollout_ref.actor.kl_loss_type=full"],
        ["actor_rollout_ref.actor.kl_loss_type", "'full'", "'low_var_kl'", "'k3+'"],
    ),
    "bad logger list item": (
        ["trainer.logger=[console, nope]"],
        ["trainer.logger[1]", "'nope'", "mlflow"],
    ),
    "betas with one item": (
        ["actor_rollout_ref.actor.optim.betas=[0.9]"],
        ["optim.betas", "too few items"],
    ),
    "train batch not divisible by DP": (
        ["data.train_batch_size=100"],
        ["data.train_batch_size × actor_rollout_ref.rollout.n = 100 × 1 = 100", "DP size", "= 8"],
    ),
    "mini batch larger than train batch": (
        ["data.train_batch_size=64", "actor_rollout_ref.actor.ppo_mini_batch_size=128"],
        [
            "actor_rollout_ref.actor.ppo_mini_batch_size = 128",
            "larger than data.train_batch_size = 64",
        ],
    ),
    "train batch not a multiple of mini batch": (
        ["data.train_batch_size=96", "actor_rollout_ref.actor.ppo_mini_batch_size=64"],
        [
            "data.train_batch_size = 96",
            "not divisible by actor_rollout_ref.actor.ppo_mini_batch_size = 64",
        ],
    ),
    "micro does not divide per-rank mini": (
        ["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=5"],
        ["ppo_micro_batch_size_per_gpu = 5", "256 × 1 / 8 = 32"],
    ),
    "critic disabled with gae": (["critic.enable=false"], ["critic.enable = false", "'gae'"]),
    "adaptive kl horizon 0": (
        ["algorithm.kl_ctrl.type=adaptive", "algorithm.kl_ctrl.horizon=0"],
        ["algorithm.kl_ctrl.horizon = 0", "> 0"],
    ),
    "remax without sampling": (
        ["algorithm.adv_estimator=remax", "actor_rollout_ref.rollout.do_sample=false"],
        ["actor_rollout_ref.rollout.do_sample = false", "'remax'"],
    ),
    "grpo_passk with n = 1": (
        ["algorithm.adv_estimator=grpo_passk"],
        ["rollout.n = 1", "'grpo_passk'", "n ≥ 2"],
    ),
    "loss_scale_factor with token-mean": (
        ["actor_rollout_ref.actor.loss_scale_factor=512"],
        [
            "actor_rollout_ref.actor.loss_scale_factor = 512",
            "'token-mean'",
            "seq-mean-token-sum-norm",
        ],
    ),
    "resume_path without a path": (
        ["trainer.resume_mode=resume_path"],
        ["trainer.resume_from_path", "resume_path"],
    ),
    "resume path without global_step_": (
        ["trainer.resume_mode=resume_path", "trainer.resume_from_path=ckpts/step3"],
        ["trainer.resume_from_path = 'ckpts/step3'", "global_step_N"],
    ),
    "param offload below zero 3": (
        ["actor_rollout_ref.actor.param_offload=true", "actor_rollout_ref.actor.zero_stage=2"],
        ["actor_rollout_ref.actor.param_offload = true", "zero_stage = 3 (got 2)"],
    ),
    "zero stage out of range": (
        ["actor_rollout_ref.actor.zero_stage=4"],
        ["actor_rollout_ref.actor.zero_stage", "4", "allowed"],
    ),
    "hf rollout with tensor parallelism": (
        ["actor_rollout_ref.rollout.name=hf"],
        ["tensor_model_parallel_size = 2", "'hf'", "set it to 1"],
    ),
    "reward model without a path": (
        ["reward.reward_model.enable=true"],
        ["reward.reward_model.model_path"],
    ),
    "dynamic batch budget below one sequence": (
        [
            "actor_rollout_ref.actor.use_dynamic_bsz=true",
            "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=600",
        ],
        ["actor_rollout_ref.actor.ppo_max_token_len_per_gpu = 600", "1024"],
    ),
    "bad override syntax": (
        ["trainer.total_epochs"],
        ["override 'trainer.total_epochs'", "key.path=value"],
    ),
    "hydra plus prefix on a key ppoflow lacks": (
        ["+trainer.foo=1"],
        ["trainer.foo: unknown key"],
    ),
    "empty override value (an empty string, as in Hydra)": (
        ["trainer.total_epochs="],
        ["trainer.total_epochs: got ''", "expected an integer"],
    ),
    "override into a value": (["trainer.logger.x=1"], ["trainer.logger: got {'x': 1}"]),
    "override outside Hydra's grammar": (
        ["trainer.logger=[a"],
        ["override 'trainer.logger=[a'", "Hydra's override grammar", "quote"],
    ),
    "hydra sweep": (["trainer.total_epochs=1,2"], ["sweep", "trainer.total_epochs=[a,b]"]),
    "hydra config group": (["optim@actor=adam"], ["config groups", "key.path=value"]),
    "delete a key the config does not set": (
        ["~trainer.total_epochs"],
        ["trainer.total_epochs is not set in the config", "nothing to delete"],
    ),
    "interpolation to a missing key": (
        ["trainer.experiment_name=${trainer.nope}"],
        ["trainer.experiment_name: cannot resolve '${trainer.nope}'", "not found"],
    ),
    "unset environment variable": (
        ["trainer.project_name=${oc.env:PPOFLOW_TEST_UNSET_VARIABLE}"],
        ["trainer.project_name: cannot resolve", "PPOFLOW_TEST_UNSET_VARIABLE"],
    ),
    "verl feature switched on": (
        ["actor_rollout_ref.actor.ulysses_sequence_parallel_size=2"],
        [
            "actor_rollout_ref.actor.ulysses_sequence_parallel_size = 2",
            "verl feature not supported",
            "Ulysses",
        ],
    ),
    "unknown key in a verl section": (
        ["actor_rollout_ref.actor.fsdp_config.param_ofload=true"],
        ["verl's actor_rollout_ref.actor.fsdp_config section", "did you mean 'param_offload'"],
    ),
    "typo of a verl key name": (
        ["actor_rollout_ref.actor.grad_clp=1"],
        ["actor_rollout_ref.actor.grad_clp: unknown key; did you mean 'grad_clip'?"],
    ),
    "verl global micro-batch not divisible by the DP size": (
        ["actor_rollout_ref.actor.ppo_micro_batch_size=12"],
        ["actor_rollout_ref.actor.ppo_micro_batch_size = 12", "DP size 8"],
    ),
}


@pytest.mark.parametrize("overrides, fragments", BAD_OVERRIDES.values(), ids=BAD_OVERRIDES.keys())
def test_bad_config_names_key_and_value(overrides: list[str], fragments: list[str]) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(None, overrides)
    message = str(info.value)
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in:\n{message}"
    assert "pydantic" not in message and "errors.pydantic.dev" not in message


def test_every_problem_is_listed_once_in_one_message() -> None:
    with pytest.raises(ConfigError) as info:
        load_config(
            None,
            [
                "trainer.total_epochs=0",
                "data.truncation=both",
                "trainer.totl=1",
                "actor_rollout_ref.rollout.n=x",
                "trainer.logger=[a",
                "actor_rollout_ref.actor.ulysses_sequence_parallel_size=2",
            ],
        )
    problems = info.value.problems
    assert len(problems) == 6, problems  # syntax, verl feature, unknown key and values: one round
    assert str(info.value).startswith("invalid config (defaults + 6 overrides): 6 problems")
    assert {p.split(":")[0].split(" ")[0] for p in problems} == {
        "override",
        "actor_rollout_ref.actor.ulysses_sequence_parallel_size",
        "trainer.total_epochs",
        "data.truncation",
        "trainer.totl",
        "actor_rollout_ref.rollout.n",
    }


def test_unknown_key_in_yaml_file_suggests_sibling(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("base: " + str(Path(__file__).resolve().parents[2] / "configs/ppo_trainer.yaml")
                    + "\nactor_rollout_ref:\n  rollout:\n    temprature: 0.7\n")  # fmt: skip
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert "actor_rollout_ref.rollout.temprature: unknown key; did you mean 'temperature'?" in str(
        info.value
    )
    assert str(path) in str(info.value)


def test_missing_config_file_lists_packaged_configs() -> None:
    with pytest.raises(ConfigError, match=r"config file not found: 'no/such.yaml'.*'grpo'"):
        load_config("no/such.yaml")


def test_missing_base_file_names_the_including_file(tmp_path: Path) -> None:
    path = tmp_path / "child.yaml"
    path.write_text("base: parent.yaml\n")
    with pytest.raises(ConfigError, match=r"child.yaml: base: file not found: .*parent.yaml"):
        load_config(path)


def test_base_cycle_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text("base: b.yaml\n")
    (tmp_path / "b.yaml").write_text("base: a.yaml\n")
    with pytest.raises(ConfigError, match="include cycle"):
        load_config(tmp_path / "a.yaml")


def test_duplicate_yaml_key_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "dup.yaml"
    path.write_text("trainer:\n  total_epochs: 1\n  total_epochs: 2\n")
    with pytest.raises(ConfigError, match="duplicate key 'total_epochs'"):
        load_config(path)


def test_top_level_must_be_a_mapping(tmp_path: Path) -> None:
    path = tmp_path / "list.yaml"
    path.write_text("- a\n- b\n")
    with pytest.raises(ConfigError, match="top level must be a mapping"):
        load_config(path)


def test_section_given_a_scalar(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"trainer: got 5 \(int\); expected a mapping of keys"):
        load_config(None, params={"trainer": 5})


def test_config_error_is_a_value_error() -> None:
    with pytest.raises(ValueError, match=r"data\.train_files"):
        load_config(None, ["data.train_files=[]"])


def test_nested_yaml_aliases_are_refused_before_they_expand(tmp_path):
    """A 1 KB "billion laughs" file (aliases of aliases) is one error naming the expansion, not
    millions of values walked by every later check; a few aliases stay fine."""
    lines = ['a: &a ["x", "x", "x", "x", "x", "x", "x", "x", "x"]']
    for name, previous in zip("bcdefg", "abcdef"):
        lines.append(f"{name}: &{name} [" + ", ".join([f"*{previous}"] * 9) + "]")
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text("\n".join(lines) + "\n")
    with pytest.raises(ConfigError) as info:
        load_config(bomb)
    (problem,) = info.value.problems
    assert "expand it to 6,053,451 values, more than 100,000" in problem
    assert parse_yaml("x: &v [1, 2]\ny: *v\n", "ok.yaml") == {"x": [1, 2], "y": [1, 2]}
