"""flows.sinks.progress: one line per step off a terminal, a rich bar on one, always closed at the end."""

from __future__ import annotations

import math
import re
from io import StringIO

from rich.console import Console

from flows.sinks.progress import Progress

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def step_metrics(score: float, seconds: float, **extra: float) -> dict[str, float]:
    return {"critic/score/mean": score, "timing_s/step": seconds, **extra}


def console(terminal: bool) -> tuple[Console, StringIO]:
    out = StringIO()
    return Console(file=out, force_terminal=terminal, width=140, highlight=False), out


def test_off_a_terminal_each_step_prints_one_line_with_score_kl_time_and_eta():
    con, out = console(terminal=False)
    progress = Progress(4, console=con)
    progress.validation(0, 0.125, {"val-core/demo/reward/mean@1": 0.125})
    progress.step(1, step_metrics(0.5, 2.0, **{"actor/ppo_kl": 0.00123}))
    progress.step(2, step_metrics(0.25, 4.0))
    lines = out.getvalue().splitlines()
    assert not progress.uses_bar
    assert lines == [
        "validation @ step 0: score 0.125 demo/reward/mean@1=0.125",
        "step 1/4 │ score 0.500 │ ppo_kl 0.0012 │ 2.0 s │ eta 0:06",
        "step 2/4 │ score 0.250 │ 4.0 s │ eta 0:06",  # (4 − 2) × mean(2, 4)
    ]


def test_on_a_terminal_the_bar_shows_step_score_kl_time_and_eta_and_is_closed_by_summary():
    con, out = console(terminal=True)
    progress = Progress(3, console=con)
    assert progress.uses_bar
    progress.validation(0, 0.0, {})
    progress.step(1, step_metrics(0.5, 3.0, **{"actor/reward_kl_penalty": 0.0421}))
    progress.validation(1, 0.75, {})
    progress.step(2, step_metrics(0.625, 1.0, **{"actor/reward_kl_penalty": 0.0123}))
    progress.summary({"steps": "2"})
    assert progress._bar is None  # stopped
    text = ANSI.sub("", out.getvalue())
    last_bar = [line for line in text.splitlines() if "train" in line and "/3" in line][-1]
    assert "2/3" in last_bar and "score 0.625" in last_bar and "ref_kl 0.0123" in last_bar
    assert "1.0 s/step" in last_bar and "eta 0:02" in last_bar  # 1 step × mean(3, 1) s
    assert "validation @ step 1: score 0.750" in text
    assert "step 2/3 │" not in text  # no per-step lines on a terminal
    assert "ppoflow train" in text  # the summary table


def test_close_is_idempotent_and_a_failed_run_leaves_no_live_display():
    con, _ = console(terminal=True)
    progress = Progress(5, console=con)
    progress.step(1, step_metrics(0.5, 1.0))
    assert con._live_stack  # the bar is live
    progress.close()
    progress.close()
    assert not con._live_stack


def test_disabled_prints_nothing_and_starts_no_bar():
    con, out = console(terminal=True)
    progress = Progress(2, enabled=False, console=con)
    progress.validation(0, 0.5, {})
    progress.step(1, step_metrics(0.5, 1.0))
    progress.summary({"steps": "1"})
    assert out.getvalue() == "" and progress._bar is None


def test_eta_is_nan_until_a_step_time_is_known_and_zero_at_the_last_step():
    progress = Progress(3, enabled=False)
    assert math.isnan(progress.eta_seconds(0))
    progress.step(1, {"timing_s/step": math.nan})
    assert math.isnan(progress.eta_seconds(1))
    progress.step(2, {"timing_s/step": 2.0})
    assert progress.eta_seconds(2) == 2.0 and progress.eta_seconds(3) == 0.0


def test_a_kl_that_rounds_to_zero_prints_without_a_sign():
    """Old log-probs reused from the rollout differ from the update's by float rounding, so the
    first mini-batch's KL is a tiny negative or positive number: both print as 0.0000."""
    con, out = console(terminal=False)
    progress = Progress(2, console=con)
    progress.step(1, step_metrics(0.5, 1.0, **{"actor/ppo_kl": -3e-7}))
    progress.step(2, step_metrics(0.5, 1.0, **{"actor/ppo_kl": -0.0123}))
    first, second = out.getvalue().splitlines()
    assert "│ ppo_kl 0.0000 │" in first and "│ ppo_kl -0.0123 │" in second
