"""docker/compose.yaml, checked without a Docker engine.

- it is valid under the Compose Specification's JSON schema (the copy check-jsonschema ships),
  raw and after interpolation with .env.example, and the check does reject broken files;
- the variable names it sets are the ones Prefect, MLflow and ppoflow read, and the URLs the
  workers get point at the services and ports the servers listen on;
- secrets come from .env only; ports bind to loopback by default; services start in order.
"""

from __future__ import annotations

import copy
import json
import re
from importlib import resources
from pathlib import Path
from urllib.parse import urlsplit

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCKER = REPO / "docker"
SERVICES = {
    "postgres",
    "prefect-server",
    "mlflow",
    "prefect-worker",
    "prefect-worker-gpu",
    "deploy",
}
# one-off services (`docker compose run --rm deploy`): no health check
ONE_OFF = {"deploy"}
WORKERS = ("prefect-worker", "prefect-worker-gpu")
SECRET_NAME = re.compile(r"PASSWORD|SECRET|TOKEN|ACCESS_KEY")
VARIABLE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(:?[-?+])?")
URL_PASSWORD = re.compile(r"://[^:/@\s]+:([^@]*)@")
WORKSPACE = "/workspace"


def option(command: list[str], flag: str) -> str:
    """The value after ``flag`` in a service's command list."""
    if flag not in command:
        raise AssertionError(f"{flag} missing from command {command}")
    return command[command.index(flag) + 1]


# --- schema -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def compose_validator():
    pytest.importorskip(
        "check_jsonschema",
        reason="check-jsonschema (it ships the Compose Specification schema) is not installed; "
        "the dev extra brings it",
    )
    import jsonschema

    schema_file = resources.files("check_jsonschema.builtin_schemas.vendor") / "compose-spec.json"
    schema = json.loads(schema_file.read_text(encoding="utf-8"))
    return jsonschema.validators.validator_for(schema)(schema)


def schema_errors(validator, document) -> list[str]:
    return [f"{list(e.absolute_path)}: {e.message[:200]}" for e in validator.iter_errors(document)]


def test_compose_file_is_valid_under_the_compose_specification(
    compose_validator, compose_raw, compose
):
    assert schema_errors(compose_validator, compose_raw) == []
    assert schema_errors(compose_validator, compose) == []


@pytest.mark.parametrize(
    ("service", "key", "value"),
    [
        ("mlflow", "helthcheck", {}),  # misspelt key
        ("prefect-worker", "depends_on", {"prefect-server": {"condition": "healthy"}}),
        ("postgres", "restart", ["always"]),
    ],
)
def test_schema_check_rejects_a_broken_compose_file(
    compose_validator, compose_raw, service, key, value
):
    broken = copy.deepcopy(compose_raw)
    broken["services"][service][key] = value
    assert schema_errors(compose_validator, broken) != []


# --- variables and secrets ----------------------------------------------------------------------


def test_interpolation_follows_the_specification(interpolator):
    env = {"SET": "v", "EMPTY": ""}
    assert interpolator("${SET:-d}|${EMPTY:-d}|${EMPTY-d}|${UNSET-d}", env) == "v|d||d"
    assert interpolator("${UNSET:-${ALSO_UNSET:-${SET}}}/$$SET/$SET", env) == "v/$SET/v"
    assert interpolator("${SET:+alt}|${EMPTY:+alt}|${EMPTY+alt}", env) == "alt||alt"
    with pytest.raises(ValueError, match="required variable UNSET is missing: set it"):
        interpolator("${UNSET:?set it}", env)


def test_every_variable_is_documented_in_env_example():
    text = (DOCKER / "compose.yaml").read_text(encoding="utf-8")
    example = (DOCKER / ".env.example").read_text(encoding="utf-8")
    documented = set(re.findall(r"^#?\s*([A-Z][A-Z0-9_]*)=", example, flags=re.MULTILINE))
    used = {name for name, _ in VARIABLE.findall(text)}
    assert used - documented == set(), "used in compose.yaml, missing from .env.example"
    required = {name for name, op in VARIABLE.findall(text) if op.endswith("?")}
    assert required == {"POSTGRES_PASSWORD", "PREFECT_DB_PASSWORD", "MLFLOW_DB_PASSWORD"}


