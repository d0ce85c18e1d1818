"""Orchestration: the Prefect flows, the run store, the command line.

Importing this package turns the telemetry of the libraries it drives off first
(:mod:`flows.offline`), before any of them reads its settings.
"""

from flows.offline import telemetry_off

telemetry_off()
