"""data.reward_fn_key: the column whose value the scorer receives as data_source (verl's
``row[reward_fn_key]``), read from ``reward_route`` when it is not data_source."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from dataproto import keys as K
from stages.config import load_config
from stages.ppo import PPO_REWARD_STAGE
from stages.reward.custom import load_custom_scorer
from stages.reward.loop import RewardLoop, build_calls
from stages.reward.settings import CONFIG_KEYS, RewardSettings, settings_from_config
from stages.stage import non_tensor

SCORERS_FILE = Path(__file__).with_name("scorers_for_tests.py")


def _with_route(batch, routes: list[str]):
    batch.non_tensor_batch[K.REWARD_ROUTE] = np.array(routes, dtype=object)
    return batch


def test_build_calls_pass_the_route_column_as_data_source(tokenizer, batch_factory):
    batch = _with_route(batch_factory(["1", "2"], data_source="labels/only"), ["a", "b"])
    default = build_calls(batch, tokenizer, with_prompt=False, scorer_kwargs={})
    routed = build_calls(
        batch, tokenizer, with_prompt=False, scorer_kwargs={}, route_key=K.REWARD_ROUTE
    )
    assert [c["data_source"] for c in default] == ["labels/only"] * 2
    assert [c["data_source"] for c in routed] == ["a", "b"]


def test_a_missing_route_column_names_reward_fn_key(tokenizer, batch_factory):
    with pytest.raises(KeyError, match=r"reward_route.*data\.reward_fn_key"):
        build_calls(
            batch_factory(["1"]),
            tokenizer,
            with_prompt=False,
            scorer_kwargs={},
            route_key=K.REWARD_ROUTE,
        )


def test_settings_read_reward_fn_key_and_the_cache_key_lists_it():
    cfg = load_config(None, ["data.reward_fn_key=ability"])
    settings = settings_from_config(cfg)
    assert settings.reward_fn_key == "ability" and settings.route_key == K.REWARD_ROUTE
    assert settings_from_config(load_config(None)).route_key == K.DATA_SOURCE
    assert "data.reward_fn_key" in CONFIG_KEYS
    assert non_tensor(K.REWARD_ROUTE) in PPO_REWARD_STAGE.optional  # passed to the stage


def test_the_loop_scores_by_the_route(tokenizer, batch_factory):
    """The scorer sees the route (its ``ds`` extra), not the row's data_source label."""
    settings = RewardSettings(num_workers=1, timeout_s=5.0, reward_fn_key="task")
    scorer = load_custom_scorer(SCORERS_FILE, "echo_ground_truth")
    batch = _with_route(
        batch_factory(["x", "y"], ground_truths=["x", "z"], data_source="label"), ["t1", "t2"]
    )
    with RewardLoop(tokenizer, settings, scorer=scorer) as loop:
        result = loop.score(batch)
    assert result.extras["ds"].tolist() == ["t1", "t2"]
    assert result.scores.tolist() == [1.0, 0.0]
