"""``python -m flows.cli …``: the command line in a process prepared as the ``ppoflow`` executable
prepares its own (telemetry off, service waits, skipped imports: flows/process/own_process.py),
without its start-ahead of Prefect's temporary server and the MLflow process, so Prefect takes its
own path (the tests that need that run this)."""

from flows.process.own_process import prepare_own_process

prepare_own_process()

from flows.cli.app import app  # noqa: E402  (after the preparation: Prefect reads it on import)

app()
