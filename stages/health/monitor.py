"""Running the configured health checks on each finished step.

``ppoflow.health.<name>`` (``action``, ``threshold``) overrides a check's defaults; a check not
named there runs with them. :meth:`HealthMonitor.check` returns the step's ``health/*``
metrics, the lines of the checks with action ``warn`` that started tripping at the step (a check
that trips step after step is said once, and again only after a step where it did not trip; its
metric shows every step), the line of the first check with action ``stop`` that tripped, and
the checks that could not run (with why) — the flow prints, logs and stops.

A check that cannot run (it needs a metric the run does not log, or the run's settings leave it
nothing to tell) is reported once, at the first step: as a warning when the user configured it
(``ppoflow.health.<name>`` set), else in the log only.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from stages.health.checks import HEALTH_CHECKS, HealthCheck, StepView
from stages.health.stop import HealthCheckStop, explain_health_stop, stop_error


@dataclass(frozen=True)
class CheckSetting:
    """One check as the run uses it: its registry entry, action and threshold, and whether the
    user configured it."""

    check: HealthCheck
    action: str
    threshold: float
    configured: bool


@dataclass
class HealthOutcome:
    """One step's result (module docstring)."""

    metrics: dict[str, float] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    stop: str | None = None
    not_run: dict[str, str] = field(default_factory=dict)
    not_run_configured: dict[str, str] = field(default_factory=dict)


def check_settings(health: Mapping[str, Any]) -> list[CheckSetting]:
    """Every registered check with the run's action and threshold (``health``: the
    ``ppoflow.health`` mapping, name → an object with ``action`` and ``threshold``, each None
    for the default)."""
    settings = []
    for name in HEALTH_CHECKS.names():
        check, chosen = HEALTH_CHECKS.get(name), health.get(name)
        action = getattr(chosen, "action", None) or check.action
        threshold = getattr(chosen, "threshold", None)
        settings.append(
            CheckSetting(
                check,
                action,
                check.threshold if threshold is None else float(threshold),
                configured=chosen is not None,
            )
        )
    return settings


class HealthMonitor:
    """The run's checks (module docstring).

    Args:
        config: the run's config (``ppoflow.health``, and what ``unavailable`` reads).
    """

    def __init__(self, config: Any) -> None:
        self.settings = [s for s in check_settings(config.ppoflow.health) if s.action != "off"]
        self.blocked = {
            s.check.name: reason
            for s in self.settings
            if s.check.unavailable is not None
            and (reason := s.check.unavailable(config)) is not None
        }
        self._reported = False
        self._tripping: set[str] = set()  # warn checks that tripped at the step they last ran

    def check_step(
        self, step: int, metrics: dict[str, float], batch: Any, producers: Mapping[str, str]
    ) -> HealthOutcome:
        """:meth:`check` of a finished step (step 1 is the run's first); the checks' ``health/*``
        metrics are added to ``metrics``."""
        outcome = self.check(StepView(step, metrics, batch, producers, first=step == 1))
        metrics.update(outcome.metrics)
        return outcome

    def check(self, view: StepView) -> HealthOutcome:
        """Run every check that applies to ``view`` (module docstring)."""
        outcome = HealthOutcome()
        for setting in self.settings:
            check = setting.check
            if check.only_first and not view.first:
                continue
            why = self.blocked.get(check.name) or check.missing(view)
            if why is not None:
                if not self._reported:
                    target = outcome.not_run_configured if setting.configured else outcome.not_run
                    target[check.name] = why
                continue
            if check.undefined(view):
                continue
            line = check.trip(view, setting.threshold)
            outcome.metrics[check.metric] = float(line is not None)
            if line is None:
                self._tripping.discard(check.name)
                continue
            line = f"health check {check.name}: {line}"
            if setting.action == "stop":
                outcome.stop = outcome.stop or line
            elif check.name not in self._tripping:
                self._tripping.add(check.name)
                outcome.warnings.append(line)
        self._reported = True
        return outcome


__all__ = [
    "CheckSetting",
    "HealthCheckStop",
    "HealthMonitor",
    "HealthOutcome",
    "check_settings",
    "explain_health_stop",
    "stop_error",
]
