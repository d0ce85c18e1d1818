"""``ppoflow.health.<check>``: a health check's action and threshold (``stages.health``); a check
not named keeps its registry defaults. The names are checked against ``HEALTH_CHECKS`` with the
other registry names (``stages.config.checks``)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from stages.config._base import ConfigModel


class HealthCheckConfig(ConfigModel):
    """One health check's settings; null keeps the check's default."""

    action: Literal["warn", "stop", "off"] | None = Field(
        None,
        description="warn: one line and the run goes on; stop: one line and the run stops after "
        "the step is saved and logged; off: not run; null = the check's default (choice)",
    )
    threshold: float | None = Field(
        None,
        description="The value at which the check trips, in the unit of its metric "
        "(docs/health.md); null = the check's default (number)",
    )
