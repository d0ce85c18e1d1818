"""Bad reward files (``reward.custom_reward_function.path`` / ``.name``).

A file that is missing, does not import or lacks the function fails at start-up, when the
scorer workers' zygote imports it, before any rollout: one line naming the file and the scorer's
own error, exit status 1. A scorer that loads but fails on every sample (wrong signature,
``None``, a string, NaN) is found at step 1's reward stage: with the default
``reward.max_invalid_fraction=1`` the run stops with the counts, the first failure and its
uid, and no reward artifact or checkpoint is written (slow: these run a rollout).
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = pytest.mark.usefixtures("prefect_harness")

SCORE = "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"

# (test id, what the input is, the file's text or None, the .name override or None, needles)
AT_START = [
    ("missing-file", "a reward file that does not exist", None, None,
     ["custom reward file '", "' does not exist (set reward.custom_reward_function.path to an "
      "existing .py file)"]),
    ("syntax-error", "a reward file with a syntax error", "def compute_score(:\n", None,
     ["could not be loaded: SyntaxError: invalid syntax (score.py, line 1)"]),
    ("import-error", "a reward file importing a module that is not installed",
     "import no_such_module\n" + SCORE + "    return 1.0\n", None,
     ["could not be loaded: ModuleNotFoundError: No module named 'no_such_module'"]),
    ("raises-at-import", "a reward file that raises while it is imported",
     "raise RuntimeError('needs the GPU box')\n", None,
     ["could not be loaded: RuntimeError: needs the GPU box"]),
    ("missing-function", "a reward file without compute_score",
     "def other(*args, **kwargs):\n    return 1.0\n", None,
     ["score.py:compute_score could not be loaded: AttributeError: scorer 'compute_score' not "
      "found in ", "it defines: ['other']"]),
    ("missing-named-function", "reward.custom_reward_function.name naming no function",
     SCORE + "    return 1.0\n", "score_it",
     ["score.py:score_it could not be loaded", "scorer 'score_it' not found in ",
      "it defines: ['compute_score']"]),
]  # fmt: skip


@pytest.mark.parametrize(
    ("described", "text", "name", "needles"), [pytest.param(*c[1:], id=c[0]) for c in AT_START]
)
def test_a_bad_reward_file_stops_the_start(
    ppoflow, expect, demo, tmp_path, described, text, name, needles
):
    scorer = tmp_path / "score.py"
    if text is not None:
        scorer.write_text(text)
    extra = [f"reward.custom_reward_function.path={scorer}"]
    if name is not None:
        extra.append(f"reward.custom_reward_function.name={name}")
    result = ppoflow(
        "train", "demo-cpu", *demo.overrides(tmp_path, *extra), "--run-dir", tmp_path / "run"
    )
    expect(result, 1, str(scorer), *needles, input=described)
    assert not list((tmp_path / "run").glob("step_*"))  # no rollout was made
    assert not (tmp_path / "checkpoints").exists()


# (test id, what the input is, the scorer's body, needles)
EVERY_SAMPLE = [
    ("wrong-signature", "a scorer with the wrong signature (fails on every sample)",
     "def compute_score(solution_str):\n    return 1.0\n",
     ["(8 error)", "error: raised TypeError: compute_score() got an unexpected keyword "
      "argument 'data_source'"]),
    ("returns-none", "a scorer returning None for every sample", SCORE + "    return None\n",
     ["(8 invalid)", "invalid: returned NoneType None; expected a finite number or a dict "
      "with 'score'"]),
    ("returns-str", "a scorer returning a string for every sample",
     SCORE + "    return 'good'\n", ["(8 invalid)", "invalid: returned str 'good'"]),
    ("returns-nan", "a scorer returning NaN for every sample",
     SCORE + "    return float('nan')\n", ["(8 invalid)", "invalid: returned float nan"]),
]  # fmt: skip


@pytest.mark.slow
@pytest.mark.usefixtures("as_without_a_server")
@pytest.mark.parametrize(
    ("described", "text", "needles"), [pytest.param(*c[1:], id=c[0]) for c in EVERY_SAMPLE]
)
def test_a_scorer_failing_on_every_sample_stops_the_run(
    ppoflow, expect, console, demo, tmp_path, described, text, needles
):
    scorer = tmp_path / "score.py"
    scorer.write_text(text)
    result = ppoflow(
        "train", "demo-cpu",
        *demo.overrides(tmp_path, f"reward.custom_reward_function.path={scorer}"),
        "--run-dir", tmp_path / "run",
    )  # fmt: skip
    expect(result, 1, f"reward scorer {scorer}:compute_score failed on 8 of 8 samples",
           "reward.max_invalid_fraction=1 stops the run", "First failure, uid='", *needles,
           input=described, console=console())  # fmt: skip
    step = Path(tmp_path / "run" / "step_1")
    assert (step / "rollout" / "manifest.json").is_file()  # what ran before the reward stays
    assert not (step / "reward").exists()
    assert not (tmp_path / "checkpoints").exists()
