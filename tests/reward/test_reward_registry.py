"""data_source routing of the built-in scorers."""

from __future__ import annotations

import pytest

from stages.reward.scorers.registry import (
    SCORERS,
    check_data_sources,
    default_compute_score,
    get_scorer,
)


def test_gsm8k_and_math_routes():
    assert default_compute_score("openai/gsm8k", "#### 7", "7") == 1.0
    assert default_compute_score("openai/gsm8k", "#### 8", "7") == 0.0
    for name in ("lighteval/MATH", "DigitalLearningGmbH/MATH-lighteval", "HuggingFaceH4/MATH-500"):
        assert (
            default_compute_score(name, r"\boxed{\frac{1}{2}}", "0.5", extra_info={"a": 1}) == 1.0
        )


def test_demo_task_route():
    from stages.data import demo_task

    result = default_compute_score(demo_task.DATA_SOURCE, "c", "c")
    assert result == demo_task.compute_score(demo_task.DATA_SOURCE, "c", "c")
    assert demo_task.DATA_SOURCE in SCORERS


def test_unknown_data_source_names_it_and_the_known_ones():
    with pytest.raises(KeyError) as info:
        default_compute_score("my/dataset", "x", "y")
    assert "my/dataset" in str(info.value) and "openai/gsm8k" in str(info.value)
    with pytest.raises(KeyError, match="my/other"):
        check_data_sources(["openai/gsm8k", "my/other"])


@pytest.mark.parametrize(
    "name",
    [
        "math_dapo",
        "math",
        "aime2024",
        "numina_olympiads",
        "apps",
        "hiyouga/geometry3k",
        "searchR1_nq",
    ],
)
def test_verl_scorers_not_shipped(name):
    with pytest.raises(NotImplementedError, match="does not ship") as info:
        get_scorer(name)
    assert "custom_reward_function.path" in str(info.value)


def test_result_conversion(monkeypatch):
    entries = SCORERS._entries  # registered for this test only
    monkeypatch.setitem(entries, "test/int-result", lambda ds, s, gt, extra: 3)
    monkeypatch.setitem(entries, "test/list-result", lambda ds, s, gt, extra: [0.25, "x"])
    monkeypatch.setitem(
        entries, "test/dict-result", lambda ds, s, gt, extra: {"score": 1, "acc": True}
    )
    assert default_compute_score("test/int-result", "", "") == 3.0
    assert isinstance(default_compute_score("test/int-result", "", ""), float)
    assert default_compute_score("test/list-result", "", "") == 0.25
    assert default_compute_score("test/dict-result", "", "") == {"score": 1, "acc": True}
