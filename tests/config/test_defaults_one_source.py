"""The math's defaults (``stages.algos.defaults``) are the schema's: one source, read both ways.

``stages/algos`` never imports the config, so the defaults it falls back to for a verl-style config
live in ``stages.algos.defaults`` and the schema's fields take theirs from there. These tests
hold the two together from the config's side: every table key is a field of its section whose
default is the table's value, and the typed slices the engines pass read the same as before.
"""

from __future__ import annotations

import pytest
from pydantic import BaseModel

from stages.algos import defaults
from stages.algos.actor_loss import ActorLossTerms
from stages.algos.config_view import algorithm_defaults
from stages.algos.policy_loss_config import PolicyLossSettings, resolve_policy_loss_config
from stages.config import PPORunConfig, load_config
from stages.config.schema_actor import ActorConfig, PolicyLossConfig
from stages.config.schema_algorithm import (
    AlgorithmConfig,
    FilterGroupsConfig,
    KlCtrlConfig,
    RolloutCorrectionConfig,
)
from stages.config.verl_keys import schema_defaults

#: each table of stages.algos.defaults and the schema section whose defaults it is
TABLES = [
    (defaults.ALGORITHM_DEFAULTS, AlgorithmConfig),
    (defaults.KL_CTRL_DEFAULTS, KlCtrlConfig),
    (defaults.ROLLOUT_CORRECTION_DEFAULTS, RolloutCorrectionConfig),
    (defaults.FILTER_GROUPS_DEFAULTS, FilterGroupsConfig),
    (defaults.ACTOR_LOSS_DEFAULTS, ActorConfig),
    (defaults.POLICY_LOSS_DEFAULTS, PolicyLossConfig),
]


@pytest.mark.parametrize(("table", "section"), TABLES, ids=lambda x: getattr(x, "__name__", ""))
def test_each_table_entry_is_its_sections_default(table, section: type[BaseModel]) -> None:
    instance = section()
    for name, value in table.items():
        assert name in section.model_fields, f"{section.__name__} has no field {name!r}"
        assert getattr(instance, name) == value, f"{section.__name__}.{name}"


def test_the_algorithm_tables_cover_every_algorithm_leaf_in_order() -> None:
    leaves = {}
    for name, value in AlgorithmConfig():
        leaves.update(dict(value) if isinstance(value, BaseModel) else {name: value})
    assert list(algorithm_defaults().items()) == list(leaves.items())


@pytest.mark.parametrize(
    "overrides",
    [
        [],
        ["actor_rollout_ref.actor.clip_ratio=0.3", "actor_rollout_ref.actor.clip_ratio_high=0.28"],
        [
            "actor_rollout_ref.actor.policy_loss.loss_mode=clip_cov",
            "actor_rollout_ref.actor.tau_neg=2",
        ],
        ["actor_rollout_ref.actor.use_kl_loss=true", "actor_rollout_ref.actor.kl_loss_type=k2"],
    ],
)
def test_a_typed_actor_slice_is_read_whole(overrides: list[str]) -> None:
    """Filled (validated) and unfilled slices both give exactly their own values."""
    filled = load_config(None, overrides).actor_rollout_ref.actor
    for actor in (
        filled,
        ActorConfig.model_validate(filled.model_dump() | {"clip_ratio_low": None}),
    ):
        assert resolve_policy_loss_config(actor) == PolicyLossSettings.from_actor(actor)
        assert ActorLossTerms.resolve(actor) == ActorLossTerms.from_actor(actor)


def test_the_verl_interpolation_defaults_are_the_filled_default_run() -> None:
    assert schema_defaults() == PPORunConfig().model_dump(mode="json")
