"""docker/Dockerfile built and run with a real Docker engine, on a base image made from Debian's
packages (docker/build_base.sh), so no container registry is needed.

`make test-docker` installs and starts what it needs, then runs this module with
PPOFLOW_TEST_DOCKER=1; without that variable (CI's `make test-slow` among others) or without a
daemon answering `docker info`, every test skips: the first build takes longer than the rest of
the slow tests together. Each step reuses what exists:

1. the base `ppoflow-base:bookworm`: built once with debootstrap, reused while the tag exists;
2. `ppoflow:cpu` on that base (`docker build`; Docker's layer cache rebuilds only what the tree
   changed). torch comes from docker/wheels/ when pip can put the CPU wheel there from this
   machine's own sources (`pip download torch==X+cpu`), else from PyTorch's CPU index;
3. in the image: `ppoflow --version` as uid 1000 with DeepSpeed's CPU ops compiled ahead of time
   and no compiler; two GRPO steps of the demo with no network; and the compose stack's ppoflow
   services (prefect-server, mlflow, prefect-worker, deploy) started with compose.yaml's
   commands until its health checks pass, with SQLite in place of the Postgres service.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
import sys
import time
import tomllib
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCKER = REPO / "docker"
BASE_IMAGE = "ppoflow-base:bookworm"
IMAGE = "ppoflow:cpu"
TORCH = re.search(r"^torch==([\d.]+)$", (REPO / "constraints.txt").read_text(), re.M).group(1)
# compose.yaml's services built from docker/Dockerfile; postgres and the GPU worker are not
PPOFLOW_SERVICES = ("prefect-server", "mlflow", "prefect-worker", "deploy")
# in one network namespace the services reach each other on loopback, not by service name
LOOPBACK = {"://prefect-server:": "://127.0.0.1:", "://mlflow:": "://127.0.0.1:"}

pytestmark = pytest.mark.slow


def docker(*args: str, timeout: float = 300, check: bool = True) -> subprocess.CompletedProcess:
    """``docker ARGS`` with its output captured; a failure shows the last lines of it."""
    result = subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout)
    if check and result.returncode != 0:
        tail = "\n".join((result.stdout + result.stderr).splitlines()[-60:])
        raise AssertionError(f"docker {' '.join(args[:4])} … exited {result.returncode}:\n{tail}")
    return result


def _no_daemon() -> str | None:
    """Why no Docker engine can be used here, or None."""
    if shutil.which("docker") is None:
        return "the docker CLI is not installed (`make test-docker` installs docker.io)"
    try:
        info = docker("info", timeout=30, check=False)
    except subprocess.TimeoutExpired:
        return "`docker info` did not answer in 30 s"
    if info.returncode != 0:
        last = (info.stderr.strip().splitlines() or ["no output"])[-1]
        return f"no Docker daemon answers `docker info` ({last}); `make test-docker` starts one"
    return None


@pytest.fixture(scope="module")
def base_image() -> str:
    """``ppoflow-base:bookworm``, built by docker/build_base.sh unless the tag exists."""
    if os.environ.get("PPOFLOW_TEST_DOCKER") != "1":
        pytest.skip("builds Docker images (40 min at first): `make test-docker` runs it")
    if reason := _no_daemon():
        pytest.skip(reason)
    if docker("image", "inspect", BASE_IMAGE, check=False).returncode == 0:
        return BASE_IMAGE
    if shutil.which("debootstrap") is None or os.geteuid() != 0:
        pytest.skip(f"{BASE_IMAGE} is missing and building it needs root and debootstrap")
    build = subprocess.run(
        [str(DOCKER / "build_base.sh"), BASE_IMAGE], capture_output=True, text=True, timeout=1800
    )
    assert build.returncode == 0, (build.stdout + build.stderr)[-4000:]
    return BASE_IMAGE


def _torch_build_args() -> list[str]:
    """``TORCH_INDEX_URL=`` (torch from docker/wheels/) when pip finds the CPU wheel in this
    machine's own sources, else nothing (PyTorch's CPU index, the Dockerfile's default)."""
    pip = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:"]
    wheel = [f"torch=={TORCH}+cpu", "--python-version", "3.11", "--dest", str(DOCKER / "wheels")]
    fetch = subprocess.run([*pip, *wheel], capture_output=True, text=True, timeout=900)
    return ["--build-arg", "TORCH_INDEX_URL="] if fetch.returncode == 0 else []


@pytest.fixture(scope="module")
def image(base_image: str) -> str:
    """``ppoflow:cpu`` built from this tree on the Debian base (host network: the daemon of
    `make test-docker` has no bridge)."""
    base = ["--build-arg", f"BASE_IMAGE={base_image}", *_torch_build_args()]
    dockerfile = ["-f", "docker/Dockerfile", "-t", IMAGE, str(REPO)]
    docker("build", "--network", "host", *base, *dockerfile, timeout=3600)
    return IMAGE


def run(image: str, script: str, timeout: float = 300) -> str:
    """stdout of ``sh -c SCRIPT`` in a throwaway container of ``image`` with no network."""
    offline = ["--rm", "--network=none", "--env=OMP_NUM_THREADS=1", "--entrypoint=sh"]
    return docker("run", *offline, image, "-c", script, timeout=timeout).stdout


