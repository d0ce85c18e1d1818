"""The console side of a training run: one compact line per step, a summary at the end (rich)."""

from __future__ import annotations

import math
import time
from typing import Any

from rich.console import Console
from rich.table import Table

SCORE = "critic/score/mean"
KL_KEYS = ("actor/reward_kl_penalty", "actor/ppo_kl")


def _fmt(value: float | None, spec: str = ".3f") -> str:
    return "-" if value is None or not math.isfinite(value) else format(value, spec)


def _clock(seconds: float) -> str:
    minutes, secs = divmod(round(seconds), 60)
    return f"{minutes}:{secs:02d}"


class Progress:
    """Prints ``step k/N │ score │ kl │ step time │ eta`` lines and the end-of-run summary."""

    def __init__(self, total_steps: int, enabled: bool = True) -> None:
        self.console = Console(highlight=False, soft_wrap=True)
        self.total = total_steps
        self.enabled = enabled
        self.start = time.perf_counter()
        self.step_times: list[float] = []

    def validation(self, step: int, score: float, metrics: dict[str, float]) -> None:
        if self.enabled:
            core = {k: v for k, v in metrics.items() if k.startswith("val-core/")}
            shown = " ".join(f"{k.removeprefix('val-core/')}={_fmt(v)}" for k, v in core.items())
            self.console.print(f"[bold]validation[/] @ step {step}: score {_fmt(score)} {shown}")

    def step(self, step: int, metrics: dict[str, float]) -> None:
        seconds = metrics.get("timing_s/step", float("nan"))
        self.step_times.append(seconds)
        if not self.enabled:
            return
        kl = next((metrics[k] for k in KL_KEYS if k in metrics), None)
        eta = (self.total - step) * (sum(self.step_times) / len(self.step_times))
        kl_part = f" │ kl {_fmt(kl, '.4f')}" if kl is not None else ""
        self.console.print(
            f"step {step}/{self.total} │ score {_fmt(metrics.get(SCORE))}{kl_part} │ "
            f"{_fmt(seconds, '.1f')} s │ eta {_clock(eta)}"
        )

    def summary(self, rows: dict[str, Any]) -> None:
        if not self.enabled:
            return
        table = Table(title="ppoflow train", show_header=False)
        rows = {"wall time": _clock(time.perf_counter() - self.start), **rows}
        for name, value in rows.items():
            table.add_row(name, value if isinstance(value, str) else _fmt(value))
        self.console.print(table)
