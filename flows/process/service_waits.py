"""How long ppoflow waits for the services it starts, given to the libraries before they read it.

Prefect reads its settings once, when it is imported, so a value set later is never seen: a
setting has to be in the environment before the first ``import prefect``. Importing ``flows``
(every ``ppoflow`` command, the Prefect flow's module) sets these defaults first; a value the user
exported is kept:

==================================================  =======  ==========================
variable                                            ppoflow  the library's own default
==================================================  =======  ==========================
``PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS``  120      20
==================================================  =======  ==========================

Prefect's temporary server creates its database on its first start and answers its health check
only then, which on a loaded machine can take longer than Prefect's own 20 s. The reward workers wait up to
``reward.startup_timeout_s`` (a config key, default 60 s) for the scorer's import. When a bound
is hit the run stops with one line naming the setting (:func:`explain_startup_timeout`).
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping

PREFECT_STARTUP = "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS"
#: variable → ppoflow's default
SERVICE_WAITS = {PREFECT_STARTUP: "120"}
_PREFECT_TIMEOUT = "Timed out while attempting to connect to ephemeral Prefect API server"


def service_defaults(environ: MutableMapping[str, str] = os.environ) -> dict[str, str]:
    """Set the :data:`SERVICE_WAITS` the user has not set; returns the ones it set.

    >>> service_defaults({PREFECT_STARTUP: "45"})
    {}
    >>> service_defaults({})
    {'PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS': '120'}
    """
    added = {k: v for k, v in SERVICE_WAITS.items() if k not in environ}
    environ.update(added)
    return added


def explain_startup_timeout(err: BaseException) -> str | None:
    """One line for a start-up bound that was hit, naming the setting; None for other errors.

    >>> explain_startup_timeout(RuntimeError(_PREFECT_TIMEOUT + ". stdout: …"))[:60]
    "Prefect's temporary server did not answer within 120 s (PREF"
    >>> explain_startup_timeout(ValueError("x")) is None
    True
    """
    if not str(err).startswith(_PREFECT_TIMEOUT):
        return None
    return startup_timeout_line(os.environ.get(PREFECT_STARTUP, SERVICE_WAITS[PREFECT_STARTUP]))


def startup_timeout_line(waited: float | str) -> str:
    """The line for Prefect's temporary server not answering within ``waited`` seconds (also
    raised by the server ppoflow starts itself, flows/process/prefect_server.py)."""
    waited = f"{float(waited):g}"
    return (
        f"Prefect's temporary server did not answer within {waited} s ({PREFECT_STARTUP}); "
        "on a loaded machine export a larger value, or point PREFECT_API_URL at a running "
        "Prefect server"
    )


__all__ = [
    "PREFECT_STARTUP",
    "SERVICE_WAITS",
    "explain_startup_timeout",
    "service_defaults",
    "startup_timeout_line",
]
