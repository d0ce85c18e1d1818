"""Health checks that fail fast (``ppoflow.health``): a registry of checks over each finished
step (``checks``) and the monitor that runs the configured ones (``monitor``); docs/health.md."""
