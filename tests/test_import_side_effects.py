"""Importing ppoflow's packages changes nothing in the process: ``sys.meta_path``, ``os.environ``
and the logging configuration are as they were (what a process wants for itself is set by the
``ppoflow`` executable, flows/process/own_process.py). Each case runs in a fresh interpreter."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from flows.process.offline import TELEMETRY_OFF
from flows.process.service_waits import SERVICE_WAITS

REPO = Path(__file__).resolve().parents[1]
# the environment of a process nobody prepared (this test process was, by tests/conftest.py)
UNPREPARED = {k: v for k, v in os.environ.items() if k not in {*TELEMETRY_OFF, *SERVICE_WAITS}}

PROBE = """
import json, logging, os, pkgutil, importlib, sys

def state():
    loggers = {
        name: [logger.level, logger.propagate, [type(h).__name__ for h in logger.handlers]]
        for name, logger in logging.root.manager.loggerDict.items()
        if isinstance(logger, logging.Logger)
    }
    return {
        "meta_path": [type(f).__module__ + "." + type(f).__qualname__ for f in sys.meta_path],
        "environ": dict(os.environ),
        "root": [logging.root.level, [type(h).__name__ for h in logging.root.handlers]],
        "loggers": loggers,
    }

PRELUDE
before = state()
IMPORTS
after = state()
unset = [logging.NOTSET, True, []]  # a logger that only came into being by a getLogger call
diff = {
    "meta_path": [before["meta_path"], after["meta_path"]],
    "environ": sorted(set(after["environ"].items()) ^ set(before["environ"].items())),
    "root": [before["root"], after["root"]],
    "loggers": sorted(
        name for name, config in after["loggers"].items()
        if config != before["loggers"].get(name, unset)
    ),
}
print(json.dumps(diff))
"""


def probe(prelude: str, imports: str) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", PROBE.replace("PRELUDE", prelude).replace("IMPORTS", imports)],
        cwd=REPO,
        env=UNPREPARED,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def assert_unchanged(diff: dict) -> None:
    assert diff["meta_path"][0] == diff["meta_path"][1], diff["meta_path"]
    assert diff["environ"] == [], diff["environ"]
    assert diff["root"][0] == diff["root"][1], diff["root"]
    assert diff["loggers"] == [], diff["loggers"]


def test_importing_the_three_packages_changes_nothing():
    # torch and tensordict first: tensordict's own import sets TORCHINDUCTOR_CACHE_DIR
    assert_unchanged(probe("import torch, tensordict", "import dataproto, stages, flows"))


def test_the_preparation_is_what_changes_the_process():
    # the probe sees a change where there is one: the executable's own preparation
    diff = probe("", "import flows.process.own_process as o; o.prepare_own_process({})")
    assert diff["meta_path"][0] != diff["meta_path"][1]
    diff = probe("", "import flows.process.own_process as o; o.prepare_own_process()")
    assert ["DO_NOT_TRACK", "1"] in diff["environ"]
