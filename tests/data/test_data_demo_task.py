"""The demo task: generator, verl-layout files, and the scorer's partial credit and prompt dependence."""

from __future__ import annotations

import itertools

import pytest

from dataproto import keys
from stages.data.dataset import load_prompt_rows
from stages.data.demo_task import (
    DATA_SOURCE,
    DEFAULT_ALPHABET,
    NEAR_CREDIT,
    STOP_SPAN,
    STOP_WEIGHT,
    char_credit,
    compute_score,
    make_demo_data,
    make_demo_rows,
)
from stages.data.tokenize import load_prompt_dataset


def _score(response: str, answer: str) -> float:
    return compute_score(DATA_SOURCE, response, answer)["score"]


def test_exact_answer_with_stop_scores_one():
    assert compute_score(DATA_SOURCE, "c", "c") == {"score": 1.0, "acc": 1.0, "pred": "c"}
    assert compute_score(DATA_SOURCE, "abc", "abc")["score"] == 1.0


def _kept(extra: int) -> float:
    """The share of the match a response keeps with ``extra`` characters after the answer."""
    return 1 - STOP_WEIGHT * min(1, extra / STOP_SPAN)


def test_partial_credit_orders_responses():
    # exact > exact repeated (no stop) > exact then junk > neighbour letter > far letter > junk
    ranked = ["c", "cc", "cq", "d", "dq", "g", "~", ""]
    scores = [_score(r, "c") for r in ranked]
    assert scores == sorted(scores, reverse=True)
    assert scores[1] == pytest.approx(_kept(1))
    assert scores[2] == pytest.approx(_kept(1) / 2)
    assert scores[3] == pytest.approx(NEAR_CREDIT * (1 - 1 / 4))
    assert scores[5:] == [0.0, 0.0, 0.0]
    assert compute_score(DATA_SOURCE, "dq", "c")["acc"] == 0.0
    assert compute_score(DATA_SOURCE, "cq", "c")["acc"] == 1.0


def test_every_extra_character_costs_until_the_span():
    """The length loss is graded: a response that stops earlier always scores more, so a
    sampled early stop is rewarded (the flat loss it replaces left the letter repeated to the
    limit as the policy's answer)."""
    repeats = [_score("c" * n, "c") for n in range(1, 20)]
    assert repeats == sorted(repeats, reverse=True)
    assert repeats[0] == 1.0 and repeats[1] < 1.0
    assert _score("c" * (1 + STOP_SPAN), "c") == pytest.approx(1 - STOP_WEIGHT)
    assert _score("c" * (5 + STOP_SPAN), "c") == pytest.approx(1 - STOP_WEIGHT), "capped"
    assert _score("c" * 16, "c") < _score("c" * 15, "c") < _score("c", "c")


def test_every_character_is_scored_against_the_repeated_answer():
    assert _score("cccc", "c") == pytest.approx(_kept(3))
    assert _score("cxyz", "c") == pytest.approx(_kept(3) / 4)
    assert _score("abcab", "abc") == pytest.approx(_kept(2))
    assert _score("abcxx", "abc") == pytest.approx(_kept(2) * 3 / 5)


def test_position_wise_credit_for_longer_answers():
    assert _score("abX", "abc") == pytest.approx(2 / 3)
    assert _score("ab", "abc") == pytest.approx(2 / 3), "a short response loses the missing letter"
    assert compute_score(DATA_SOURCE, "abcd", "abc")["acc"] == 1.0


def test_cyclic_credit_is_symmetric():
    for a, b in itertools.product(DEFAULT_ALPHABET, repeat=2):
        assert char_credit(a, b) == char_credit(b, a)
    assert char_credit("h", "a") == char_credit("b", "a")


def test_constant_answer_cannot_score_well():
    """Every constant answer scores exactly like random letters: the prompt must be read."""
    k = len(DEFAULT_ALPHABET)
    chance = (1 + NEAR_CREDIT * (k // 2 - 1)) / k
    per_constant = {
        c: sum(_score(c, target) for target in DEFAULT_ALPHABET) / k for c in DEFAULT_ALPHABET
    }
    assert all(value == pytest.approx(chance) for value in per_constant.values())
    assert chance < 0.35
    accuracy = {
        c: sum(compute_score(DATA_SOURCE, c, t)["acc"] for t in DEFAULT_ALPHABET) / k
        for c in DEFAULT_ALPHABET
    }
    assert max(accuracy.values()) == pytest.approx(1 / k)
    copier = sum(_score(t, t) for t in DEFAULT_ALPHABET) / k
    assert copier == 1.0
    for long_constant in ("aaaaaaaa", "abcdefgh", "hq~a"):
        mean = sum(_score(long_constant, t) for t in DEFAULT_ALPHABET) / k
        assert mean <= chance + 1e-12


def test_random_groups_differ_far_more_often_than_with_exact_match():
    """GRPO learns only from groups whose 4 scores differ: the near-miss credit makes such groups
    from a uniformly random byte policy far more frequent than an exact-match reward does."""
    import random

    rng = random.Random(0)
    tokens = [chr(b) for b in range(256)]
    shaped = exact = 0
    for _ in range(2000):
        target = rng.choice(DEFAULT_ALPHABET)
        responses = ["".join(rng.choices(tokens, k=16)) for _ in range(4)]
        shaped += len({_score(r, target) for r in responses}) > 1
        exact += len({r[0] == target for r in responses}) > 1
    assert shaped > 20 * exact
    assert shaped / 2000 > 0.6


def test_scorer_rejects_other_sources_and_bad_truth():
    with pytest.raises(ValueError, match="demo scorer got data_source='openai/gsm8k'"):
        compute_score("openai/gsm8k", "a", "a")
    with pytest.raises(ValueError, match="expected letters of"):
        compute_score(DATA_SOURCE, "a", "z")
    assert compute_score(DATA_SOURCE, "z", "z", {"alphabet": "xyz"})["score"] == 1.0


def test_rows_depend_on_seed_and_answers_sit_in_the_prompt():
    rows = make_demo_rows(50, seed=1, split="train")
    assert rows == make_demo_rows(50, seed=1, split="train")
    assert rows != make_demo_rows(50, seed=2, split="train")
    for row in rows:
        answer = row["reward_model"]["ground_truth"]
        assert row["prompt"] == [{"role": "user", "content": f"copy: {answer}"}]
        assert answer in DEFAULT_ALPHABET and row["data_source"] == DATA_SOURCE
    assert len({r["reward_model"]["ground_truth"] for r in rows}) == len(DEFAULT_ALPHABET)
    with pytest.raises(ValueError, match="without repeats"):
        make_demo_rows(3, seed=0, split="train", alphabet="aa")


def test_make_demo_data_writes_loadable_splits(tmp_path, tiny_tokenizer):
    train, val = make_demo_data(tmp_path, n_train=20, n_val=6, seed=0, answer_length=2)
    assert (train.name, val.name) == ("train.parquet", "val.parquet")
    rows = load_prompt_rows(train)
    assert len(rows) == 20 and len(load_prompt_rows(val)) == 6
    assert rows[3].extra_info == {"split": "train", "index": 3, "alphabet": DEFAULT_ALPHABET}
    dataset = load_prompt_dataset(val, tiny_tokenizer, max_prompt_length=16)
    batch = dataset.collate(range(6))
    assert batch.non_tensor_batch[keys.DATA_SOURCE].tolist() == [DATA_SOURCE] * 6
    assert (
        batch.batch[keys.ATTENTION_MASK].sum(-1).tolist() == [10] * 6
    )  # <|user|>copy: ab<|assistant|>
