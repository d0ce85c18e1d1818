"""Bad configs: ``ppoflow train CONFIG [key=value …]`` refuses each before anything starts.

Each case is one line ``error: invalid config (SOURCE): KEY: what was wrong; what is right``
(several problems: the count on that line, one ``  - …`` line each), exit status 2, and no run
directory: the config is resolved before the run directory, Prefect or a model is touched.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from stages.config.paths import CONFIGS_DIR

DEMO = CONFIGS_DIR / "demo-cpu.yaml"
#: the config argument is a file that does not exist
MISSING = "<no such file>"


def yaml_file(body: str) -> str:
    """A config file on top of configs/demo-cpu.yaml (``base:`` is read from the file's own
    directory, so it is given absolute)."""
    return f"base: {DEMO}\n{body}"


# (test id, what the input is, config file text or None for demo-cpu, overrides, needles)
CASES = [
    ("yaml-syntax", "config file: YAML syntax error (an unclosed `[`)",
     yaml_file("data:\n  train_batch_size: [4\n"), [],
     ["bad.yaml, line 4, column 1: not valid YAML", "expected ',' or ']'", "starts at line 3"]),
    ("yaml-tab", "config file: a tab as indentation", yaml_file("data:\n\ttrain_batch_size: 4\n"),
     [], ["bad.yaml, line 3, column 1: not valid YAML", "that cannot start any token"]),
    ("yaml-duplicate-key", "config file: a key given twice in one mapping",
     yaml_file("trainer:\n  seed: 1\n  seed: 2\n"), [],
     ["bad.yaml, line 4, column 3", "duplicate key 'seed'"]),
    ("yaml-not-a-mapping", "config file: a list at the top level", "- a\n- b\n", [],
     ["top level must be a mapping of keys, got ['a', 'b']"]),
    ("base-missing", "config file: `base:` names a file that does not exist",
     "base: nope.yaml\n", [], ["base: file not found", "nope.yaml"]),
    ("config-file-missing", "config path that does not exist", MISSING, [],
     ["config file not found: ", "packaged configs: [", "'demo-cpu'"]),
    ("unknown-key-in-file", "config file: unknown key (a typo)",
     yaml_file("trainer:\n  totl_epochs: 3\n"), [],
     ["trainer.totl_epochs: unknown key; did you mean 'total_epochs'?"]),
    ("unknown-key-override", "override of an unknown key", None, ["trainer.totl_epochs=3"],
     ["(demo-cpu + 1 override)", "trainer.totl_epochs: unknown key; did you mean 'total_epochs'?"]),
    ("unknown-section", "override of an unknown top-level section", None, ["trainr.seed=1"],
     ["trainr: unknown key; did you mean 'trainer'?"]),
    ("wrong-type-int", "a word where an integer goes", None, ["data.train_batch_size=abc"],
     ["data.train_batch_size: got 'abc' (str); expected an integer"]),
    ("wrong-type-list", "a number where a list of files goes", None, ["data.train_files=5"],
     ["data.train_files: got 5 (int); expected a list"]),
    ("out-of-range-lr", "a negative learning rate", None, ["actor_rollout_ref.actor.optim.lr=-1"],
     ["actor_rollout_ref.actor.optim.lr: got -1; must be > 0"]),
    ("out-of-range-n", "zero samples per prompt", None, ["actor_rollout_ref.rollout.n=0"],
     ["actor_rollout_ref.rollout.n: got 0; must be ≥ 1"]),
    ("out-of-range-invalid-fraction", "reward.max_invalid_fraction above 1", None,
     ["reward.max_invalid_fraction=1.5"], ["reward.max_invalid_fraction: got 1.5; must be ≤ 1"]),
    ("not-a-choice", "an estimator name no registry holds", None, ["algorithm.adv_estimator=nope"],
     ["algorithm.adv_estimator: got 'nope'; allowed: 'gae'", "'grpo'"]),
    ("colocate-false-local", "roles apart (`ppoflow.workers.colocate=false`) on the local backend",
     None, ["ppoflow.workers.colocate=false"],
     ["ppoflow.workers: colocate=false gives each role processes of its own, but the local "
      "backend runs every role in this process; set ppoflow.workers.backend=ray"]),
    ("not-a-choice-in-list", "an unknown metric sink in trainer.logger", None,
     ["trainer.logger=[mlflow,nope]"], ["trainer.logger[1]: got 'nope'; allowed: 'console'"]),
    ("cross-field", "a mini-batch larger than the training batch", None,
     ["actor_rollout_ref.actor.ppo_mini_batch_size=128"],
     ["ppo_mini_batch_size = 128 is larger than data.train_batch_size = 64", "must be ≤"]),
    ("override-without-equals", "override without `=`", None, ["trainer.total_training_steps"],
     ["override 'trainer.total_training_steps': expected key.path=value"]),
    ("override-empty-key", "override with nothing before `=`", None, ["=3"],
     ["override '=3': no key before '='; expected key.path=value"]),
    ("override-grammar", "override that Hydra's grammar cannot parse", None,
     ["data.train_files=[a"],
     ["override 'data.train_files=[a': not valid in Hydra's override grammar", "quote"]),
    ("override-sweep", "a comma list (a Hydra sweep)", None, ["trainer.seed=1,2"],
     ["override 'trainer.seed=1,2': a comma-separated value is a Hydra sweep", "[a,b]"]),
    ("delete-missing", "`~key` of a key the config does not set", None, ["~trainer.nope"],
     ["override '~trainer.nope': trainer.nope is not set in the config, so there is nothing"]),
    ("verl-unsupported", "a verl key ppoflow does not support (Ulysses)", None,
     ["actor_rollout_ref.actor.ulysses_sequence_parallel_size=2"],
     ["actor_rollout_ref.actor.ulysses_sequence_parallel_size = 2: verl feature not supported by ppoflow "
      "(Ulysses sequence parallelism); remove the line (verl's default: 1)"]),
    ("interpolation-in-file", "config file: `${…}` to a key that does not exist",
     yaml_file("trainer:\n  experiment_name: ${trainer.nope}\n"), [],
     ["trainer.experiment_name: cannot resolve '${trainer.nope}'", "'trainer.nope' not found"]),
    ("interpolation-override", "override with `${…}` to a key that does not exist", None,
     ["trainer.experiment_name=${trainer.nope}"],
     ["trainer.experiment_name: cannot resolve '${trainer.nope}'"]),
    ("unset-in-file", "config file: `???` left unset", yaml_file("data:\n  train_files: ???\n"),
     [], ["data.train_files: '???' marks a value that must be set; set data.train_files=…"]),
    ("unset-override", "override to `???`", None, ["data.train_files=???"],
     ["data.train_files: '???' marks a value that must be set"]),
    ("dapo-gen-batch-too-small", "DAPO: `data.gen_batch_size` below `data.train_batch_size`",
     None, ["algorithm.filter_groups.enable=true", "data.gen_batch_size=32"],
     ["data.gen_batch_size = 32 is smaller than data.train_batch_size = 64",
      "set gen_batch_size ≥ 64"]),
    ("dapo-round-limit-unreachable", "DAPO: a round limit with one sample per prompt (nothing "
     "is ever filtered)", None,
     ["algorithm.filter_groups.enable=true", "algorithm.filter_groups.max_num_gen_batches=5",
      "actor_rollout_ref.rollout.n=1"],
     ["algorithm.filter_groups.enable = true with actor_rollout_ref.rollout.n = 1",
      "max_num_gen_batches = 5 could never be reached", "set n ≥ 2"]),
    ("dapo-final-reward-with-kl", "DAPO: filtering on `seq_final_reward` with the KL penalty in "
     "the reward", None,
     ["algorithm.filter_groups.enable=true", "data.gen_batch_size=96",
      "algorithm.filter_groups.metric=seq_final_reward", "algorithm.use_kl_in_reward=true"],
     ["algorithm.filter_groups.metric = 'seq_final_reward' with algorithm.use_kl_in_reward = true",
      "use 'seq_reward'"]),
    ("dapo-overlong-without-manager", "DAPO: the overlong buffer with verl's naive reward "
     "manager", None, ["reward.overlong_buffer.enable=true", "reward.overlong_buffer.len=4"],
     ["reward.overlong_buffer.enable = true but reward.reward_manager.name = 'naive' does not "
      "apply it", "set reward.reward_manager.name = 'dapo'"]),
    ("schedule-not-a-choice", "a policy schedule no registry holds", None,
     ["ppoflow.schedule=two_step_off"],
     ["ppoflow.schedule: got 'two_step_off'; did you mean 'one_step_off'?"]),
    ("one-step-off-adaptive-kl", "one step off with an adaptive KL coefficient in the reward",
     None, ["ppoflow.schedule=one_step_off", "algorithm.use_kl_in_reward=true",
            "algorithm.kl_ctrl.type=adaptive", "algorithm.kl_ctrl.target_kl=0.1"],
     ["ppoflow.schedule = 'one_step_off' with algorithm.kl_ctrl.type = 'adaptive'",
      "set kl_ctrl.type = 'fixed'"]),
    ("one-step-off-dynamic-sampling", "one step off with DAPO's dynamic sampling", None,
     ["ppoflow.schedule=one_step_off", "algorithm.filter_groups.enable=true",
      "data.gen_batch_size=96"],
     ["ppoflow.schedule = 'one_step_off' with algorithm.filter_groups.enable = true",
      "not implemented"]),
    ("one-step-off-remax", "one step off with ReMax's greedy baseline", None,
     ["ppoflow.schedule=one_step_off", "algorithm.adv_estimator=remax"],
     ["ppoflow.schedule = 'one_step_off' with algorithm.adv_estimator = 'remax'"]),
    ("one-step-off-agent-loop", "one step off with the multi-turn agent loop", None,
     ["ppoflow.schedule=one_step_off", "actor_rollout_ref.rollout.multi_turn.enable=true"],
     ["ppoflow.schedule = 'one_step_off' with actor_rollout_ref.rollout.multi_turn.enable = true"]),
    ("async-key-on-policy", "an `async_training` key with a synchronous schedule", None,
     ["async_training.staleness_threshold=0.5"],
     ["async_training.staleness_threshold = 0.5 has no effect with ppoflow.schedule = "
      "'on_policy'; set ppoflow.schedule = 'fully_async'"]),
    ("async-negative-staleness", "a staleness bound below 0", None,
     ["ppoflow.schedule=fully_async", "async_training.staleness_threshold=-1"],
     ["async_training.staleness_threshold: got -1; must be ≥ 0"]),
    ("async-save-off-the-sync-period", "fully async with checkpoints that split a sync period",
     None, ["ppoflow.schedule=fully_async", "trainer.save_freq=3"],
     ["trainer.save_freq = 3 is not a multiple of async_training.trigger_parameter_sync_step = 4",
      "set save_freq to a multiple of 4"]),
    ("async-step-batch", "fully async with a step batch other than require_batches mini-batches",
     None, ["ppoflow.schedule=fully_async", "async_training.require_batches=2"],
     ["data.train_batch_size = 64 but async_training.require_batches = 2 × "
      "actor.ppo_mini_batch_size = 64 prompts make a trainer step; set data.train_batch_size = 128"]),
    ("health-unknown-check", "a `ppoflow.health` key that names no health check", None,
     ["ppoflow.health.entropy_colapse.action=stop"],
     ["ppoflow.health.entropy_colapse: got 'entropy_colapse'; did you mean 'entropy_collapse'? "
      "allowed: 'entropy_collapse', 'first_step_agreement'"]),
    ("health-threshold-type", "a health-check threshold of the wrong type", None,
     ["ppoflow.health.kl_blowup.threshold=high"],
     ["ppoflow.health.kl_blowup.threshold: got 'high' (str); expected a number"]),
    ("health-action", "a health-check action that is none of warn, stop, off", None,
     ["ppoflow.health.kl_blowup.action=halt"],
     ["ppoflow.health.kl_blowup.action: got 'halt'; allowed: 'warn', 'stop' or 'off'"]),
    ("two-problems", "two bad overrides: both reported in one round", None,
     ["trainer.nope=1", "data.train_batch_size=x"], ["(demo-cpu + 2 overrides): 2 problems"]),
]  # fmt: skip


@pytest.mark.parametrize(
    ("described", "text", "overrides", "needles"),
    [pytest.param(*case[1:], id=case[0]) for case in CASES],
)
def test_a_bad_config_is_one_line_before_anything_starts(
    ppoflow, expect, tmp_path: Path, monkeypatch, described, text, overrides, needles
):
    monkeypatch.chdir(tmp_path)  # demo-cpu's relative data paths lead nowhere: never a long run
    config: str | Path = "demo-cpu"
    if text == MISSING:
        config = tmp_path / "nowhere.yaml"
    elif text is not None:
        config = tmp_path / "bad.yaml"
        config.write_text(text)
    result = ppoflow("train", config, *overrides, "--run-dir", tmp_path / "run")
    line = expect(result, 2, *needles, input=described)
    assert line.startswith("error: invalid config ("), line
    problems = [line for line in result.output.splitlines() if line.startswith("  - ")]
    assert len(problems) == (2 if "2 problems" in line else 0), result.output
    assert not (tmp_path / "run").exists()  # nothing was written


@pytest.mark.parametrize(
    ("described", "args", "needles"),
    [
        pytest.param("`config show` with an unknown key", ["show", "trainer.totl_epochs=3"],
                     ["error: invalid config (defaults + 1 override): trainer.totl_epochs: "
                      "unknown key; did you mean 'total_epochs'?"], id="config-show"),
        pytest.param("`config verl-keys -c FILE`, FILE does not exist",
                     ["verl-keys", "-c", "nowhere.yaml"],
                     ["error: invalid config (nowhere.yaml): config file not found"],
                     id="config-verl-keys"),
    ],
)  # fmt: skip
def test_the_config_commands_say_it_in_the_same_line(
    ppoflow, expect, tmp_path, monkeypatch, described, args, needles
):
    monkeypatch.chdir(tmp_path)
    expect(ppoflow("config", *args), 2, *needles, input=described)
