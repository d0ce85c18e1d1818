"""``algorithm.rollout_correction``: verl 0.9.1's keys and YAML defaults, parsed when the config
loads, each bad input one error line naming the key."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

from stages.config import CONFIGS_DIR, ConfigError, ConfigWarning, PPORunConfig, load_config
from stages.config.verl_keys import is_schema_key, verl_defaults

RC = "algorithm.rollout_correction"


def rc(*overrides: str, rollout: str = "vllm"):
    """The loaded section (``rollout``: the backend, which decides a null bypass_mode)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConfigWarning)
        backend = [f"actor_rollout_ref.rollout.name={rollout}"]
        if rollout == "hf":
            backend.append("actor_rollout_ref.rollout.tensor_model_parallel_size=1")
        return load_config(None, [*backend, *overrides]).algorithm.rollout_correction


def problems(*overrides: str) -> list[str]:
    with pytest.raises(ConfigError) as info:
        rc(*overrides)
    return info.value.problems


def test_defaults_are_verl_yaml_defaults():
    section = PPORunConfig().algorithm.rollout_correction
    assert section.rollout_is is None  # verl's YAML; its dataclass says "sequence"
    assert section.rollout_is_threshold == 2.0
    assert section.rollout_is_batch_normalize is False
    assert section.rollout_rs is None and section.rollout_rs_threshold is None
    assert section.loss_type == "ppo_clip"
    assert rc().bypass_mode is False and rc(rollout="hf").bypass_mode is True  # null filled


def test_verl_keys_are_ppoflow_keys_now():
    for leaf in (
        "rollout_is",
        "rollout_is_threshold",
        "rollout_rs",
        "rollout_rs_threshold",
        "loss_type",
        "rollout_is_batch_normalize",
        "bypass_mode",
    ):
        key = f"{RC}.{leaf}"
        assert is_schema_key(key) and key not in verl_defaults(), key


def test_thresholds_are_parsed_into_numbers_and_tuples():
    section = rc(
        f"{RC}.rollout_is=token",
        f"{RC}.rollout_is_threshold=0.5_2.0",
        f"{RC}.rollout_rs='token_k1,seq_mean_k3,token_k1'",
        f"{RC}.rollout_rs_threshold='4,0.05'",
    )
    assert section.rollout_is_threshold == (0.5, 2.0)
    assert section.rollout_rs == ("token_k1", "seq_mean_k3")  # the duplicate dropped
    assert section.rollout_rs_threshold == ((0.25, 4.0), 0.05)  # a bare u: (1/u, u) for k1
    assert rc(
        f"{RC}.rollout_rs=seq_max_k2", f"{RC}.rollout_rs_threshold=3"
    ).rollout_rs_threshold == (3.0,)
    # a dump speaks verl's strings and loads back to the same values
    dumped = section.model_dump(mode="json")
    assert dumped["rollout_is_threshold"] == "0.5_2.0"
    assert dumped["rollout_rs"] == "token_k1,seq_mean_k3"
    assert dumped["rollout_rs_threshold"] == "0.25_4.0,0.05"
    assert type(section).model_validate(dumped) == section
    assert type(section).model_validate(section.model_dump()) == section


def test_a_verl_yaml_with_the_keys_loads(tmp_path: Path):
    path = tmp_path / "verl.yaml"
    path.write_text(
        f"base: {CONFIGS_DIR / 'ppo_trainer.yaml'}\n"
        "actor_rollout_ref:\n  rollout:\n    name: vllm\n"
        "algorithm:\n  rollout_correction:\n"
        "    rollout_is: sequence\n    rollout_is_threshold: 2.0\n"
        "    rollout_is_batch_normalize: true\n"
        "    rollout_rs: token_k1,seq_max_k3\n    rollout_rs_threshold: 0.5_2.0,0.1\n"
        "    bypass_mode: false\n    loss_type: ppo_clip\n",
        encoding="utf-8",
    )
    section = load_config(path).algorithm.rollout_correction
    assert section.rollout_is == "sequence" and section.rollout_is_batch_normalize
    assert section.rollout_rs == ("token_k1", "seq_max_k3")
    assert section.rollout_rs_threshold == ((0.5, 2.0), 0.1)


@pytest.mark.parametrize(
    ("overrides", "line"),
    [
        (
            [f"{RC}.rollout_rs=token_k4", f"{RC}.rollout_rs_threshold=2"],
            f"{RC}.rollout_rs: got 'token_k4'; did you mean 'token_k3'",
        ),
        ([f"{RC}.rollout_is=tokens"], f"{RC}.rollout_is: got 'tokens'; did you mean 'token'"),
        (
            [f"{RC}.rollout_rs=seq_mean_k2", f"{RC}.rollout_rs_threshold=0.1_0.5"],
            f"{RC}.rollout_rs_threshold: threshold '0.1_0.5' of option 'seq_mean_k2': "
            "'seq_mean_k2' takes one upper bound",
        ),
        (
            [f"{RC}.rollout_rs='token_k1,seq_sum_k2'", f"{RC}.rollout_rs_threshold='1,2,3'"],
            f"{RC}.rollout_rs_threshold: got '1,2,3': 3 thresholds for 2 options",
        ),
        ([f"{RC}.rollout_rs=token_k2"], f"{RC}.rollout_rs_threshold: required with rollout_rs"),
        (
            [f"{RC}.rollout_rs_threshold=0.5"],
            f"{RC}.rollout_rs_threshold: got 0.5 but rollout_rs is null",
        ),
        (
            [f"{RC}.rollout_is_threshold=-2"],
            f"{RC}.rollout_is_threshold: got -2 (threshold: got -2.0; must be a finite number > 0)",
        ),
        ([f"{RC}.loss_type=reinfoce"], f"{RC}.loss_type: got 'reinfoce'; did you mean 'reinforce'"),
        (
            [f"{RC}.loss_type=reinforce"],
            f"{RC}.loss_type = 'reinforce' needs {RC}.bypass_mode = true",
        ),
        (
            [f"{RC}.rollout_is_batch_normalize=true"],
            f"{RC}.rollout_is_batch_normalize = true has no effect with {RC}.rollout_is = null",
        ),
        (
            [
                f"{RC}.bypass_mode=true",
                f"{RC}.rollout_is=token",
                "actor_rollout_ref.actor.policy_loss.loss_mode=gspo",
            ],
            "actor_rollout_ref.actor.policy_loss.loss_mode = 'gspo' would be replaced",
        ),
    ],
)
def test_bad_input_is_one_line_naming_the_key(overrides, line):
    found = problems(*overrides)
    assert len(found) == 1, found
    assert found[0].startswith(line), found[0]


def test_a_lo_hi_pair_in_the_wrong_order_is_refused():
    (line,) = problems(f"{RC}.rollout_is_threshold='2_0.5'")  # unquoted, Hydra reads 20.5
    assert line.startswith(f"{RC}.rollout_is_threshold: got '2_0.5'")
    assert "lower bound 2.0 is above the upper bound 0.5" in line


def test_bypass_mode_settings_that_are_valid():
    section = rc(
        f"{RC}.loss_type=reinforce", f"{RC}.rollout_is=token", rollout="hf"
    )  # hf: bypass by default
    assert section.bypass_mode is True and section.loss_type == "reinforce"


def test_weights_with_bypass_ppo_clip_warn_that_they_only_feed_the_metrics():
    with pytest.warns(ConfigWarning, match="computed for the rollout_corr/\\* metrics only"):
        load_config(
            None,
            [
                "actor_rollout_ref.rollout.name=hf",
                "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
                f"{RC}.rollout_is=token",
            ],
        )
