"""Settings the train flow does not implement yet are refused before any work, by name."""

from __future__ import annotations

from pathlib import Path

import pytest

from flows.train import check_supported
from stages.config import load_config

DEMO = Path(__file__).resolve().parents[2] / "configs" / "demo-cpu.yaml"


def test_demo_config_is_supported():
    check_supported(load_config(DEMO))


def test_remax_is_named_as_not_implemented():
    with pytest.raises(NotImplementedError, match="remax"):
        check_supported(load_config(DEMO, ["algorithm.adv_estimator=remax"]))


def test_the_vllm_rollout_is_supported():
    check_supported(load_config(DEMO, ["actor_rollout_ref.rollout.name=vllm"]))
