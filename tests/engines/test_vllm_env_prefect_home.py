"""The vLLM CPU environment and the main one share a machine without breaking each other's Prefect.

Runs in the vLLM environment (``make test-vllm``): a flow run in the main environment migrates
``~/.prefect`` with the newer Prefect, then a flow run in this environment (older Prefect) must
still work, because this environment's Prefect home is its own (flows/process/prefect_home.py).
``HOME`` is a temp dir, so nothing outside it is touched.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from flows.process.prefect_home import PTH_NAME

pytestmark = pytest.mark.vllm

REPO = Path(__file__).resolve().parents[2]
MAIN_PYTHON = REPO / ".venv" / "bin" / "python"
FLOW = "from prefect import flow\n\n@flow\ndef f():\n    return 41 + 1\n\nprint('result', f())\n"


def run_flow(python: Path | str, home: Path, script: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    # a fresh database's migrations can take Prefect's temporary server past its default 20 s
    # start-up wait on a busy 2-core machine (28 s measured); ppoflow's own runs wait 120 s
    env.update(
        HOME=str(home),
        PREFECT_SERVER_ANALYTICS_ENABLED="false",
        PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS="120",
    )
    return subprocess.run(
        [str(python), str(script)], env=env, capture_output=True, text=True, timeout=300
    )


def test_this_environment_has_its_own_prefect_home(tmp_path):
    pth = [p for p in map(Path, sys.path) if (p / PTH_NAME).is_file()]
    assert pth, f"{PTH_NAME} is not in this environment's site-packages (make install-vllm)"
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_HOME"}
    env["HOME"] = str(tmp_path)
    shown = subprocess.run(
        [sys.executable, "-c", "import os; print(os.environ['PREFECT_HOME'])"],
        env=env, capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    assert shown == str(tmp_path / ".prefect-vllm-cpu")


@pytest.mark.skipif(not MAIN_PYTHON.is_file(), reason="the main environment (.venv) is not built")
def test_a_flow_runs_here_after_the_main_environment_migrated_its_home(tmp_path):
    script = tmp_path / "f.py"
    script.write_text(FLOW)
    main = run_flow(MAIN_PYTHON, tmp_path, script)
    assert "result 42" in main.stdout, main.stderr[-2000:]
    assert (tmp_path / ".prefect" / "prefect.db").is_file()  # the newer Prefect's database
    here = run_flow(sys.executable, tmp_path, script)
    assert "result 42" in here.stdout, here.stderr[-2000:]
    assert "Can't locate revision" not in here.stderr
    assert (tmp_path / ".prefect-vllm-cpu" / "prefect.db").is_file()
