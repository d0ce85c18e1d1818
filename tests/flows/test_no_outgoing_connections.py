"""A training run tries to reach nothing beyond the machine (flows/process/offline.py).

The run is ``ppoflow train`` in a subprocess with ``tests/flows/netlog`` on ``PYTHONPATH``: its
``sitecustomize`` records every socket connect / sendto / getaddrinfo of that process and of every
Python process it starts (the Prefect server, the reward workers). Loopback and Unix sockets are
the run's own services; anything else is an outgoing attempt.
"""

from __future__ import annotations

import ast
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
NETLOG = Path(__file__).resolve().parent / "netlog"
LOOPBACK_HOSTS = {"localhost", "127.0.0.1", "::1", "0.0.0.0", "", "None"}


def is_local(record: dict) -> bool:
    """A Unix socket, or an address / host name on this machine."""
    if record["family"] == socket.AF_UNIX:
        return True
    try:
        address = ast.literal_eval(record["address"])
    except (ValueError, SyntaxError):
        address = record["address"]
    host = address[0] if isinstance(address, tuple) else address
    host = host.decode() if isinstance(host, bytes) else str(host)
    return host in LOOPBACK_HOSTS or host.startswith("127.")


def test_training_makes_no_outgoing_connection(tmp_path, make_demo_inputs, tiny_run_overrides):
    demo = make_demo_inputs(tmp_path / "demo")
    log = tmp_path / "net.jsonl"
    env = {k: v for k, v in os.environ.items() if k not in ("PPOFLOW_TELEMETRY",)}
    env.update(PYTHONPATH=str(NETLOG), PPOFLOW_NET_LOG=str(log))
    for variable in ("MLFLOW_DISABLE_TELEMETRY", "PREFECT_SERVER_ANALYTICS_ENABLED",
                     "RAY_USAGE_STATS_ENABLED", "HF_HUB_DISABLE_TELEMETRY", "HF_HUB_OFFLINE",
                     "TRANSFORMERS_OFFLINE", "DO_NOT_TRACK"):  # fmt: skip
        env.pop(variable, None)  # ppoflow itself must turn them off
    command = [
        sys.executable, "-m", "flows.cli", "train", str(REPO / "configs" / "demo-cpu.yaml"),
        *tiny_run_overrides(demo, tmp_path, 2, "trainer.logger=[console,mlflow]"),
        "--run-dir", str(tmp_path / "run"),
    ]  # fmt: skip
    done = subprocess.run(command, env=env, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    records = [json.loads(line) for line in log.read_text().splitlines()]
    assert any(r["event"] == "socket.connect" for r in records)  # the recorder saw the run's own
    outgoing = [r for r in records if not is_local(r)]
    assert outgoing == [], outgoing
