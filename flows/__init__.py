"""Orchestration: the Prefect flows, the run store, the command line.

Importing this package first turns the telemetry of the libraries it drives off
(:mod:`flows.offline`) and sets how long they wait for the services ppoflow starts
(:mod:`flows.service_waits`), before any of them reads its settings.
"""

from flows.offline import telemetry_off
from flows.service_waits import service_defaults

telemetry_off()
service_defaults()