@pytest.mark.parametrize(
    "secret", ["POSTGRES_PASSWORD", "PREFECT_DB_PASSWORD", "MLFLOW_DB_PASSWORD"]
)
def test_a_missing_secret_stops_compose_with_a_message(
    compose_raw, env_example, tree_interpolator, secret
):
    env = {k: v for k, v in env_example.items() if k != secret}
    with pytest.raises(ValueError, match=f"{secret} is missing: set {secret} in docker/.env"):
        tree_interpolator(compose_raw, env)


def test_secrets_come_only_from_the_env_file(compose_raw):
    for name, service in compose_raw["services"].items():
        for key, value in (service.get("environment") or {}).items():
            value = str(value)
            where = f"services.{name}.environment.{key} = {value!r}"
            if SECRET_NAME.search(key):
                # a bare reference, no default: ${NAME}, ${NAME:-} or ${NAME:?message}
                assert re.fullmatch(r"\$\{[A-Z_]+(:-|:\?[^}]*)?\}", value), where
            for password in URL_PASSWORD.findall(value):
                assert re.fullmatch(r"\$\{[A-Z_]+_PASSWORD:\?[^}]*\}", password), where


# --- services, ports, order ---------------------------------------------------------------------


def test_services_and_the_gpu_profile(compose):
    services = compose["services"]
    assert set(services) == SERVICES
    profiled = {n: s["profiles"] for n, s in services.items() if s.get("profiles")}
    assert profiled == {"prefect-worker-gpu": ["gpu"], "deploy": ["deploy"]}
    gpu = services["prefect-worker-gpu"]
    assert gpu["profiles"] == ["gpu"]
    (device,) = gpu["deploy"]["resources"]["reservations"]["devices"]
    assert device["driver"] == "nvidia" and device["capabilities"] == ["gpu"]
    assert gpu["build"]["dockerfile"] == "docker/Dockerfile.cuda"
    for name in ("prefect-server", "mlflow", "prefect-worker", "deploy"):
        assert services[name]["build"]["dockerfile"] == "docker/Dockerfile"


@pytest.mark.parametrize(("service", "default_port"), [("prefect-server", 4200), ("mlflow", 5000)])
def test_servers_listen_in_the_network_and_publish_on_loopback(compose, service, default_port):
    spec = compose["services"][service]
    command = spec["command"]
    assert option(command, "--host") == "0.0.0.0"  # reachable from the other containers
    (published,) = spec["ports"]
    host_ip, host_port, container_port = published.split(":")
    assert host_ip == "127.0.0.1"
    assert int(host_port) == default_port
    assert container_port == option(command, "--port")
    assert "ports" not in compose["services"]["postgres"]


def test_published_port_and_bind_address_are_configurable(compose_raw, tree_interpolator):
    env = {"BIND_ADDRESS": "0.0.0.0", "PREFECT_PORT": "14200", "MLFLOW_PORT": "15000"}
    env |= {"POSTGRES_PASSWORD": "p", "PREFECT_DB_PASSWORD": "p", "MLFLOW_DB_PASSWORD": "p"}
    services = tree_interpolator(compose_raw, env)["services"]
    assert services["prefect-server"]["ports"] == ["0.0.0.0:14200:4200"]
    assert services["mlflow"]["ports"] == ["0.0.0.0:15000:5000"]
    ui_api = services["prefect-server"]["environment"]["PREFECT_UI_API_URL"]
    assert ui_api == "http://127.0.0.1:14200/api"  # follows PREFECT_PORT unless set itself


