"""Route A: the reward loop's concurrency, timeouts, failure accounting, decoding and extras."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest

from stages.reward.custom import DEFAULT_SCORER, load_custom_scorer
from stages.reward.loop import RewardLoop
from stages.reward.settings import RewardSettings

SCORERS_FILE = Path(__file__).with_name("scorers_for_tests.py")


def calls_for(solutions: list[str]) -> list[dict]:
    return [
        {"data_source": "test/source", "solution_str": s, "ground_truth": "", "extra_info": None}
        for s in solutions
    ]


def test_hung_samples_time_out_without_stalling(script_loop):
    solutions = ["sleep" if i % 10 == 3 else str(i) for i in range(50)]
    uids = [f"u{i}" for i in range(50)]
    start = time.monotonic()
    result = script_loop.score_calls(calls_for(solutions), uids)
    elapsed = time.monotonic() - start
    assert result.counts == {"error": 0, "timeout": 5, "invalid": 0}
    assert elapsed < 30
    for i, score in enumerate(result.scores.tolist()):
        assert score == (-1.0 if i % 10 == 3 else float(i))
    assert [o.status for o in result.outcomes].count("timeout") == 5


def test_failures_are_counted_scored_and_logged_once(script_loop, caplog):
    solutions = ["1", "raise", "nan", "inf", "str", "nodict", "2"]
    uids = [f"id{i}" for i in range(len(solutions))]
    with caplog.at_level(logging.WARNING, logger="stages.reward.loop"):
        result = script_loop.score_calls(calls_for(solutions), uids)
    assert result.counts == {"error": 1, "timeout": 0, "invalid": 4}
    assert result.scores.tolist() == [1.0, -1.0, -1.0, -1.0, -1.0, -1.0, 2.0]
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 5
    for uid in ("id1", "id2", "id3", "id4", "id5"):
        assert sum(f"uid={uid} " in m for m in messages) == 1
    assert all("data_source=test/source" in m for m in messages)
    assert "ValueError: scripted failure" in messages[0]


def test_result_that_cannot_be_sent_back_is_invalid_alone(script_loop):
    result = script_loop.score_calls(calls_for(["1", "unpicklable", "2"]), [0, 1, 2])
    assert result.scores.tolist() == [1.0, -1.0, 2.0]
    assert result.counts == {"error": 0, "timeout": 0, "invalid": 1}
    assert "could not be sent back" in result.outcomes[1].message


def test_dead_worker_is_replaced_and_the_rest_scored(script_loop):
    pool = script_loop.pool
    before = pool.restarts
    solutions = [str(i) for i in range(10)] + ["die"] + [str(i) for i in range(10, 20)]
    result = script_loop.score_calls(calls_for(solutions), list(range(len(solutions))))
    assert result.counts["error"] == 1
    assert "died (exit code 3)" in result.outcomes[10].message
    assert pool.restarts == before + 1
    expected = [float(i) for i in range(10)] + [-1.0] + [float(i) for i in range(10, 20)]
    assert result.scores.tolist() == expected
    assert script_loop.score_calls(calls_for(["5"]), [0]).scores.tolist() == [5.0]  # still serving


def test_extras_dict_and_scalar_results(script_loop):
    result = script_loop.score_calls(calls_for(["dict:0.5", "3", "raise"]), [0, 1, 2])
    assert list(result.extras) == ["score", "pred", "acc"]
    assert result.extras["score"].tolist() == [0.5, None, None]
    assert result.extras["pred"].tolist() == ["0.5", None, None]
    assert result.extras["acc"].tolist() == [None, 3.0, None]
    assert result.scores.tolist() == [0.5, 3.0, -1.0]


def test_score_decodes_only_valid_response_tokens(tokenizer, batch_factory):
    scorer = load_custom_scorer(SCORERS_FILE, "echo_ground_truth")
    with RewardLoop(tokenizer, RewardSettings(num_workers=1, timeout_s=5.0), scorer=scorer) as loop:
        batch = batch_factory(["abc", "ab", "#### 7"], ground_truths=["abc", "abc", "#### 7"])
        result = loop.score(batch)
    assert result.scores.tolist() == [1.0, 0.0, 1.0]  # EOS and padding are not in solution_str
    assert result.extras["ds"].tolist() == ["test/source"] * 3
    assert [e["index"] for e in result.extras["extra"]] == [0, 1, 2]


def test_prompt_is_decoded_when_the_scorer_asks(tokenizer, batch_factory):
    scorer = load_custom_scorer(SCORERS_FILE, "score_with_prompt")
    with RewardLoop(tokenizer, RewardSettings(num_workers=1, timeout_s=5.0), scorer=scorer) as loop:
        assert loop.wants_prompt
        batch = batch_factory(["hello", "nope", "x"], prompts=["hello", "yes", "x"])
        assert loop.score(batch).scores.tolist() == [1.0, 0.0, 1.0]


def test_async_scorer_runs_in_the_workers_under_the_timeout(tokenizer):
    scorer = load_custom_scorer(SCORERS_FILE, "async_compute_score")
    settings = RewardSettings(num_workers=2, timeout_s=0.3, error_score=-2.0)
    with RewardLoop(tokenizer, settings, scorer=scorer) as loop:
        assert loop.is_async
        restarts = loop.pool.restarts
        result = loop.score_calls(calls_for(["1", "sleep", "raise", "sleep", "4"]), list(range(5)))
        assert loop.pool.restarts == restarts + 2  # each hung await killed its worker
    assert result.scores.tolist() == [1.0, -2.0, -2.0, -2.0, 4.0]
    assert result.counts == {"error": 1, "timeout": 2, "invalid": 0}


def test_default_router_end_to_end_and_unknown_source(tokenizer, batch_factory):
    with RewardLoop(
        tokenizer, RewardSettings(num_workers=1, timeout_s=5.0), scorer=DEFAULT_SCORER
    ) as loop:
        batch = batch_factory(
            ["#### 7", "#### 8"], ground_truths=["7", "7"], data_source="openai/gsm8k"
        )
        result = loop.score(batch)
        assert result.scores.tolist() == [1.0, 0.0]
        assert result.extras["acc"].tolist() == [1.0, 0.0]
        with pytest.raises(KeyError, match="unknown/source"):  # before any sample is scored
            loop.score(batch_factory(["1"], data_source="unknown/source"))


def test_missing_ground_truth_is_a_clear_error(script_loop, batch_factory):
    batch = batch_factory(["1"])
    batch.non_tensor_batch["reward_model"][0] = {"style": "rule"}
    with pytest.raises(KeyError, match=r"row 0 \(uid 'u0'\).*ground_truth"):
        script_loop.score(batch)
