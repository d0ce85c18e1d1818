"""The compose stack's deployments: docker/prefect.yaml and the one-off `deploy` service of
docker/compose.yaml, checked without a Docker engine.

Without Prefect (fast):
- the `deploy` service is a one-off under its own profile, from the CPU image, talking to the
  Prefect server compose runs, and deploys the file the images hold (the Dockerfiles' COPY lines
  put docker/prefect.yaml and the flow's entrypoint where the service and the workers look);
- each deployment names a work pool a worker polls (and the service creates), starts its runs on
  the workspace volume and runs the same flow as the repo-root prefect.yaml.

With a real local Prefect server (slow): the service's own entrypoint script, with the image's
paths replaced by temporary ones (``/app`` → this checkout, ``/workspace`` and
``/app/docker/`` → tmp_path), registers both deployments with the entrypoint, pull step and
parameters the file gives; it creates a missing pool with the workers' job template and leaves
an existing one as it is. No flow run (tests/deploy/test_prefect_deployment.py runs one).
"""

from __future__ import annotations

import contextlib
import json
import os
import posixpath
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
DOCKER = REPO / "docker"
PREFECT_FILE_IN_IMAGE = "/app/docker/prefect.yaml"
POOL_TEMPLATE_IN_IMAGE = "/app/docker/process-pool.json"
APP, WORKSPACE = "/app", "/workspace"
WORKERS = ("prefect-worker", "prefect-worker-gpu")
SET_WORKDIR = "prefect.deployments.steps.set_working_directory"
SERVER_START_S = 180  # a first start migrates the database
COMMAND_S = 300  # `prefect deploy` imports the flow (torch, transformers, DeepSpeed)


def option(command: list[str], flag: str) -> str:
    """The value after ``flag`` in a command list."""
    if flag not in command:
        raise AssertionError(f"{flag} missing from command {command}")
    return command[command.index(flag) + 1]


