"""What a ppoflow process sets for itself before the libraries it drives read their settings.

Importing ``dataproto``, ``stages`` or ``flows`` changes nothing in the process; the places that
start a ppoflow process call :func:`prepare_own_process` instead:

* the ``ppoflow`` executable (flows/cli/entry.py), first thing, before any library is imported;
* the training flow's body (flows/train.py), for a run started as a Prefect deployment, whose
  worker imports the flow's module itself: there the libraries are already imported, so only
  the environment that child processes inherit is set.

It sets, each only where the user has not:

* the telemetry opt-outs of MLflow, Prefect, Ray, vLLM and the Hugging Face hub
  (flows/process/offline.py), unless ``PPOFLOW_TELEMETRY=allow``;
* how long Prefect waits for its temporary server (flows/process/service_waits.py);
* the import finder that lets transformers and DeepSpeed skip imports of features ppoflow never
  uses (stages/skipped_imports.py): it takes effect for modules not imported yet.
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping

from flows.process.offline import telemetry_off
from flows.process.service_waits import service_defaults
from stages.skipped_imports import install as install_skipped_imports


def prepare_own_process(environ: MutableMapping[str, str] = os.environ) -> dict[str, str]:
    """Set this process's defaults (module docstring); returns the variables it set.

    >>> env = {"PPOFLOW_TELEMETRY": "allow"}
    >>> prepare_own_process(env)
    {'PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS': '120'}
    """
    added = telemetry_off(environ)
    added.update(service_defaults(environ))
    install_skipped_imports()
    return added


__all__ = ["prepare_own_process"]
