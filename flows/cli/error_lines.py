"""The command line's one error line for failures whose own message would mislead or sprawl.

:func:`explain` asks each function of :data:`EXPLAINERS` in turn; the first that recognises the
error returns the line to print instead of ``TypeName: message`` (``flows/cli/train.py``
``fail_in_one_line``). An explainer takes the exception and returns a line or None; it names the
setting or the file involved and what would be right.
"""

from __future__ import annotations

from collections.abc import Callable

from flows.cli.disk_full import explain_disk_full
from flows.process.server_guard import explain_timeout_setting
from flows.process.service_waits import explain_startup_timeout
from stages.health.stop import explain_health_stop

Explainer = Callable[[BaseException], "str | None"]

#: tried in order; the first line that is not None is printed
EXPLAINERS: list[Explainer] = [
    explain_startup_timeout,
    explain_timeout_setting,
    explain_disk_full,
    explain_health_stop,
]


def explain(err: BaseException) -> str | None:
    """The first explainer's line for ``err``, or None when none recognises it."""
    for explainer in EXPLAINERS:
        line = explainer(err)
        if line is not None:
            return line
    return None


__all__ = ["EXPLAINERS", "Explainer", "explain"]
