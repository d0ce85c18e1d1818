"""Shared fixtures of the data tests: the tiny tokenizer and small verl-layout records."""

from __future__ import annotations

import pytest

from stages.data.tokenizer import build_tiny_tokenizer


@pytest.fixture(scope="session")
def tiny_tokenizer():
    """The byte-level tokenizer of the tiny model (built in memory, no download)."""
    return build_tiny_tokenizer()


def _make_record(i: int, content: str = "hi", **overrides) -> dict:
    """A valid verl-layout record whose extra_info index is ``i``."""
    record = {
        "data_source": "test/source",
        "prompt": [{"role": "user", "content": f"{content} {i}"}],
        "ability": "test",
        "reward_model": {"style": "rule", "ground_truth": str(i)},
        "extra_info": {"index": i, "split": "train"},
    }
    record.update(overrides)
    return record


@pytest.fixture
def make_record():
    """Factory of valid verl-layout records: ``make_record(i, content="hi", **overrides)``."""
    return _make_record
