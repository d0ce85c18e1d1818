"""End-of-run plots of a training run's metric history: reward, response length and KL per step.

Input: the run's history, one dict of metrics per training step, each holding
``training/global_step`` (``TrainResult.history`` in flows/train.py); validation metrics, logged
at the steps that validated, start with ``val-core/``. Output: PNG files in a directory, one per
plot of :data:`PLOTS`, every series drawn against the global step:

=====================  ====================================================================
``reward.png``         ``critic/score/mean`` and every ``val-core/<data source>/<var>/mean@N``
``response_length.png`` ``response_length/mean``
``kl.png``             whichever of ``actor/reward_kl_penalty``, ``actor/ppo_kl``,
                       ``actor/kl_loss`` was logged
=====================  ====================================================================

A plot none of whose metrics has a finite value in the history is skipped, and the report says
why. NaN values (a statistic over an empty set) are left out of their series. Rendering uses
matplotlib's Agg canvas on a ``Figure`` object, so no GUI backend or global pyplot state is used.

matplotlib's import is the largest part of the plots' cost; a run
starts it beside its training steps with :func:`preload_renderer`, so the plots made after the
last step do not wait for it.
"""

from __future__ import annotations

import importlib
import math
import os
import re
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

STEP = "training/global_step"
VAL_CORE_MEAN = re.compile(r"val-core/.+/mean@[0-9]+")


@dataclass(frozen=True)
class PlotSpec:
    """One plot: its file name, title, y label and which metric names it draws."""

    file: str
    title: str
    ylabel: str
    names: Callable[[Sequence[str]], list[str]]  # logged names → the series to draw, in order
    wanted: str  # the metrics it looks for, in words (for the skip reason)


def _fixed(*candidates: str) -> Callable[[Sequence[str]], list[str]]:
    return lambda logged: [name for name in candidates if name in logged]


def _reward_names(logged: Sequence[str]) -> list[str]:
    validation = sorted(name for name in logged if VAL_CORE_MEAN.fullmatch(name))
    return [*_fixed("critic/score/mean")(logged), *validation]


KL_METRICS = ("actor/reward_kl_penalty", "actor/ppo_kl", "actor/kl_loss")
PLOTS = (
    PlotSpec(
        "reward.png",
        "Reward",
        "score",
        _reward_names,
        "critic/score/mean or val-core/<data source>/<var>/mean@N",
    ),
    PlotSpec(
        "response_length.png",
        "Response length",
        "tokens",
        _fixed("response_length/mean"),
        "response_length/mean",
    ),
    PlotSpec("kl.png", "KL", "KL", _fixed(*KL_METRICS), " or ".join(KL_METRICS)),
)


@dataclass
class PlotReport:
    """Which plots were written (file name → path) and which were skipped (file name → why)."""

    written: dict[str, Path] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)


def metric_series(
    history: Sequence[Mapping[str, float]], name: str
) -> tuple[list[float], list[float]]:
    """(global steps, values) of ``name`` over the steps that logged a finite value.

    Raises ``ValueError`` naming the row when a row has no ``training/global_step``.

    Example:
        >>> history = [{STEP: 1, "a": 0.5}, {STEP: 2, "a": float("nan")}, {STEP: 3, "a": 1.0}, {STEP: 4}]
        >>> metric_series(history, "a")
        ([1.0, 3.0], [0.5, 1.0])
    """
    steps, values = [], []
    for index, row in enumerate(history):
        if STEP not in row:
            raise ValueError(
                f"history row {index} has no {STEP!r} (keys: {sorted(row)[:8]}…); each row must "
                "be one step's metrics as flows.train.step_metrics returns them"
            )
        value = row.get(name)
        if value is not None and math.isfinite(value):
            steps.append(float(row[STEP]))
            values.append(float(value))
    return steps, values


#: the modules :func:`_render` imports, in the order it imports them
RENDERER_MODULES = ("matplotlib.backends.backend_agg", "matplotlib.figure", "matplotlib.ticker")


def _import_renderer() -> None:
    try:
        for module in RENDERER_MODULES:
            importlib.import_module(module)
    except ImportError:
        pass  # _render imports them again and raises where the plots are made


def preload_renderer() -> threading.Thread:
    """Import :data:`RENDERER_MODULES` in a daemon thread (started, returned).

    Python's import lock makes this safe beside other imports: a plot made before the thread is
    done waits in its own ``import`` for the module being loaded, then finds it. A failed import
    is left to :func:`_render` to raise, where the plots are made.
    """
    thread = threading.Thread(target=_import_renderer, name="ppoflow-plots-import", daemon=True)
    thread.start()
    return thread


def _render(spec: PlotSpec, series: dict[str, tuple[list[float], list[float]]], path: Path) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    figure = Figure(figsize=(7, 4), dpi=100)
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    for name, (steps, values) in series.items():
        axes.plot(steps, values, marker="o" if len(steps) <= 50 else None, markersize=3, label=name)
    axes.set(title=spec.title, xlabel="global step", ylabel=spec.ylabel)
    axes.xaxis.set_major_locator(MaxNLocator(integer=True))
    axes.grid(alpha=0.3)
    axes.legend(fontsize="small")
    figure.tight_layout()
    figure.savefig(path, format="png")


def write_run_plots(
    history: Sequence[Mapping[str, float]], out_dir: str | os.PathLike
) -> PlotReport:
    """Write the :data:`PLOTS` that the history has data for into ``out_dir`` (created).

    Returns the report of written files and skipped plots with the reason for each.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    logged = sorted({name for row in history for name in row})
    report = PlotReport()
    for spec in PLOTS:
        names = spec.names(logged)
        series = {name: metric_series(history, name) for name in names}
        series = {name: (steps, values) for name, (steps, values) in series.items() if steps}
        if not series:
            found = f"was logged only as NaN ({', '.join(names)})" if names else "was never logged"
            report.skipped[spec.file] = f"no data: {spec.wanted} {found} in {len(history)} steps"
            continue
        _render(spec, series, out / spec.file)
        report.written[spec.file] = out / spec.file
    return report
