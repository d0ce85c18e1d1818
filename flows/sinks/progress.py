"""The console side of a training run: a progress bar or one line per step, a summary at the end.

On a terminal (``console.is_terminal``) the steps drive a rich progress bar:
``train ━━━━━╸━━━ 3/10 │ score 0.412 │ ppo_kl 0.0012 │ 1.4 s/step │ eta 0:10 │ 0:07``; validation
lines print above it. Anywhere else (a log file, CI, ``| tee``) each step prints one line,
``step 3/10 │ score 0.412 │ ppo_kl 0.0012 │ 1.4 s │ eta 0:10``, so logs stay readable.

The KL column is the first of :data:`KL_COLUMNS` that the step logged, under its own name (none:
no KL column): ``ref_kl`` is the KL to the reference policy (``actor/reward_kl_penalty`` with
the KL in the reward, else ``actor/kl_loss`` with the KL loss), ``ppo_kl`` the update's KL
between the new and the old policy (``actor/ppo_kl``), which is not a KL to the reference. ETA =
remaining steps × the mean ``timing_s/step`` so far. With DAPO's dynamic sampling (a step that
logged :data:`FILTER_GENERATED`) a ``rounds N`` column follows the score: the generation rounds
the step ran (``train/num_gen_batches``). The bar starts at the first
:meth:`Progress.validation` or :meth:`Progress.step` call and stops at :meth:`Progress.close`,
which :meth:`Progress.summary` calls; a run that fails must call ``close`` itself (it is
idempotent).

With a ``logger`` (the training flow passes Prefect's ``get_run_logger()``), every step's line
and every validation line also go to it at INFO, with or without the console: that is how they
reach the flow run's logs in the Prefect UI. The logged text is the one-line form above
(:func:`step_line`, :func:`validation_line`), also while a bar is shown on the terminal.
"""

from __future__ import annotations

import logging
import math
import time
from typing import Any

from rich import progress as rich_progress
from rich.console import Console
from rich.table import Table

SCORE = "critic/score/mean"
#: (metric, column label) in order of preference: a KL to the reference first, else the update's
KL_COLUMNS = (
    ("actor/reward_kl_penalty", "ref_kl"),
    ("actor/kl_loss", "ref_kl"),
    ("actor/ppo_kl", "ppo_kl"),
)

#: logged only by a step with dynamic sampling (flows/gen_rounds.py), and its rounds
FILTER_GENERATED = "training/filter_groups/generated_samples"
GEN_ROUNDS = "train/num_gen_batches"


def _fmt(value: float | None, spec: str = ".3f") -> str:
    """``value`` in ``spec``, "-" when missing or not finite; a value that rounds to zero prints
    without a sign (``z``: a KL of -3e-7 is ``0.0000``, not ``-0.0000``)."""
    return "-" if value is None or not math.isfinite(value) else format(value, "z" + spec)