@pytest.fixture(scope="module")
def prefect_file() -> dict[str, Any]:
    return yaml.safe_load((DOCKER / "prefect.yaml").read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def deployments(prefect_file) -> dict[str, dict[str, Any]]:
    return {d["name"]: d for d in prefect_file["deployments"]}


def deploy_command(compose: dict[str, Any]) -> list[str]:
    """What the `deploy` container runs: its entrypoint followed by its command."""
    service = compose["services"]["deploy"]
    return [*service["entrypoint"], *service["command"]]


def polled_pools(compose: dict[str, Any]) -> dict[str, str]:
    """Work pool → the worker service polling it."""
    services = compose["services"]
    return {option(services[w]["command"], "--pool"): w for w in WORKERS}


# --- the Dockerfiles' COPY lines ------------------------------------------------------------------


def dockerfile_stages(path: Path) -> dict[str, list[str]]:
    """Stage name → its instructions, continuation lines joined, comments dropped."""
    out: dict[str, list[str]] = {}
    name, current = None, ""
    for raw in path.read_text(encoding="utf-8").splitlines():
        stripped = raw.strip()
        if not stripped or stripped.startswith("#"):
            continue
        current += " " + stripped.removesuffix("\\").strip()
        if stripped.endswith("\\"):
            continue
        line, current = current.strip(), ""
        if match := re.match(r"FROM \S+ AS (\S+)$", line):
            name = match.group(1)
            out[name] = []
        if name is not None:
            out[name].append(line)
    return out


def copied_paths(stages: dict[str, list[str]], stage: str) -> dict[str, str]:
    """Image path → build-context path, for what the COPY lines of ``stage`` put in the image
    (``COPY --from=<stage>`` followed into that stage; destinations relative to WORKDIR)."""
    out: dict[str, str] = {}
    workdir = "/"
    for line in stages[stage]:
        words = line.split()
        if words[0] == "WORKDIR":
            workdir = posixpath.join(workdir, words[1])
        if words[0] != "COPY":
            continue
        flags = {w.split("=", 1)[0]: w.partition("=")[2] for w in words[1:] if w.startswith("--")}
        args = [w for w in words[1:] if not w.startswith("--")]
        *sources, dest = args
        dest = posixpath.normpath(posixpath.join(workdir, dest))
        into_dir = len(sources) > 1 or args[-1].endswith("/")
        for source in sources:
            target = posixpath.join(dest, posixpath.basename(source)) if into_dir else dest
            if "--from" not in flags:
                out[target] = posixpath.normpath(source)
                continue
            for path, context in copied_paths(stages, flags["--from"]).items():
                if path == source or path.startswith(source.rstrip("/") + "/"):
                    out[target + path[len(source.rstrip("/")) :]] = context
    return out


def context_path_of(image_path: str, copied: dict[str, str]) -> Path | None:
    """The file of the build context that ends up at ``image_path``, or None."""
    for path in sorted(copied, key=len, reverse=True):
        if image_path == path or image_path.startswith(path + "/"):
            return REPO / (copied[path] + image_path[len(path) :])
    return None


def test_copied_paths_follow_workdir_and_stages(tmp_path):
    dockerfile = tmp_path / "Dockerfile"
    dockerfile.write_text(
        "FROM a AS builder\nWORKDIR /app\nCOPY flows ./flows\nCOPY x.txt y.txt sub/\n"
        "FROM b AS runtime\nCOPY --from=builder /app /opt/app\nCOPY docker/p.json /etc/p.json\n"
    )
    copied = copied_paths(dockerfile_stages(dockerfile), "runtime")
    assert copied == {
        "/opt/app/flows": "flows",
        "/opt/app/sub/x.txt": "x.txt",
        "/opt/app/sub/y.txt": "y.txt",
        "/etc/p.json": "docker/p.json",
    }
    assert context_path_of("/opt/app/flows/train.py", copied) == REPO / "flows/train.py"
    assert context_path_of("/opt/app/other.py", copied) is None


# --- the deploy service -----------------------------------------------------------------------------


def test_deploy_service_is_a_one_off_from_the_cpu_image(compose):
    services = compose["services"]
    deploy = services["deploy"]
    assert deploy["profiles"] == ["deploy"]  # not started by `docker compose up`
    assert deploy["restart"] == "no"
    assert "ports" not in deploy and "healthcheck" not in deploy
    assert deploy["image"] == services["prefect-worker"]["image"]
    assert deploy["build"] == services["prefect-worker"]["build"]
    assert deploy["depends_on"] == {"prefect-server": {"condition": "service_healthy"}}


def test_deploy_service_talks_to_the_prefect_server_of_the_stack(compose):
    services = compose["services"]
    api_url = services["deploy"]["environment"]["PREFECT_API_URL"]
    assert api_url == services["prefect-worker"]["environment"]["PREFECT_API_URL"]
    url = urlsplit(api_url)
    server_command = services["prefect-server"]["command"]
    assert url.hostname == "prefect-server" and url.path == "/api"
    assert str(url.port) == option(server_command, "--port")


def test_deploy_service_deploys_every_deployment_of_the_prefect_file(compose):
    command = deploy_command(compose)
    assert command[:2] == ["sh", "-c"]
    script, argv0, *args = command[2:]
    assert argv0 == "deploy"  # $0 of the script; the arguments after it are "$@"
    assert args == ["--all"]  # the default; `docker compose run --rm deploy ARGS` replaces it
    assert (
        f'exec prefect --no-prompt deploy --prefect-file {PREFECT_FILE_IN_IMAGE} "$@"'
        in script.splitlines()[-1]
    )
    assert script.startswith("set -e\n")


def test_deploy_service_creates_the_pools_the_workers_poll_with_their_template(compose):
    script = deploy_command(compose)[2]
    (loop,) = re.findall(r"^for pool in (.+); do$", script, flags=re.MULTILINE)
    assert set(loop.split()) == set(polled_pools(compose))
    created = re.findall(r"prefect work-pool create \"\$pool\" (.+?)(?: \\)?$", script, re.M)
    assert created == [f"--type process --base-job-template {POOL_TEMPLATE_IN_IMAGE}"]
    for worker in WORKERS:
        command = compose["services"][worker]["command"]
        assert option(command, "--base-job-template") == POOL_TEMPLATE_IN_IMAGE
        assert option(command, "--type") == "process"


@pytest.mark.parametrize("service", ["deploy", *WORKERS])
def test_images_hold_the_prefect_file_the_template_and_the_flow(compose, deployments, service):
    """The deploy service reads the file and loads the entrypoints; each worker loads its
    deployment's entrypoint and its pool's template from its own image."""
    dockerfile = REPO / compose["services"][service]["build"]["dockerfile"]
    copied = copied_paths(dockerfile_stages(dockerfile), "runtime")
    wanted = [PREFECT_FILE_IN_IMAGE, POOL_TEMPLATE_IN_IMAGE]
    wanted += [d["entrypoint"].rpartition(":")[0] for d in deployments.values()]
    for image_path in wanted:
        source = context_path_of(image_path, copied)
        assert source is not None, f"{dockerfile.name}: nothing is copied to {image_path}"
        assert source.is_file(), f"{dockerfile.name}: {image_path} comes from missing {source}"
    assert context_path_of(PREFECT_FILE_IN_IMAGE, copied) == DOCKER / "prefect.yaml"


# --- docker/prefect.yaml ----------------------------------------------------------------------------


def test_each_deployment_goes_to_a_pool_a_worker_polls(compose, deployments):
    pools = polled_pools(compose)
    assert {d["work_pool"]["name"] for d in deployments.values()} == set(pools)
    assert pools[deployments["cpu"]["work_pool"]["name"]] == "prefect-worker"
    assert pools[deployments["gpu"]["work_pool"]["name"]] == "prefect-worker-gpu"


def test_runs_start_on_the_workspace_volume_and_load_the_flow_from_the_image(
    compose, prefect_file, deployments
):
    assert prefect_file["build"] is None and prefect_file["push"] is None
    assert prefect_file["pull"] == [{SET_WORKDIR: {"directory": WORKSPACE}}]
    for worker in WORKERS:
        assert f"workspace:{WORKSPACE}" in compose["services"][worker]["volumes"]
    root = yaml.safe_load((REPO / "prefect.yaml").read_text(encoding="utf-8"))
    (demo,) = root["deployments"]
    for deployment in deployments.values():
        assert "pull" not in deployment and "build" not in deployment
        # absolute: runs start in /workspace, not in the code's directory
        assert deployment["entrypoint"] == f"{APP}/{demo['entrypoint']}"
        assert set(deployment["parameters"]) == set(demo["parameters"])
        assert deployment["work_pool"]["job_variables"] == {}  # the pool's template applies


def test_default_configs_exist_and_gpu_data_is_read_from_the_workspace(deployments):
    for deployment in deployments.values():
        assert (REPO / "configs" / f"{deployment['parameters']['config']}.yaml").is_file()
    for override in deployments["gpu"]["parameters"]["overrides"]:
        key, _, value = override.partition("=")
        assert key in {"data.train_files", "data.val_files"}
        assert not value.startswith(("/", "~")), override  # relative: on the workspace volume


# --- a real local Prefect server --------------------------------------------------------------------


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def api(url: str, body: dict | None = None) -> Any:
    """GET (or POST ``body``) a JSON document."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())


def wait_healthy(api_url: str, server: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + SERVER_START_S
    while True:
        with contextlib.suppress(urllib.error.URLError, ConnectionError, TimeoutError):
            if api(f"{api_url}/health") is True:
                return
        if server.poll() is not None or time.monotonic() > deadline:
            pytest.fail(f"the Prefect server did not become healthy:\n{log.read_text()[-6000:]}")
        time.sleep(1)


@pytest.fixture
def local_server(tmp_path: Path) -> Iterator[tuple[str, dict[str, str]]]:
    """A Prefect server on a free loopback port (database in tmp_path): its API URL and the
    environment of its clients (this session's PREFECT_* settings removed, the venv's
    `prefect` first on PATH). The server's process group is stopped at the end."""
    port = free_port()
    api_url = f"http://127.0.0.1:{port}/api"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env.update(
        PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
        PREFECT_HOME=str(tmp_path / "prefect-home"),
        PREFECT_API_URL=api_url,
        PREFECT_API_DATABASE_CONNECTION_URL=f"sqlite+aiosqlite:///{tmp_path / 'prefect.db'}",
        PREFECT_SERVER_ANALYTICS_ENABLED="false",
        PREFECT_CLI_COLORS="false",
        PREFECT_CLI_WRAP_LINES="false",
    )
    log = tmp_path / "server.log"
    with log.open("wb") as sink:
        server = subprocess.Popen(
            [sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1",
             "--port", str(port)],
            cwd=tmp_path, env=env, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    try:
        wait_healthy(api_url, server, log)
        yield api_url, env
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(server.pid, signal.SIGKILL)
            server.wait(timeout=20)


def render(text: str, root: Path) -> str:
    """The image's paths replaced: /app/docker/ → root/docker/ (rendered copies), the rest of
    /app → this checkout, /workspace → root/workspace."""
    text = text.replace(f"{APP}/docker/", f"{root}/docker/")
    return text.replace(f"{APP}/", f"{REPO}/").replace(WORKSPACE, str(root / "workspace"))


def run_deploy_service(compose, root: Path, env: dict[str, str]) -> str:
    """The deploy container's command, rendered, run from the rendered workspace; its output."""
    command = [render(word, root) for word in deploy_command(compose)]
    done = subprocess.run(
        command, cwd=root / "workspace", env=env, capture_output=True, text=True,
        timeout=COMMAND_S,
    )  # fmt: skip
    output = done.stdout + done.stderr
    assert done.returncode == 0, f"the deploy service's command failed:\n{output[-6000:]}"
    return output


@pytest.mark.slow
def test_deploy_service_registers_the_deployments_on_a_real_server(
    compose, deployments, local_server, tmp_path
):
    """One pool exists beforehand (as a worker creates it), with Prefect's default template:
    the service keeps it and creates the missing one with the workers' template."""
    from prefect.workers.process import ProcessWorker

    api_url, env = local_server
    root = tmp_path / "image"
    (root / "docker").mkdir(parents=True)
    (root / "workspace").mkdir()
    for name in ("prefect.yaml", "process-pool.json"):
        text = (DOCKER / name).read_text(encoding="utf-8")
        (root / "docker" / name).write_text(render(text, root), encoding="utf-8")
    rendered = yaml.safe_load((root / "docker" / "prefect.yaml").read_text(encoding="utf-8"))
    entrypoints = {d["name"]: d["entrypoint"] for d in rendered["deployments"]}
    ours = json.loads((root / "docker" / "process-pool.json").read_text(encoding="utf-8"))
    prefects = ProcessWorker.get_default_base_job_template()
    assert prefects != ours
    existing = deployments["cpu"]["work_pool"]["name"]
    api(
        f"{api_url}/work_pools/",
        {"name": existing, "type": "process", "base_job_template": prefects},
    )

    output = run_deploy_service(compose, root, env)

    for name, spec in deployments.items():
        pool = api(f"{api_url}/work_pools/{spec['work_pool']['name']}")
        assert pool["type"] == "process"
        assert pool["base_job_template"] == (prefects if pool["name"] == existing else ours)
        registered = api(f"{api_url}/deployments/name/ppo-train/{name}")
        assert f"ppo-train/{name}" in output
        assert registered["entrypoint"] == entrypoints[name]
        assert Path(registered["entrypoint"].rpartition(":")[0]).is_file()
        assert registered["work_pool_name"] == spec["work_pool"]["name"]
        assert registered["pull_steps"] == [{SET_WORKDIR: {"directory": str(root / "workspace")}}]
        assert registered["parameters"] == spec["parameters"]
        assert set(registered["parameter_openapi_schema"]["properties"]) == set(spec["parameters"])
    listed = api(f"{api_url}/deployments/filter", {})
    assert sorted(d["name"] for d in listed) == sorted(deployments)