def test_image_runs_ppoflow_as_uid_1000_with_deepspeed_ops_and_no_compiler(image):
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    assert run(image, "ppoflow --version").split()[:2] == ["ppoflow", project["version"]]
    assert run(image, "id -u; command -v gcc cc c++ || true").split() == ["1000"]
    ops = "import json, deepspeed.git_version_info as g; print(json.dumps(g.installed_ops))"
    installed = json.loads(run(image, f"python -c '{ops}'").splitlines()[-1])
    assert installed["cpu_adam"] and installed["deepspeed_shm_comm"]  # built in the builder


def test_demo_trains_two_grpo_steps_in_the_image(image, tiny_run_overrides):
    """The demo's inputs and two steps of configs/demo-cpu.yaml (tiny batches), offline."""
    overrides = " ".join(tiny_run_overrides(Path("/workspace/demo"), Path("/workspace/out"), 2))
    script = (
        "set -e; ppoflow make-demo-data demo/data --n-train 32 --n-val 8 >&2; "
        "ppoflow make-tiny-model demo/model >&2; "
        f"ppoflow train demo-cpu {overrides} > train.out; "
        'ppoflow inspect --json "$(tail -n 1 train.out)"'
    )
    steps = json.loads(run(image, script, timeout=900))["steps"]
    assert [(step["step"], step["status"]) for step in steps] == [(1, "done"), (2, "done")]
    for step in steps:
        assert math.isfinite(step["metrics"]["actor/pg_loss"])
        assert step["metrics"]["health/non_finite"] == 0
    assert steps[0]["weights"]["actor"] != steps[1]["weights"]["actor"]  # step 1 updated them


@pytest.fixture
def stack(image) -> Iterator[str]:
    """A prefix for the names of the test's containers; all of them are removed afterwards."""
    prefix = f"ppoflow-test-{uuid.uuid4().hex[:8]}-"
    yield prefix
    started = docker("ps", "--all", "--quiet", f"--filter=name=^{prefix}").stdout.split()
    if started:
        docker("rm", "--force", *started, check=False)


def start(service: dict[str, Any], name: str, network: str, env: dict[str, str]) -> str:
    """A detached container running ``service``'s compose entrypoint and command."""
    entrypoint, command = service["entrypoint"], service.get("command", [])
    options = [f"--name={name}", f"--network={network}", f"--entrypoint={entrypoint[0]}"]
    options += [f"--env={key}={value}" for key, value in env.items()]
    docker("run", "--detach", *options, service["image"], *entrypoint[1:], *command)
    return name


def wait_healthy(container: str, service: dict[str, Any], within_s: float = 240) -> None:
    """Run the service's compose health check in its container until it passes."""
    check = service["healthcheck"]["test"]
    assert check[0] == "CMD", check
    deadline = time.monotonic() + within_s
    while docker("exec", container, *check[1:], check=False).returncode != 0:
        state = docker("inspect", "--format", "{{.State.Status}}", container).stdout.strip()
        if state != "running" or time.monotonic() > deadline:
            logs = docker("logs", "--tail", "40", container, check=False)
            raise AssertionError(
                f"{container} is {state}, not healthy:\n{logs.stdout}{logs.stderr}"
            )
        time.sleep(3)


def service_env(service: dict[str, Any]) -> dict[str, str]:
    """The service's compose environment, servers on loopback and SQLite instead of Postgres."""
    env = {}
    for key, value in service.get("environment", {}).items():
        if "postgresql" in value:  # a Postgres URL: the server's own SQLite default instead
            continue
        for host, local in LOOPBACK.items():
            value = value.replace(host, local)
        env[key] = value
    return env


def test_compose_services_of_the_image_start_and_pass_their_health_checks(compose, stack):
    services = {name: compose["services"][name] for name in PPOFLOW_SERVICES}
    assert {service["image"] for service in services.values()} == {IMAGE}
    env = {service: service_env(services[service]) for service in PPOFLOW_SERVICES}
    env["mlflow"]["MLFLOW_BACKEND_STORE_URI"] = "sqlite:////home/ppoflow/mlflow.db"
    server = start(services["prefect-server"], stack + "server", "none", env["prefect-server"])

    def start_beside_server(service: str) -> str:
        return start(services[service], stack + service, f"container:{server}", env[service])

    # in the order of compose's depends_on (service_healthy)
    mlflow = start_beside_server("mlflow")
    wait_healthy(server, services["prefect-server"])
    wait_healthy(mlflow, services["mlflow"])
    wait_healthy(start_beside_server("prefect-worker"), services["prefect-worker"])
    deploy = start_beside_server("deploy")
    exit_code = docker("wait", deploy, timeout=300).stdout.strip()
    assert exit_code == "0", docker("logs", deploy).stdout
    listed = docker("exec", server, "prefect", "deployment", "ls").stdout
    assert "ppo-train/cpu" in listed and "ppo-train/gpu" in listed, listed