def test_services_start_in_dependency_order_once_healthy(compose):
    services = compose["services"]
    for name, spec in services.items():
        if name not in ONE_OFF:
            assert spec["healthcheck"]["test"], f"{name} has no health check"
        for dependency, condition in (spec.get("depends_on") or {}).items():
            assert dependency in services and dependency != name
            assert condition == {"condition": "service_healthy"}, (name, dependency)
    order = []
    while len(order) < len(services):
        ready = sorted(
            n
            for n, s in services.items()
            if n not in order and set(s.get("depends_on") or {}) <= set(order)
        )
        assert ready, f"dependency cycle among {sorted(set(services) - set(order))}"
        order += ready
    long_running = [n for n in order if n not in ONE_OFF]
    assert long_running[0] == "postgres" and set(long_running[-2:]) == set(WORKERS)
    for worker in WORKERS:
        assert set(services[worker]["depends_on"]) == {"prefect-server", "mlflow"}


# --- what Prefect, MLflow and ppoflow read ------------------------------------------------------


@pytest.mark.parametrize("worker", WORKERS)
def test_workers_reach_the_servers_at_their_service_names_and_ports(compose, worker):
    services = compose["services"]
    env = services[worker]["environment"]
    prefect = urlsplit(env["PREFECT_API_URL"])
    assert (prefect.hostname, prefect.path) == ("prefect-server", "/api")
    assert str(prefect.port) == option(services["prefect-server"]["command"], "--port")
    mlflow = urlsplit(env["MLFLOW_TRACKING_URI"])
    assert mlflow.hostname == "mlflow"
    assert str(mlflow.port) == option(services["mlflow"]["command"], "--port")


def test_mlflow_accepts_the_host_header_the_workers_send(compose):
    from mlflow.server.security_utils import is_allowed_host_header

    allowed = compose["services"]["mlflow"]["environment"]["MLFLOW_SERVER_ALLOWED_HOSTS"]
    hosts = [h.strip() for h in allowed.split(",")]
    worker_host = urlsplit(
        compose["services"]["prefect-worker"]["environment"]["MLFLOW_TRACKING_URI"]
    )
    assert is_allowed_host_header(hosts, worker_host.netloc)
    assert is_allowed_host_header(hosts, "127.0.0.1:5000")  # the published port, from a browser
    assert not is_allowed_host_header(hosts, "attacker.example:5000")


def test_prefect_reads_the_variables_compose_sets(compose, monkeypatch):
    from prefect.settings import Settings

    services = compose["services"]
    env = services["prefect-server"]["environment"] | services["prefect-worker"]["environment"]
    names = [key for key in env if key.startswith("PREFECT_")]
    assert {"PREFECT_API_URL", "PREFECT_API_DATABASE_CONNECTION_URL"} <= set(names)
    for key in names:
        monkeypatch.setenv(key, env[key])
    settings = Settings().to_environment_variables(exclude_unset=True, include_secrets=True)
    assert settings["PREFECT_API_URL"] == "http://prefect-server:4200/api"
    for key in names:
        assert env[key] in settings.values(), f"Prefect does not read {key}"
    url = urlsplit(settings["PREFECT_SERVER_DATABASE_CONNECTION_URL"])
    assert (url.scheme, url.hostname, url.path) == ("postgresql+asyncpg", "postgres", "/prefect")


def test_mlflow_server_reads_the_variables_compose_sets(compose):
    import mlflow.environment_variables as mlflow_env
    from mlflow.cli import server

    read = {p.envvar for p in server.params if p.envvar}
    read |= {getattr(v, "name", None) for v in vars(mlflow_env).values()}
    env = compose["services"]["mlflow"]["environment"]
    names = {key for key in env if key.startswith("MLFLOW_")}
    assert {"MLFLOW_BACKEND_STORE_URI", "MLFLOW_ARTIFACTS_DESTINATION"} <= names
    assert names - read == set(), "MLflow reads none of these"
    store = urlsplit(env["MLFLOW_BACKEND_STORE_URI"])
    assert (store.scheme, store.hostname, store.path) == (
        "postgresql+psycopg2",
        "postgres",
        "/mlflow",
    )
    assert env["MLFLOW_ARTIFACTS_DESTINATION"].startswith("/artifacts/")
    assert "mlflow-artifacts:/artifacts" in compose["services"]["mlflow"]["volumes"]


