"""The ``wandb`` metric sink: one Weights & Biases run per training run, offline unless asked.

* Run: ``wandb.init(project=trainer.project_name, name=trainer.experiment_name, config=<the
  resolved config as a dict>, dir=<run dir>)``; W&B writes under ``<run dir>/wandb/``
  (``offline-run-<time>-<id>/`` offline, ``run-<time>-<id>/`` online). With a remote run store
  ``dir`` is left to W&B (``WANDB_DIR``, else the working directory).
* Mode: ``WANDB_MODE`` when the user set it. When neither ``WANDB_MODE`` nor ``WANDB_API_KEY``
  is set the run is **offline**, so a trainer on a machine without network never tries to reach
  wandb.ai unasked (a ``wandb login`` alone does not switch it online). To log online, set
  ``WANDB_MODE=online`` (or ``WANDB_API_KEY``); to upload an offline run later, run
  ``wandb sync <run dir>/wandb/offline-run-…``.
* Metrics: the same dict per step as MLflow gets, ``run.log(metrics, step=step)``, under their
  own names (W&B accepts ``/`` and ``@``; nothing is sanitized).
* End: ``run.finish(exit_code=0)`` for a finished run, ``exit_code=1`` for any other status, so
  W&B marks a failed training as failed. ``finish`` returns once W&B's service process holds
  the run; that process may write the last of ``run-<id>.wandb`` a moment later.
* Quiet by design: W&B does not capture the console (``console="off"``: ppoflow's progress bar
  and logs stay as they are) and does not sample system metrics (``x_disable_stats``), the
  settings documented for that in ``wandb.Settings`` (wandb ≥ 0.19).

Outages and errors: W&B's service process buffers and re-sends what an unreachable server did
not take; an exception that still reaches ppoflow retires this sink (flows/sinks/fanout.py).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from flows.jsonable import jsonable
from flows.sinks.contract import SinkDefaults

#: what ``wandb.init`` is given for ``settings`` (see the module docstring)
WANDB_SETTINGS = {"console": "off", "x_disable_stats": True}


def wandb_mode(environ: Mapping[str, str] = os.environ) -> str | None:
    """The mode to pass to ``wandb.init``: None (W&B reads ``WANDB_MODE``) when the user chose
    one through ``WANDB_MODE`` or ``WANDB_API_KEY``, else ``"offline"``.

    >>> wandb_mode({}), wandb_mode({"WANDB_MODE": "online"}), wandb_mode({"WANDB_API_KEY": "k"})
    ('offline', None, None)
    """
    return None if environ.get("WANDB_MODE") or environ.get("WANDB_API_KEY") else "offline"


class WandbSink(SinkDefaults):
    """Logs one training run to W&B (module docstring); ``close`` ends the W&B run.

    Args:
        project: W&B project (``trainer.project_name``).
        name: run name (``trainer.experiment_name``).
        config: the resolved config as plain data (shown as the run's config).
        run_dir: the directory W&B writes its ``wandb/`` folder into; None = W&B's default.
    """

    def __init__(
        self, project: str, name: str, config: Mapping[str, Any], run_dir: str | None
    ) -> None:
        import wandb

        self._run = wandb.init(
            project=project,
            name=name,
            config=dict(config),
            dir=run_dir,
            mode=wandb_mode(),
            settings=wandb.Settings(**WANDB_SETTINGS),
        )
        self.run_id: str | None = self._run.id

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        self._run.log(dict(metrics), step=int(step))

    def close(self, status: str = "FINISHED") -> None:
        self._run.finish(exit_code=0 if status == "FINISHED" else 1)


def open_wandb_sink(cfg: Any, run_dir: str | None) -> WandbSink:
    """``wandb`` (stages/metrics/sinks.py): a :class:`WandbSink` for the run config ``cfg``."""
    return WandbSink(
        cfg.trainer.project_name,
        cfg.trainer.experiment_name,
        jsonable(cfg, "config"),
        run_dir,
    )
