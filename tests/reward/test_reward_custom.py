"""Custom scorer files: loaded and checked at start-up, clear errors for what is missing."""

from __future__ import annotations

import pickle
import sys
from pathlib import Path

import pytest

from stages.reward.custom import (
    DEFAULT_SCORER,
    ScorerRef,
    is_async_scorer,
    load_custom_scorer,
    scorer_ref,
    wants_prompt,
)
from stages.reward.loop import RewardLoop
from stages.reward.settings import RewardSettings
from stages.reward.zygote import ScorerStartupError

SCORERS_FILE = Path(__file__).with_name("scorers_for_tests.py")


def test_load_and_resolve():
    ref = load_custom_scorer(SCORERS_FILE, "compute_score")
    fn = ref.resolve()
    assert fn("x", "2.5", None) == 2.5
    assert pickle.loads(pickle.dumps(ref)) == ref  # travels to worker processes
    assert ref.resolve() is fn  # the file is imported once per process
    assert scorer_ref(None) == DEFAULT_SCORER
    assert is_async_scorer(load_custom_scorer(SCORERS_FILE, "async_compute_score").resolve())
    assert wants_prompt(load_custom_scorer(SCORERS_FILE, "score_with_prompt").resolve())
    assert not wants_prompt(fn)


def test_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"nope\.py"):
        load_custom_scorer(tmp_path / "nope.py")


def test_missing_function_lists_what_exists():
    with pytest.raises(AttributeError, match="'no_such_fn' not found") as info:
        load_custom_scorer(SCORERS_FILE, "no_such_fn")
    assert "compute_score" in str(info.value)


def test_not_callable():
    with pytest.raises(TypeError, match="not a function"):
        load_custom_scorer(SCORERS_FILE, "NOT_A_FUNCTION")


def test_file_that_fails_to_import(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("def compute_score(:\n")
    with pytest.raises(ImportError, match="failed to import"):
        load_custom_scorer(bad)


def test_reward_loop_fails_at_construction(tokenizer, tmp_path):
    settings = RewardSettings(num_workers=1, custom_path=str(SCORERS_FILE), custom_name="missing")
    with pytest.raises(ScorerStartupError, match="AttributeError: scorer 'missing' not found"):
        RewardLoop(tokenizer, settings)
    with pytest.raises(FileNotFoundError):
        RewardLoop(tokenizer, RewardSettings(num_workers=1, custom_path=str(tmp_path / "x.py")))


def test_scorer_ref_names_the_file_without_importing_it(tmp_path):
    never = tmp_path / "never_imported.py"
    never.write_text("raise SystemExit('imported')\n")
    ref = scorer_ref(never, "compute_score")
    assert ref == ScorerRef("compute_score", path=str(never.resolve()))
    assert not any(getattr(m, "__file__", None) == str(never) for m in list(sys.modules.values()))
    with pytest.raises(FileNotFoundError, match="does not exist"):
        scorer_ref(tmp_path / "absent.py")


def test_ref_of_functions():
    from stages.reward.scorers import gsm8k

    assert ScorerRef.of(gsm8k.compute_score) == ScorerRef("compute_score", module=gsm8k.__name__)
    with pytest.raises(ValueError, match="cannot be re-imported"):
        ScorerRef.of(lambda *a: 0.0)
    with pytest.raises(ValueError, match="exactly one"):
        ScorerRef("f")