def test_ppoflow_logs_to_the_tracking_uri_in_the_environment(tmp_path, monkeypatch):
    from flows.sinks.mlflow_logger import MLflowLogger

    uri = (tmp_path / "mlruns").as_uri()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    logger = MLflowLogger("deploy-check", "env-uri")
    try:
        assert logger.tracking_uri == uri
        assert logger.run_id is not None
    finally:
        logger.close("FINISHED")
    assert (tmp_path / "mlruns").is_dir()


def test_flow_runs_start_on_the_shared_workspace_volume(compose):
    """Relative run paths (ppoflow.artifact_dir `runs`, checkpoints) land on the volume: the
    worker's pool starts flow runs in /workspace, where the workspace volume is mounted."""
    from prefect.workers.process import ProcessWorker

    template = json.loads((DOCKER / "process-pool.json").read_text(encoding="utf-8"))
    default = ProcessWorker.get_default_base_job_template()
    assert template["variables"]["properties"]["working_dir"]["default"] == WORKSPACE
    default["variables"]["properties"]["working_dir"]["default"] = WORKSPACE
    assert template == default, "process-pool.json drifted from Prefect's process template"
    for worker in WORKERS:
        command = compose["services"][worker]["command"]
        assert option(command, "--base-job-template") == "/app/docker/process-pool.json"
        assert option(command, "--type") == "process"
        assert "--with-healthcheck" in command
        assert f"workspace:{WORKSPACE}" in compose["services"][worker]["volumes"]
    assert {"workspace", "postgres-data", "mlflow-artifacts"} <= set(compose["volumes"])


def test_relative_artifact_dir_resolves_in_the_working_directory(tmp_path, monkeypatch):
    from flows.runs.store import RunStore
    from stages.config import load_config

    artifact_dir = load_config(None).ppoflow.artifact_dir
    assert not Path(artifact_dir).is_absolute(), artifact_dir
    monkeypatch.chdir(tmp_path)
    store = RunStore(f"{artifact_dir}/run-1")
    assert Path(store.root) == tmp_path / artifact_dir / "run-1"


# --- Postgres and the images --------------------------------------------------------------------


def test_postgres_init_script_creates_what_the_servers_connect_to(compose):
    postgres = compose["services"]["postgres"]
    assert "./postgres-init:/docker-entrypoint-initdb.d:ro" in postgres["volumes"]
    assert "postgres-data:/var/lib/postgresql/data" in postgres["volumes"]
    assert {"PREFECT_DB_PASSWORD", "MLFLOW_DB_PASSWORD"} <= set(postgres["environment"])
    # healthy only after the init scripts: the image's temporary init server has no TCP socket
    check = postgres["healthcheck"]["test"]
    assert check[:2] == ["CMD", "pg_isready"] and option(check, "--host") == "127.0.0.1"
    script = DOCKER / "postgres-init" / "10-ppoflow-databases.sh"
    assert script.stat().st_mode & 0o111, f"{script} is not executable"
    sql = script.read_text(encoding="utf-8")
    assert "CREATE EXTENSION IF NOT EXISTS pg_trgm" in sql  # Prefect's migrations need it
    databases = dict(re.findall(r"CREATE DATABASE (\w+) OWNER (\w+);", sql))
    urls = [
        compose["services"]["prefect-server"]["environment"]["PREFECT_API_DATABASE_CONNECTION_URL"],
        compose["services"]["mlflow"]["environment"]["MLFLOW_BACKEND_STORE_URI"],
    ]
    for url in map(urlsplit, urls):
        assert databases.get(url.path.lstrip("/")) == url.username, url.geturl()


def test_built_services_name_existing_dockerfiles_and_stages(compose):
    for name, spec in compose["services"].items():
        if "build" not in spec:
            continue
        assert spec["build"]["context"] == ".."
        dockerfile = REPO / spec["build"]["dockerfile"]
        stages = re.findall(r"^FROM \S+ AS (\S+)$", dockerfile.read_text(), flags=re.MULTILINE)
        assert stages[-1] == spec["build"]["target"] == "runtime", name
