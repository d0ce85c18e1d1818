"""Settings the train flow does not implement yet are refused before any work, by name."""

from __future__ import annotations

from pathlib import Path

import pytest

from flows.train import check_supported
from stages.config import load_config

DEMO = Path(__file__).resolve().parents[2] / "configs" / "demo-cpu.yaml"


def test_demo_config_is_supported():
    check_supported(load_config(DEMO))


@pytest.mark.parametrize(
    ("override", "match"),
    [
        ("actor_rollout_ref.rollout.name=vllm", "rollout.name='vllm'"),
        ("algorithm.adv_estimator=remax", "remax"),
    ],
)
def test_unimplemented_settings_are_named(override, match):
    with pytest.raises(NotImplementedError, match=match):
        check_supported(load_config(DEMO, [override]))
