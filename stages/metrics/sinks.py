"""Metric sinks, looked up by ``trainer.logger``; each entry declares the package it needs.

A :class:`MetricSinkSpec` says where the sink's factory lives, which optional package it imports
and which pip extra installs that package, and whether it is the console progress display, so the
config check and the training flow ask the entry instead of comparing names:

* ``console``: the progress bar or one line per step (``shows_progress``); needs nothing.
* ``mlflow``: an MLflow run (params, metrics, artifacts, plots), logged from a process of its own
  that starts with the run (``opens_ahead``); MLflow is a dependency.
* ``wandb``: a W&B run, offline unless asked (``flows.sinks.wandb_logger``); package ``wandb``,
  extra ``wandb``.
* ``tensorboard``: event files in ``<run dir>/tensorboard`` (``flows.sinks.tensorboard_logger``);
  package ``tensorboard``, extra ``tensorboard``.

The factory is named by its import path (``"module:function"``), not held as a function: this
registry is read by the config validation, which must import neither ``flows`` nor MLflow, W&B or
TensorBoard; ``flows.sinks.fanout.open_sinks`` imports the factory when the run opens. A factory
is ``factory(cfg: PPORunConfig, run_dir: str | None) -> MetricSink`` (``run_dir``: the local run
directory, None when the run store is remote); the sink's methods are in ``flows.sinks.fanout``.

``console`` has no factory, and it is the one entry kept special: the console display is the
flow's :class:`flows.sinks.progress.Progress`, which also prints the validation lines, the resume note
and the end-of-run summary, and which times the steps on the training thread. Its entry's
``shows_progress`` switches that display on; it receives no metrics of its own.

A plugin (``ppoflow.plugins``) can add a sink with ``METRIC_SINKS.add(name, MetricSinkSpec(...))``.

Example:
    >>> METRIC_SINKS.get("wandb").extra, METRIC_SINKS.get("console").shows_progress
    ('wandb', True)
    >>> missing_package("console") is None
    True
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass

from stages.registry import Registry


@dataclass(frozen=True)
class MetricSinkSpec:
    """One ``METRIC_SINKS`` entry.

    Attributes:
        factory: ``"module:function"`` of ``function(cfg, run_dir) -> MetricSink``; None for a
            sink that has no object of its own (``console``).
        package: import name of the optional package the sink needs; None = none.
        extra: the ppoflow extra that installs ``package`` (``pip install 'ppoflow[extra]'``);
            None = install ``package`` itself (a plugin's dependency).
        shows_progress: listing it turns on the console progress display.
        opens_ahead: the factory is called when the run starts opening, before the model is
            read, instead of in the sinks phase, so that what the sink sets up in the
            background (MLflow's process, flows/sinks/mlflow_process.py) comes up beside the other
            start-up phases; nothing is sent to it before the sinks phase.
    """

    factory: str | None
    package: str | None = None
    extra: str | None = None
    shows_progress: bool = False
    opens_ahead: bool = False


METRIC_SINKS: Registry[MetricSinkSpec] = Registry("metric sink")
METRIC_SINKS.add("console", MetricSinkSpec(factory=None, shows_progress=True))
METRIC_SINKS.add(
    "mlflow", MetricSinkSpec(factory="flows.sinks.fanout:open_mlflow_sink", opens_ahead=True)
)
METRIC_SINKS.add(
    "wandb",
    MetricSinkSpec(
        factory="flows.sinks.wandb_logger:open_wandb_sink", package="wandb", extra="wandb"
    ),
)
METRIC_SINKS.add(
    "tensorboard",
    MetricSinkSpec(
        factory="flows.sinks.tensorboard_logger:open_tensorboard_sink",
        package="tensorboard",
        extra="tensorboard",
    ),
)


def is_installed(package: str) -> bool:
    """Whether ``package`` can be imported (found on the path; not imported here)."""
    return importlib.util.find_spec(package) is not None


def missing_package(name: str) -> str | None:
    """Why the sink ``name`` cannot run here (its package is not installed), or None.

    >>> missing_package("mlflow") is None
    True
    """
    spec = METRIC_SINKS.get(name)
    if spec.package is None or is_installed(spec.package):
        return None
    install = f"ppoflow[{spec.extra}]" if spec.extra else spec.package
    return f"{name!r} needs the {spec.package} package; install it with pip install '{install}'"


def shows_progress(names: list[str]) -> bool:
    """Whether one of the sinks ``names`` is the console progress display.

    >>> shows_progress(["mlflow", "console"]), shows_progress(["wandb"])
    (True, False)
    """
    return any(METRIC_SINKS.get(name).shows_progress for name in names)
