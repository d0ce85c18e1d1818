"""The ``ppoflow`` executable: start what the command will wait for, then run the command line.

A training command (``train``, ``resume``) launches Prefect's temporary server
(flows/process/prefect_server.py) and the MLflow process (flows/sinks/mlflow_process.py) before the command
line's modules import torch, transformers and Prefect, so they come up beside those imports
instead of after them — once its arguments parse and its config file is there
(``check_command_line``): a usage error answers without them. Every other command goes straight
to the command line (flows/cli/app.py), whose modules import torch only when a command runs.
"""

from __future__ import annotations

import atexit
import gc
import sys


def main() -> None:
    """``ppoflow …`` (pyproject's console script).

    The interpreter's last act is a garbage collection over every object left (torch,
    transformers, Prefect, MLflow: seconds after a demo training, after its last line).
    Registered first, so it runs after every other exit handler (Prefect's last logs,
    MLflow's run end, the temporary server's stop), :func:`gc.freeze` moves those objects out of
    the collector's reach, so the process ends without that pass; objects are still released
    by their reference counts.

    A training command runs with Python's cyclic collector off until its first step
    (flows/process/start_up_gc.py: a quarter to a third of the imports' time).
    """
    atexit.register(gc.freeze)
    from flows.process.own_process import prepare_own_process

    prepare_own_process()  # telemetry off, service waits, skipped imports: before the libraries
    from flows.process.prefect_server import is_flow_command, start_ahead_for

    if is_flow_command(sys.argv[1:]):
        from flows.cli.app import check_command_line
        from flows.process.start_up_gc import pause

        check_command_line(sys.argv[1:])  # a usage error answers before anything starts
        from flows.sinks.mlflow_process import start_ahead as start_mlflow_ahead

        pause()  # until the first step (flows/process/start_up_gc.py)
        start_ahead_for(sys.argv[1:])
        start_mlflow_ahead()
    from flows.cli.app import app

    app()


__all__ = ["main"]
