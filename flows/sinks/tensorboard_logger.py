"""The ``tensorboard`` metric sink: TensorBoard event files in ``<run dir>/tensorboard``.

* Writer: ``torch.utils.tensorboard.SummaryWriter(log_dir=<run dir>/tensorboard)`` (needs the
  ``tensorboard`` package: ``pip install 'ppoflow[tensorboard]'``); view the run with
  ``tensorboard --logdir <run dir>/tensorboard``, or several runs with ``--logdir runs``.
* Metrics: ``add_scalar(name, value, step)`` for each metric of a step, the same dict MLflow
  gets, under its own name (TensorBoard tags accept ``/`` and ``@``); each name's first part
  (``actor``, ``critic``, ``timing_s``, ``val-core``) becomes a TensorBoard section.
* Config: the resolved config once, as the text summary ``config`` (a JSON block) at step 0.
* End: ``flush`` and ``close``; the status is not recorded (event files have no run state).

The run directory must be local: TensorBoard writes plain files (a remote run store is an error
that says so). Writes happen on the writer's own thread; an exception that still reaches
ppoflow retires this sink (flows/sinks/fanout.py).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

from flows.jsonable import jsonable
from flows.sinks.contract import SinkDefaults

#: the sub-directory of the run directory that holds the event files
TENSORBOARD_DIR = "tensorboard"


class TensorBoardSink(SinkDefaults):
    """Writes one training run's scalars as TensorBoard events (module docstring).

    Args:
        log_dir: the event files' directory (created).
    """

    def __init__(self, log_dir: str | os.PathLike) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.log_dir = os.fspath(log_dir)
        self._writer = SummaryWriter(log_dir=self.log_dir)

    def log_params(self, config: Any) -> None:
        text = json.dumps(jsonable(config, "config"), indent=2)
        self._writer.add_text("config", "    " + text.replace("\n", "\n    "), global_step=0)

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        for name, value in metrics.items():
            self._writer.add_scalar(name, float(value), global_step=int(step))

    def close(self, status: str = "FINISHED") -> None:
        self._writer.flush()
        self._writer.close()


def open_tensorboard_sink(cfg: Any, run_dir: str | None) -> TensorBoardSink:
    """``tensorboard`` (stages/metrics/sinks.py): a :class:`TensorBoardSink` writing to
    ``<run_dir>/tensorboard``."""
    if run_dir is None:
        raise ValueError(
            "trainer.logger: 'tensorboard' writes event files into the run directory, which is "
            "not a local path here; use a local ppoflow.artifact_dir (or --run-dir), or drop "
            "tensorboard from trainer.logger"
        )
    return TensorBoardSink(os.path.join(run_dir, TENSORBOARD_DIR))