def _clock(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "-"
    minutes, secs = divmod(round(seconds), 60)
    return f"{minutes}:{secs:02d}"


def step_fields(metrics: dict[str, float], eta_seconds: float) -> dict[str, str]:
    """The formatted columns of a step: score, `` │ ref_kl …`` / `` │ ppo_kl …`` (or ""), step
    time, ETA."""
    kl = next(((metrics[k], label) for k, label in KL_COLUMNS if k in metrics), None)
    rounds = metrics.get(GEN_ROUNDS) if FILTER_GENERATED in metrics else None
    return {
        "score": _fmt(metrics.get(SCORE)),
        "rounds": "" if rounds is None else f" │ rounds {_fmt(rounds, '.0f')}",
        "kl": "" if kl is None else f" │ {kl[1]} {_fmt(kl[0], '.4f')}",
        "step_time": _fmt(metrics.get("timing_s/step", float("nan")), ".1f"),
        "eta": _clock(eta_seconds),
    }


def step_line(step: int, total: int, fields: dict[str, str]) -> str:
    """The one-line progress of a step, as printed off a terminal and logged.

    >>> step_line(3, 10, step_fields({SCORE: 0.412, "actor/ppo_kl": 0.0012,
    ...                               "timing_s/step": 1.4}, 9.8))
    'step 3/10 │ score 0.412 │ ppo_kl 0.0012 │ 1.4 s │ eta 0:10'
    >>> step_fields({"actor/kl_loss": 0.03, "actor/ppo_kl": 0.0012}, 0.0)["kl"]
    ' │ ref_kl 0.0300'
    >>> step_fields({FILTER_GENERATED: 768.0, GEN_ROUNDS: 3.0}, 0.0)["rounds"]
    ' │ rounds 3'
    """
    return (
        f"step {step}/{total} │ score {fields['score']}{fields['rounds']}{fields['kl']} │ "
        f"{fields['step_time']} s │ eta {fields['eta']}"
    )


def validation_line(step: int, score: float, metrics: dict[str, float]) -> str:
    """The validation line: the mean score and each ``val-core/…`` metric (prefix dropped).

    >>> validation_line(25, 0.291, {"val-core/demo/reward/mean@1": 0.291, "val-aux/x": 1.0})
    'validation @ step 25: score 0.291 demo/reward/mean@1=0.291'
    """
    core = {k: v for k, v in metrics.items() if k.startswith("val-core/")}
    shown = " ".join(f"{k.removeprefix('val-core/')}={_fmt(v)}" for k, v in core.items())
    return f"validation @ step {step}: score {_fmt(score)} {shown}".rstrip()


def _bar(console: Console) -> rich_progress.Progress:
    column = rich_progress.TextColumn
    return rich_progress.Progress(
        column("[bold]train"),
        rich_progress.BarColumn(),
        rich_progress.MofNCompleteColumn(),
        column("│ score {task.fields[score]}{task.fields[rounds]}{task.fields[kl]}"),
        column("│ {task.fields[step_time]} s/step │ eta {task.fields[eta]} │"),
        rich_progress.TimeElapsedColumn(),
        console=console,
        refresh_per_second=2,
    )


class Progress:
    """Step progress of a training run (module docstring) and the end-of-run summary table.

    Args:
        total_steps: the step count N of ``k/N`` and the ETA.
        enabled: False prints nothing (``console`` not in ``trainer.logger``).
        console: where to print (default: a new rich Console on stdout); the bar is used when
            ``console.is_terminal``.
        logger: where the step and validation lines are also logged at INFO (None: nowhere),
            whether or not ``enabled``.
    """

    def __init__(
        self,
        total_steps: int,
        enabled: bool = True,
        console: Console | None = None,
        logger: logging.Logger | logging.LoggerAdapter | None = None,
    ):
        self.console = console or Console(highlight=False, soft_wrap=True)
        self.total = total_steps
        self.enabled = enabled
        self.logger = logger
        self.start = time.perf_counter()
        self.step_times: list[float] = []
        self._bar: rich_progress.Progress | None = None
        self._task: rich_progress.TaskID | None = None

    @property
    def uses_bar(self) -> bool:
        """Whether steps drive a live bar (enabled, on a terminal) instead of printing lines."""
        return self.enabled and self.console.is_terminal

    def validation(self, step: int, score: float, metrics: dict[str, float]) -> None:
        line = validation_line(step, score, metrics)
        if self.logger is not None:
            self.logger.info(line)
        if not self.enabled:
            return
        self._start_bar(completed=step)
        self.console.print(line.replace("validation", "[bold]validation[/]", 1))

    def warning(self, line: str) -> None:
        """A warning line about the run (a step without learning signal): logged at WARNING,
        and printed above the bar when enabled."""
        if self.logger is not None:
            self.logger.warning(line)
        if not self.enabled:
            return
        self.console.print(f"[bold yellow]warning[/]: {line}")

    def step(self, step: int, metrics: dict[str, float]) -> None:
        self.step_times.append(metrics.get("timing_s/step", float("nan")))
        fields = step_fields(metrics, self.eta_seconds(step))
        if self.logger is not None:
            self.logger.info(step_line(step, self.total, fields))
        if not self.enabled:
            return
        if self.uses_bar:
            self._start_bar(completed=step - 1)
            self._bar.update(self._task, completed=step, **fields)
            return
        self.console.print(step_line(step, self.total, fields))

    def eta_seconds(self, step: int) -> float:
        """(total − step) × the mean step time so far (NaN until a step time is known)."""
        known = [t for t in self.step_times if math.isfinite(t)]
        mean = sum(known) / len(known) if known else float("nan")
        return (self.total - step) * mean if step < self.total else 0.0

    def close(self) -> None:
        """Stop the bar (leaving its last state on screen); a no-op without one."""
        if self._bar is not None:
            self._bar.stop()
            self._bar = None

    def summary(self, rows: dict[str, Any]) -> None:
        """Close the bar and print the summary table (wall time first, then ``rows``); with a
        logger, also log it as one line (``ppoflow train: wall time 0:12 │ steps 2 │ …``)."""
        self.close()
        rows = {"wall time": _clock(time.perf_counter() - self.start), **rows}
        cells = {
            name: value if isinstance(value, str) else _fmt(value) for name, value in rows.items()
        }
        if self.logger is not None:
            self.logger.info("ppoflow train: " + " │ ".join(f"{k} {v}" for k, v in cells.items()))
        if not self.enabled:
            return
        table = Table(title="ppoflow train", show_header=False)
        for name, value in cells.items():
            table.add_row(name, value)
        self.console.print(table)

    def _start_bar(self, completed: int) -> None:
        if self._bar is not None or not self.uses_bar:
            return
        self._bar = _bar(self.console)
        fields = {"score": "-", "rounds": "", "kl": "", "step_time": "-", "eta": "-"}
        self._task = self._bar.add_task("train", total=self.total, completed=completed, **fields)
        self._bar.start()
