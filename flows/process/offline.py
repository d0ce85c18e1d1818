"""Nothing leaves the machine unasked: the telemetry of the libraries ppoflow drives is off.

MLflow 3 sends anonymous usage data by default, Prefect's server reports analytics, Ray and vLLM
report usage statistics and the Hugging Face hub client sends telemetry with its requests. A
trainer that runs offline on private data should not try to reach any of them, so importing
``flows`` (every ``ppoflow`` command, the Prefect flow's module) sets their documented opt-out
variables, before any of those libraries reads its settings:

======================================  =========================================
``MLFLOW_DISABLE_TELEMETRY=true``       MLflow's usage tracking
``PREFECT_SERVER_ANALYTICS_ENABLED=false``  Prefect server analytics
``RAY_USAGE_STATS_ENABLED=0``           Ray usage stats
``VLLM_NO_USAGE_STATS=1``               vLLM usage stats
``HF_HUB_DISABLE_TELEMETRY=1``          Hugging Face hub telemetry
``DO_NOT_TRACK=1``                      Prefect's client (SDK) telemetry, and
                                        its notice on a terminal
======================================  =========================================

Each is a default: a value the user exported is kept. ``PPOFLOW_TELEMETRY=allow`` leaves every
library at its own default instead. Child processes (the Prefect server, reward workers, Ray
ranks, vLLM) inherit the environment. W&B is offline unless asked (flows/sinks/wandb_logger.py).
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping

#: variable → value that turns the library's telemetry off
TELEMETRY_OFF = {
    "MLFLOW_DISABLE_TELEMETRY": "true",
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "RAY_USAGE_STATS_ENABLED": "0",
    "VLLM_NO_USAGE_STATS": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "DO_NOT_TRACK": "1",
}
SWITCH = "PPOFLOW_TELEMETRY"


def telemetry_off(environ: MutableMapping[str, str] = os.environ) -> dict[str, str]:
    """Set the opt-out variables the user has not set (unless ``PPOFLOW_TELEMETRY=allow``);
    returns the ones it set.

    >>> env = {"RAY_USAGE_STATS_ENABLED": "1"}
    >>> sorted(telemetry_off(env))[:2], env["RAY_USAGE_STATS_ENABLED"]
    (['DO_NOT_TRACK', 'HF_HUB_DISABLE_TELEMETRY'], '1')
    >>> telemetry_off({"PPOFLOW_TELEMETRY": "allow"})
    {}
    """
    if environ.get(SWITCH, "").lower() == "allow":
        return {}
    added = {k: v for k, v in TELEMETRY_OFF.items() if k not in environ}
    environ.update(added)
    return added


__all__ = ["SWITCH", "TELEMETRY_OFF", "telemetry_off"]
